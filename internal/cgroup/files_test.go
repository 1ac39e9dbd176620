package cgroup

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestGroupFilesFreshAndClosed checks the control files a group keeps
// open: a read through the kept descriptor sees the group's current
// state (a process joining and leaving), a reused group keeps them, and
// removing the groups closes every one.
func TestGroupFilesFreshAndClosed(t *testing.T) {
	countFDs := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		return len(ents)
	}
	before := countFDs()
	m := requireManager(t)
	g, err := m.NewGroup(64 << 20)
	require.NoError(t, err)
	require.True(t, g.empty())
	require.Equal(t, 0, g.OOMKills())
	require.GreaterOrEqual(t, g.shmem(), int64(0))

	cmd := exec.Command("/bin/sleep", "60")
	require.NoError(t, cmd.Start())
	pfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	require.NoError(t, err)
	require.NoError(t, g.Add(pfd))
	require.False(t, g.empty(), "pids.current read through the kept descriptor must show the new task")
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	unix.Close(pfd)
	require.True(t, g.empty(), "and its exit")

	g.Release()
	g2, err := m.NewGroup(64 << 20)
	require.NoError(t, err)
	require.Equal(t, g.dirs, g2.dirs, "the released group is reused")
	require.Same(t, g.files, g2.files)
	require.True(t, g2.empty())
	g2.Release()
	require.NoError(t, m.Close())
	require.Equal(t, before, countFDs(), "closing the manager closes the groups' control files")
}
