package cgroup

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// heldIn returns the names of the files beneath dir that this process
// holds open.
func heldIn(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && strings.HasPrefix(target, dir+"/") {
			names = append(names, strings.TrimPrefix(target, dir+"/"))
		}
	}
	return names
}

// TestGroupHoldsItsFiles: a group opens the control files a job's way
// uses once, when it is made, and keeps them through reuse: moving a
// second process into the reused group and releasing it again opens
// none anew, writes through the held cgroup.procs (the process is found
// in the group), and reads through the held files (the release finds the
// group empty and keeps it). Removing the group, here by closing the
// Manager, closes them.
func TestGroupHoldsItsFiles(t *testing.T) {
	m := requireManager(t)
	closed := false
	defer func() {
		if !closed {
			m.Close()
		}
	}()
	g, err := m.NewGroup(32 << 20)
	require.NoError(t, err)
	dirs := g.Dirs()
	want := heldNames(m.Backend())
	count := func() int {
		n := 0
		for _, d := range dirs {
			n += len(heldIn(t, d))
		}
		return n
	}
	total := 0
	for i, d := range dirs {
		require.ElementsMatch(t, want[i], heldIn(t, d), "the group's files in %s are held", d)
		total += len(want[i])
	}
	for round := range 2 {
		cmd := exec.Command("/bin/sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		require.NoError(t, cmd.Start())
		pfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		require.NoError(t, err)
		require.NoError(t, g.Add(pfd))
		unix.Close(pfd)
		for _, d := range dirs {
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			require.NoError(t, err)
			require.Equal(t, []string{itoa(cmd.Process.Pid)}, strings.Fields(string(b)), "round %d", round)
		}
		require.Equal(t, total, count(), "no file opened anew while the group serves a process")
		cmd.Process.Kill()
		cmd.Wait()
		g.Release()
		g, err = m.NewGroup(32 << 20)
		require.NoError(t, err)
		require.Equal(t, dirs, g.Dirs(), "the released group is reused")
		require.Equal(t, total, count())
	}
	g.Release()
	require.NoError(t, m.Close())
	closed = true
	require.Zero(t, count(), "no file of a removed group stays open")
}

// TestGroupWritesItsLimitThroughHeldFiles: the memory limit's control
// files (v1 memory.limit_in_bytes and, where swap is accounted,
// memory.memsw.limit_in_bytes; v2 memory.max) are among the files a group
// holds, and a new limit written through them reaches the kernel.
func TestGroupWritesItsLimitThroughHeldFiles(t *testing.T) {
	m := requireManager(t)
	defer m.Close()
	g, err := m.NewGroup(32 << 20)
	require.NoError(t, err)
	defer g.Release()
	memDir := g.Dirs()[len(g.Dirs())-1]
	limit := "memory.max"
	if m.Backend() != V2 {
		limit = "memory.limit_in_bytes"
	}
	held := heldIn(t, memDir)
	require.Contains(t, held, limit, "the memory limit's file is held")
	if _, err := os.Stat(filepath.Join(memDir, "memory.memsw.limit_in_bytes")); err == nil && m.Backend() != V2 {
		require.Contains(t, held, "memory.memsw.limit_in_bytes", "the swap limit's file is held")
	}
	for _, n := range []int64{48 << 20, 16 << 20} {
		require.NoError(t, g.SetMemory(n))
		b, err := os.ReadFile(filepath.Join(memDir, limit))
		require.NoError(t, err)
		require.Equal(t, itoa(int(n)), strings.TrimSpace(string(b)))
	}
}
