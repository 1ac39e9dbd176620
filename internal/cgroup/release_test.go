package cgroup

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestReleaseRacesReuse: a group released on one goroutine and taken
// again by NewGroup on another is released again by its next holder. Only
// the manager's mutex orders the two goroutines. Release used to run under
// a sync.Once that NewGroup reset for the next holder while the first
// release was still finishing it: the race detector reports that, and the
// first release's late "done" could make the next holder's Release a
// no-op, so the group was never given back and Manager.Close waited 35 s
// for it and then left it in place.
func TestReleaseRacesReuse(t *testing.T) {
	m := requireManager(t)
	g, err := m.NewGroup(32 << 20)
	require.NoError(t, err)
	for i := 0; i < 200; i++ {
		go g.Release()
		for deadline := time.Now().Add(10 * time.Second); ; {
			m.mu.Lock()
			n := len(m.free)
			m.mu.Unlock()
			if n > 0 {
				break
			}
			require.True(t, time.Now().Before(deadline), "round %d: Release never gave the empty group back", i)
			time.Sleep(10 * time.Microsecond)
		}
		g2, err := m.NewGroup(32 << 20)
		require.NoError(t, err)
		require.Same(t, g, g2, "the released group is reused")
	}
	g.Release()
	m.mu.Lock()
	n := len(m.free)
	m.mu.Unlock()
	require.Equal(t, 1, n, "the last holder's Release gave the group back")
	require.NoError(t, m.Close())
}

// staleChildEnv makes the test binary act as the pool of another PID
// namespace in TestStaleAcrossPIDNamespaces.
const staleChildEnv = "PYNOX_CGROUP_STALE_CHILD"

// TestStaleAcrossPIDNamespaces: a pool started in a PID namespace of its
// own (as PID 1 of a container, beside pools of the host in the same
// cgroup) leaves the host pool's directories alone. It used to take the
// host pool's pid, which does not exist in its namespace, for a dead
// pool's, and removed the empty job cgroup the host pool kept for reuse,
// and then the pool's own directory: the host pool's next jobs failed
// closed ("cgroup.procs: no such file or directory").
func TestStaleAcrossPIDNamespaces(t *testing.T) {
	if os.Getenv(staleChildEnv) == "1" {
		// The other namespace's pool: starting is what removes stale
		// directories.
		m, err := NewManager(Require, 8)
		require.NoError(t, err)
		require.NoError(t, m.Close())
		return
	}
	m := requireManager(t)
	defer m.Close()
	g, err := m.NewGroup(32 << 20)
	require.NoError(t, err)
	g.Release() // empty: kept for reuse
	cmd := exec.Command(os.Args[0], "-test.run=^TestStaleAcrossPIDNamespaces$", "-test.count=1")
	cmd.Env = append(os.Environ(), staleChildEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil && strings.Contains(err.Error(), "operation not permitted") {
		t.Skipf("cannot make a PID namespace: %v", err)
	}
	require.NoError(t, err, "%s", out)
	for _, d := range g.Dirs() {
		_, err := os.Stat(d)
		require.NoError(t, err, "the pool of another PID namespace removed a live pool's job cgroup")
	}
	g2, err := m.NewGroup(32 << 20)
	require.NoError(t, err)
	require.Same(t, g, g2)
	sleeper := exec.Command("/bin/sleep", "60")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, sleeper.Start())
	pfd, err := unix.PidfdOpen(sleeper.Process.Pid, 0)
	require.NoError(t, err)
	defer unix.Close(pfd)
	err = g2.Add(pfd)
	sleeper.Process.Kill()
	sleeper.Wait()
	require.NoError(t, err, "the reused group takes a process")
	g2.Release()
}
