package worker

import "github.com/pynox/pynox/internal/cgroup"

// releaseWhenReaped keeps g, the cgroup of the closed child c, to be
// released once the template reports c's exit (releaseReaped) or dies
// (fail), and reports false when either happened already: the caller
// then releases it at once. A goroutine per job used to wait for the
// report instead; it was one of the goroutines each job started, and it
// grew its stack on every job as it read the group's files (issue 12).
func (t *Template) releaseWhenReaped(c *Child, g *cgroup.Group) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dead || isClosed(c.reaped) {
		return false
	}
	if t.toRelease == nil {
		t.toRelease = map[*Child]*cgroup.Group{}
	}
	t.toRelease[c] = g
	return true
}

// releaseReaped releases the cgroup kept for c, if any: c's exit has been
// reported (c.reaped is closed), so the group holds no task of it.
func (t *Template) releaseReaped(c *Child) {
	t.mu.Lock()
	g := t.toRelease[c]
	delete(t.toRelease, c)
	t.mu.Unlock()
	if g != nil {
		g.Release()
	}
}
