package cgroup

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestReadValue parses the control files the pool reads per job: a bare
// number, and the "key value" line of a flat keyed file, where a key
// that only begins another's name does not match.
func TestReadValue(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(s), 0o600))
		return p
	}
	n, ok, err := readValue(write("current", "17\n"), "")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(17), n)
	stat := write("stat", "shmem_thp 9\nshmem 4096\nmapped_file 0\n")
	n, ok, err = readValue(stat, "shmem")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(4096), n)
	_, ok, err = readValue(stat, "oom_kill")
	require.NoError(t, err)
	require.False(t, ok)
	// A file longer than the stack buffer is read whole.
	long := make([]byte, 0, 8192)
	for len(long) < 6000 {
		long = append(long, "filler 1\n"...)
	}
	n, ok, err = readValue(write("long", string(long)+"oom_kill 3\n"), "oom_kill")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(3), n)
	_, _, err = readValue(filepath.Join(dir, "missing"), "")
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestGroupReadsAllocateLittle: the reads a group makes for every job
// (its task count, shmem, charge and OOM count) allocate no read buffer:
// at most the joined path and its NUL-terminated copy for open(2).
func TestGroupReadsAllocateLittle(t *testing.T) {
	m := requireManager(t)
	defer m.Close()
	g, err := m.NewGroup(64 << 20)
	require.NoError(t, err)
	defer g.Release()
	for name, f := range map[string]func(){
		"empty":     func() { g.empty() },
		"shmem":     func() { g.shmem() },
		"reclaimed": func() { g.reclaimed() },
		"OOMKills":  func() { g.OOMKills() },
	} {
		allocs := testing.AllocsPerRun(20, f)
		require.LessOrEqual(t, allocs, 2.0, "%s allocates %v times per call", name, allocs)
	}
}

// TestGroupFilesBeneathBase: a group's per-job files are opened relative
// to the Manager's descriptors of its bases: a process moved in shows in
// the group's counts; once the Manager let go of those descriptors the
// absolute paths serve; and an error names the file by its whole path.
func TestGroupFilesBeneathBase(t *testing.T) {
	m := requireManager(t)
	defer m.Close()
	g, err := m.NewGroup(64 << 20)
	require.NoError(t, err)
	require.True(t, g.empty())
	cmd := exec.Command("/bin/sleep", "60")
	require.NoError(t, cmd.Start())
	pfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	require.NoError(t, err)
	require.NoError(t, g.Add(pfd))
	require.False(t, g.empty(), "pids.current read beneath the base shows the task")
	for _, d := range g.Dirs() {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		require.NoError(t, err)
		require.Equal(t, strconv.Itoa(cmd.Process.Pid), strings.TrimSpace(string(b)))
	}
	cmd.Process.Kill()
	cmd.Wait()
	unix.Close(pfd)
	require.True(t, g.empty())

	_, _, err = g.readValue(0, "no-such-file", "")
	require.ErrorContains(t, err, filepath.Join(g.Dirs()[0], "no-such-file"))

	// Without the bases' descriptors (as after Close gave up waiting).
	locks := m.locks
	m.locksMu.Lock()
	m.locks = nil
	m.locksMu.Unlock()
	require.True(t, g.empty())
	require.GreaterOrEqual(t, g.shmem(), int64(0))
	m.locksMu.Lock()
	m.locks = locks
	m.locksMu.Unlock()
	g.Release()
}
