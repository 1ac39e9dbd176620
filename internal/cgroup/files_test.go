package cgroup

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestGroupReadsFreshAndLeakNothing checks the control-file reads of a
// group's life: they see its current state (a process joining and
// leaving), and leave no descriptor behind.
func TestGroupReadsFreshAndLeakNothing(t *testing.T) {
	countFDs := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		return len(ents)
	}
	m := requireManager(t)
	defer m.Close()
	g, err := m.NewGroup(64 << 20)
	require.NoError(t, err)
	before := countFDs()
	require.True(t, g.empty())
	require.Equal(t, 0, g.OOMKills())
	require.GreaterOrEqual(t, g.shmem(), int64(0))

	cmd := exec.Command("/bin/sleep", "60")
	require.NoError(t, cmd.Start())
	pfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	require.NoError(t, err)
	require.NoError(t, g.Add(pfd))
	require.False(t, g.empty(), "pids.current must show the new task")
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	unix.Close(pfd)
	require.True(t, g.empty(), "and its exit")
	require.True(t, g.reclaimed())
	require.Equal(t, before, countFDs(), "no control file is left open")
	g.Release()
}

// TestReadFileErrors checks that a control file that cannot be read is
// an error that names it.
func TestReadFileErrors(t *testing.T) {
	_, err := readFile("/nonexistent/pids.current")
	require.ErrorContains(t, err, "/nonexistent/pids.current")
	require.ErrorIs(t, err, os.ErrNotExist)
	b, err := readFile("/proc/self/stat")
	require.NoError(t, err)
	require.NotEmpty(t, b)
}
