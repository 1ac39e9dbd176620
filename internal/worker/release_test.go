package worker

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/cgroup"
)

// TestGroupReleasedWithoutGoroutine: a closed child's cgroup is kept by
// its template until the child's exit is reported, then released (and
// reused by the next group asked for); a group kept for a child whose
// exit the template never reports is released when the template dies,
// so that the Manager's Close does not wait for it.
func TestGroupReleasedWithoutGoroutine(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root here")
	}
	m, err := cgroup.NewManager(cgroup.Require, 0)
	if err != nil {
		t.Skipf("no per-job cgroups on this machine: %v", err)
	}
	tpl := startTestTemplate(t, false)

	// A child of the template's own, released when its exit is reported.
	g, err := m.NewGroup(64 << 20)
	require.NoError(t, err)
	dirs := g.Dirs()
	c := &Child{tpl: tpl, exitCh: make(chan ExitStatus, 1), reaped: make(chan struct{})}
	require.True(t, tpl.releaseWhenReaped(c, g), "kept until the exit is reported")
	c.exited(ExitStatus{})
	tpl.mu.Lock()
	require.Empty(t, tpl.toRelease)
	tpl.mu.Unlock()
	g2, err := m.NewGroup(64 << 20)
	require.NoError(t, err)
	require.Equal(t, dirs, g2.Dirs(), "the released group is reused")
	require.False(t, tpl.releaseWhenReaped(c, g2), "a child reaped already: released at once by the caller")
	g2.Release()

	// One whose exit never comes: the template's death releases it.
	g3, err := m.NewGroup(64 << 20)
	require.NoError(t, err)
	lost := &Child{tpl: tpl, exitCh: make(chan ExitStatus, 1), reaped: make(chan struct{})}
	require.True(t, tpl.releaseWhenReaped(lost, g3))
	require.NoError(t, tpl.Close())
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the Manager's Close waits for a group the dead template kept")
	}
}
