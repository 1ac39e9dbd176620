package main

// Review 25: an outside review of the pool's own scratch tmpfs
// (scratchRoot.mountOwn, commit 8caaa43), through the real binary.

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// review25ScratchMounts lists the mount points beneath parent in
// /proc/self/mountinfo.
func review25ScratchMounts(t *testing.T, parent string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], parent+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// TestReview25KilledPoolScratchMountSwept: `pynox pool` with
// confine_self = false, as root with memory cgroups, mounts a tmpfs of its
// own on its scratch directory in a tmpfs parent; killed with SIGKILL it
// leaves the mount, and the next pool started on the same parent
// unmounts it and removes the directory, and closes its own without
// leaving a mount. A pool that confines itself (the binary's default)
// mounts none: its Landlock domain would refuse the unmount at Close
// (review 25 found it left its tmpfs mounted until the next pool's
// sweep).
func TestReview25KilledPoolScratchMountSwept(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the pool mounts its own scratch tmpfs only as root")
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
		if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil {
			t.Skip("no memory cgroups: the pool keeps the shared tmpfs")
		}
	}
	pynoxBinary(t) // skips without Landlock
	parent := t.TempDir()
	require.NoError(t, unix.Mount("pynox-review25", parent, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64m,mode=1777"))
	t.Cleanup(func() { unix.Unmount(parent, unix.MNT_DETACH) })
	dir := t.TempDir()
	cfg := filepath.Join(dir, "pool.toml")
	require.NoError(t, os.WriteFile(cfg, []byte("[pool]\nworkers = 1\nconfine_self = false\nscratch_dir = "+strconv.Quote(parent)+"\n"), 0o644))

	p := startPoolIn(t, dir, "--config="+cfg)
	p.send(t, `{"id": 1, "code": "import os; open(os.path.join(os.environ['TMPDIR'], 'x'), 'w').write('x'); print(os.statvfs(os.environ['TMPDIR']).f_files)"}`)
	r := p.next(t)
	require.Equal(t, "0\n", r["stdout"], "the job's TMPDIR is not on the pool's own tmpfs: %v; stderr: %s", r, p.stderr.String())
	first := review25ScratchMounts(t, parent)
	require.Len(t, first, 1, "the pool mounts one tmpfs on its scratch directory")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	_ = p.cmd.Wait()
	require.Equal(t, first, review25ScratchMounts(t, parent), "a killed pool leaves its mount (for the next pool to sweep)")

	q := startPoolIn(t, dir, "--config="+cfg)
	require.NotContains(t, review25ScratchMounts(t, parent), first[0], "the next pool left a killed pool's scratch tmpfs mounted")
	require.NoDirExists(t, first[0], "the next pool left a killed pool's scratch directory")
	second := review25ScratchMounts(t, parent)
	require.Len(t, second, 1, "the next pool mounts its own")
	require.NoError(t, q.stdin.Close())
	require.NoError(t, q.cmd.Wait(), "stderr: %s", q.stderr.String())
	require.Empty(t, review25ScratchMounts(t, parent), "a pool that closed left its scratch tmpfs mounted; stderr: %s", q.stderr.String())
	ents, err := os.ReadDir(parent)
	require.NoError(t, err)
	require.Empty(t, ents, "a pool that closed left its scratch directory")

	// Self-confined (the binary's default): its Landlock domain refuses
	// the unmount at close, so its mounter (outside the domain) unmounts
	// the tmpfs when the pool goes; nothing is left after a clean close,
	// and after SIGKILL the next pool's sweep unmounts and removes it. (Review 25 found each closed self-confined
	// pool's tmpfs left mounted until the next pool's sweep.)
	self := filepath.Join(dir, "self.toml")
	require.NoError(t, os.WriteFile(self, []byte("[pool]\nworkers = 1\nscratch_dir = "+strconv.Quote(parent)+"\n"), 0o644))
	s := startPoolIn(t, dir, "--config="+self)
	s.send(t, `{"id": 1, "code": "import os; open(os.path.join(os.environ['TMPDIR'], 'x'), 'w').write('x'); print(os.statvfs(os.environ['TMPDIR']).f_files)"}`)
	r = s.next(t)
	require.Equal(t, "0\n", r["stdout"], "a self-confined pool's job scratch is not on its own tmpfs: %v; stderr: %s", r, s.stderr.String())
	require.Len(t, review25ScratchMounts(t, parent), 1)
	require.NoError(t, s.stdin.Close())
	require.NoError(t, s.cmd.Wait(), "stderr: %s", s.stderr.String())
	require.Empty(t, review25ScratchMounts(t, parent), "a self-confined pool left its scratch tmpfs mounted")
	ents, err = os.ReadDir(parent)
	require.NoError(t, err)
	require.Empty(t, ents, "a self-confined pool that closed left its scratch directory")

	k := startPoolIn(t, dir, "--config="+self)
	k.send(t, `{"id": 1, "code": "print(1)"}`)
	k.next(t)
	require.Len(t, review25ScratchMounts(t, parent), 1)
	require.NoError(t, k.cmd.Process.Signal(syscall.SIGKILL))
	_ = k.cmd.Wait()
	// Its mounter dies with it (a parent-death signal): the mount stays
	// for the next pool's sweep, which runs before that pool confines
	// itself.
	again := startPoolIn(t, dir, "--config="+self)
	require.Len(t, review25ScratchMounts(t, parent), 1, "the next pool left a killed one's scratch tmpfs mounted, or made none")
	require.NoError(t, again.stdin.Close())
	require.NoError(t, again.cmd.Wait(), "stderr: %s", again.stderr.String())
	require.Empty(t, review25ScratchMounts(t, parent))
	ents, err = os.ReadDir(parent)
	require.NoError(t, err)
	require.Empty(t, ents, "a killed self-confined pool's scratch directory was not swept")
}
