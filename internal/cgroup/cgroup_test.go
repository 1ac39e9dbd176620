package cgroup

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pynox/pynox/internal/pidfd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestProbeParse(t *testing.T) {
	tmp := t.TempDir()
	for _, d := range []string{"pids", "memory/process_api/x", "unified/svc"} {
		require.NoError(t, os.MkdirAll(filepath.Join(tmp, d), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(tmp, "unified/svc/cgroup.controllers"), []byte("cpu io\n"), 0o644))
	mi := strings.Join([]string{
		"31 23 0:28 / " + tmp + " rw,relatime - tmpfs tmpfs rw,mode=755",
		"35 31 0:32 / " + tmp + "/memory rw,relatime - cgroup cgroup rw,memory",
		"39 31 0:36 / " + tmp + "/pids rw,relatime shared:5 - cgroup cgroup rw,pids",
		"41 31 0:38 /x " + tmp + "/unified rw,relatime - cgroup2 cgroup2 rw",
	}, "\n")
	self := "8:pids:/\n4:memory:/process_api/x\n0::/x/svc\n"
	l := probe([]byte(self), []byte(mi))
	require.Equal(t, V1, l.Backend, l.Reason)
	require.Equal(t, filepath.Join(tmp, "pids"), l.Pids)
	require.Equal(t, filepath.Join(tmp, "memory/process_api/x"), l.Memory)
	require.Contains(t, l.Reason, "not delegated")
	require.Equal(t, []string{l.Pids, l.Memory}, l.Dirs())

	// Delegated v2 wins.
	require.NoError(t, os.WriteFile(filepath.Join(tmp, "unified/svc/cgroup.controllers"), []byte("cpu memory pids\n"), 0o644))
	l = probe([]byte(self), []byte(mi))
	require.Equal(t, Layout{Backend: V2, Unified: filepath.Join(tmp, "unified/svc")}, l)

	// A path outside the mount's root is not reachable.
	l = probe([]byte("0::/elsewhere\n"), []byte(mi))
	require.Equal(t, None, l.Backend)
	require.Contains(t, l.Reason, "not mounted")

	require.Equal(t, "/a b", unescape(`/a\040b`))
	pid, ok := stalePid("pynox-123-abc")
	require.True(t, ok)
	require.Equal(t, 123, pid)
	_, ok = stalePid("other-123-abc")
	require.False(t, ok)
}

func TestNewManagerMode(t *testing.T) {
	_, err := NewManager("sometimes", 0)
	require.ErrorContains(t, err, `cgroups must be "auto", "require" or "off", got "sometimes"`)
	m, err := NewManager(Off, 0)
	require.NoError(t, err)
	require.Equal(t, None, m.Backend())
	g, err := m.NewGroup(1 << 20)
	require.NoError(t, err)
	require.Nil(t, g)
	require.NoError(t, m.Close())
}

// requireManager returns a real manager or skips.
func requireManager(t *testing.T) *Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root here")
	}
	m, err := NewManager(Require, 8)
	if err != nil {
		t.Skipf("no per-job cgroups on this machine: %v", err)
	}
	return m
}

// TestGroupLifecycle moves a real process into a group, checks the limits
// and its membership, and that everything is removed.
func TestGroupLifecycle(t *testing.T) {
	m := requireManager(t)
	bases := m.WritableDirs()
	g, err := m.NewGroup(64 << 20)
	require.NoError(t, err)
	cmd := exec.Command("/bin/sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	pfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	require.NoError(t, err)
	defer unix.Close(pfd)
	pid, err := pidfd.Pid(pfd)
	require.NoError(t, err)
	require.Equal(t, cmd.Process.Pid, pid)
	require.NoError(t, g.Add(pfd))
	for _, d := range g.Dirs() {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		require.NoError(t, err)
		require.Equal(t, strings.Fields(string(b)), []string{itoa(pid)})
	}
	b, err := os.ReadFile(filepath.Join(g.Dirs()[0], "pids.max"))
	require.NoError(t, err)
	require.Equal(t, "8", strings.TrimSpace(string(b)))
	require.NoError(t, g.SetMemory(32<<20))
	require.Equal(t, int64(32<<20), g.Memory())
	require.Zero(t, g.OOMKills())

	g.Release() // busy: retried in the background
	cmd.Process.Kill()
	cmd.Wait()
	_, err = pidfd.Pid(pfd)
	require.Error(t, err, "a reaped process has no pid")
	require.NoError(t, m.Close())
	for _, d := range append(g.Dirs(), bases...) {
		_, err := os.Stat(d)
		require.True(t, os.IsNotExist(err), "%s is left", d)
	}
	_, err = m.NewGroup(1 << 20)
	require.ErrorIs(t, err, ErrClosed)
}

// TestGroupReuse: a released group that its process left clean serves the
// next process, with its OOM count taken afresh; one holding tmpfs pages
// is removed instead.
func TestGroupReuse(t *testing.T) {
	m := requireManager(t)
	defer m.Close()
	runIn := func(g *Group, script string) {
		cmd := exec.Command("/bin/sh", "-c", "read x; "+script)
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		pfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		require.NoError(t, err)
		defer unix.Close(pfd)
		require.NoError(t, g.Add(pfd))
		stdin.Write([]byte("go\n"))
		stdin.Close()
		cmd.Wait()
	}
	g, err := m.NewGroup(32 << 20)
	require.NoError(t, err)
	dirs := g.Dirs()
	runIn(g, "true")
	g.Release()
	g2, err := m.NewGroup(48 << 20)
	require.NoError(t, err)
	require.Equal(t, dirs, g2.Dirs(), "a clean group is reused")
	require.Equal(t, int64(48<<20), g2.Memory())
	require.False(t, g2.OOMKilled())

	shm, err := os.MkdirTemp("/dev/shm", "pynox-cgroup-test-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	defer os.RemoveAll(shm)
	runIn(g2, "head -c 1048576 /dev/zero > "+shm+"/f")
	g2.Release()
	for _, d := range dirs {
		_, err := os.Stat(d)
		require.True(t, os.IsNotExist(err), "a group holding tmpfs pages is removed: %s", d)
	}
	g3, err := m.NewGroup(32 << 20)
	require.NoError(t, err)
	require.NotEqual(t, dirs, g3.Dirs())
	g3.Release()
}

// TestRemoveStale removes what a dead pool left, and nothing else. A
// directory named for a dead pid but locked is the case of a pool that
// runs in another PID namespace (as PID 1 of its own, say): its pid
// names no live process here, yet its directories are in use and must
// stay. Liveness is the flock, not the pid.
func TestRemoveStale(t *testing.T) {
	m := requireManager(t)
	defer m.Close()
	cmd := exec.Command("/bin/true")
	require.NoError(t, cmd.Run())
	dead := cmd.Process.Pid
	for _, own := range m.WritableDirs() {
		parent := filepath.Dir(own)
		stale := filepath.Join(parent, "pynox-"+itoa(dead)+"-test")
		require.NoError(t, os.Mkdir(stale, 0o700))
		require.NoError(t, os.Mkdir(filepath.Join(stale, "j1"), 0o700))
		live := filepath.Join(parent, "pynox-"+itoa(dead)+"-live")
		require.NoError(t, os.Mkdir(live, 0o700))
		fd, err := lockDir(live)
		require.NoError(t, err)
		removeStale(parent)
		_, err = os.Stat(stale)
		require.True(t, os.IsNotExist(err), "stale %s is left", stale)
		_, err = os.Stat(own)
		require.NoError(t, err, "a live pool's directory was removed")
		_, err = os.Stat(live)
		require.NoError(t, err, "a locked (live) pool's directory was removed")
		unix.Close(fd)
		removeStale(parent)
		_, err = os.Stat(live)
		require.True(t, os.IsNotExist(err), "an unlocked directory of a dead pid is left: %s", live)
	}
}

// TestGroupCost logs what a spare's cgroup costs the pool: create a new
// one or reuse a released one, move a process in, release it; in wall
// time and in the CPU time of the calling thread. It asserts nothing
// about time.
func TestGroupCost(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	m := requireManager(t)
	defer m.Close()
	const n = 50
	threadCPU := func() time.Duration {
		var ru unix.Rusage
		unix.Getrusage(unix.RUSAGE_THREAD, &ru)
		return time.Duration(unix.TimevalToNsec(ru.Utime) + unix.TimevalToNsec(ru.Stime))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	measure := func(f func()) (wall, cpu time.Duration) {
		c0, w0 := threadCPU(), time.Now()
		f()
		return time.Since(w0), threadCPU() - c0
	}
	// New groups: none is released until all are made.
	var cw, cc time.Duration
	groups := make([]*Group, n)
	for i := range groups {
		w, c := measure(func() {
			var err error
			groups[i], err = m.NewGroup(64 << 20)
			require.NoError(t, err)
		})
		cw, cc = cw+w, cc+c
	}
	for _, g := range groups {
		g.Release()
	}
	var wall, cpu [3]time.Duration
	for range n {
		cmd := exec.Command("/bin/sleep", "60")
		require.NoError(t, cmd.Start())
		pfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		require.NoError(t, err)
		var g *Group
		steps := []func(){
			func() { g, err = m.NewGroup(64 << 20); require.NoError(t, err) },
			func() { require.NoError(t, g.Add(pfd)) },
			func() { g.Release() },
		}
		for i, f := range steps {
			if i == 2 {
				cmd.Process.Kill()
				cmd.Wait()
				unix.Close(pfd)
			}
			w, c := measure(f)
			wall[i] += w
			cpu[i] += c
		}
	}
	t.Logf("%s, mean of %d: create %v (CPU %v); reuse %v (CPU %v), move %v (CPU %v), release %v (CPU %v)", m.Backend(), n,
		cw/n, cc/n, wall[0]/n, cpu[0]/n, wall[1]/n, cpu[1]/n, wall[2]/n, cpu[2]/n)
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestGroupReleaseRacesReuse: a group that Release puts back on the free
// list may be handed out by NewGroup while Release is still returning.
// NewGroup used to reset the sync.Once that Release was inside, which the
// race detector reports (found by jsonl's client tests under -race).
func TestGroupReleaseRacesReuse(t *testing.T) {
	m := requireManager(t)
	defer m.Close()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				g, err := m.NewGroup(32 << 20)
				if !assert.NoError(t, err) {
					return
				}
				g.Release()
			}
		}()
	}
	wg.Wait()
}
