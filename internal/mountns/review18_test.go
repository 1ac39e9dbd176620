package mountns

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// Review 18: an outside reviewer's probes against inline stock builds
// (INLINE in builder.py: the mounter builds each stock namespace itself,
// pivoting into a copy of its seed namespace and cloning a CLONE_VM
// holder in a new user and mount namespace, then setns back).

// r18PidsCgroup puts the mounter alone in a new cgroup v1 pids group
// whose pids.max is its current count (so it can neither fork nor
// clone); the returned function lifts the limit (the mounter stays in
// the group, at "max"). Skips where there is no pids hierarchy.
func r18PidsCgroup(t *testing.T, m *Mounter) (lift func()) {
	t.Helper()
	const top = "/sys/fs/cgroup/pids"
	if _, err := os.Stat(filepath.Join(top, "cgroup.procs")); err != nil {
		t.Skip("no cgroup v1 pids hierarchy at " + top)
	}
	dir := filepath.Join(top, fmt.Sprintf("review18-%d-%d", os.Getpid(), rand.Uint32()))
	require.NoError(t, os.Mkdir(dir, 0o755))
	pid := strconv.Itoa(m.cmd.Process.Pid)
	t.Cleanup(func() {
		// Back to the top group (if it still lives), then away with ours.
		_ = os.WriteFile(filepath.Join(top, "cgroup.procs"), []byte(pid), 0)
		for range 100 {
			if os.Remove(dir) == nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(pid), 0))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pids.max"), []byte("1"), 0))
	return func() {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "pids.max"), []byte("max"), 0))
	}
}

// r18Home checks that the mounter serves from its own mount namespace
// (the test's), with "/" as its root and working directory.
func r18Home(t *testing.T, m *Mounter, when string) {
	t.Helper()
	pid := strconv.Itoa(m.cmd.Process.Pid)
	self, err := os.Readlink("/proc/self/ns/mnt")
	require.NoError(t, err)
	its, err := os.Readlink("/proc/" + pid + "/ns/mnt")
	require.NoError(t, err)
	require.Equal(t, self, its, "%s: the mounter serves from another mount namespace", when)
	for _, l := range []string{"root", "cwd"} {
		got, err := os.Readlink("/proc/" + pid + "/" + l)
		require.NoError(t, err)
		require.Equal(t, "/", got, "%s: the mounter's %s", when, l)
	}
}

// A stock build that cannot fork or clone (the mounter's pids cgroup is
// full: a job's threads can fill the pool's) fails closed, and the
// mounter comes back from it whole once the limit lifts: every
// request meanwhile gets an error or a proper namespace, the mounter
// serves from its own namespace (a failed clone comes after its pivot
// into a build's copy of the seed), and no namespace slot of a
// self-confined pool's shared root is lost to the failures (each stayed
// "busy" for good when a builder child could not be forked, until no
// slot was left and every mount job of the pool failed). Inline: the
// clone's failure turned inline builds off for good (and so led to the
// fork path, and its lost slots); they resume now. Forked (inline
// builds turned off first): the fork's failure lost the slot.
func TestReview18ForkFailureKeepsSlots(t *testing.T) {
	testenv.Slow(t)
	for _, forked := range []bool{false, true} {
		t.Run(map[bool]string{false: "inline", true: "forked"}[forked], func(t *testing.T) {
			const slots = 4
			m, _ := slottedMounter(t, 2, slots)
			settle(t, m, 1+2)
			if _, _, on, seed := mounterBuilds(t, m, forked); !seed || (!forked && !on) {
				t.Skip("no inline builds here (no seed namespace or no clone)")
			}
			settle(t, m, 1+2)
			src := openPath(t, dataDir(t, "A"))
			lift := r18PidsCgroup(t, m)
			var failed []string
			for i := range 2 * slots {
				ns, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
				if err != nil {
					failed = append(failed, err.Error())
					require.NotContains(t, err.Error(), "no free namespace slot",
						"attempt %d: the failed builds under the pids limit took every slot for good", i)
					continue
				}
				got := look(t, ns, "/data/f.txt")
				ns.Close()
				require.Equal(t, "A", got["read /data/f.txt"], "attempt %d", i)
			}
			require.NotEmpty(t, failed, "no build failed under pids.max = 1")
			r18Home(t, m, "after clone or fork failures")
			lift()
			for i := range 2 * slots {
				ns, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
				require.NoError(t, err, "build %d after the limit lifted (failures before: %q)", i, failed)
				got := look(t, ns, "/data/f.txt")
				ns.Close()
				require.Equal(t, "A", got["read /data/f.txt"], "build %d", i)
				require.ElementsMatch(t, []any{"/", "/usr", "/proc", "/data"}, got["mounts"], "build %d", i)
			}
			settle(t, m, 1+2)
			r18Home(t, m, "after the limit lifted")
			inline0, _, on, _ := mounterBuilds(t, m, false)
			require.Equal(t, !forked, on, "a clone that failed for want of pids turned inline builds off for good")
			if !forked {
				ns, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
				require.NoError(t, err)
				ns.Close()
				// Its stock is refilled inline (a wait for background
				// work, as settle's).
				inline1 := inline0
				for range 400 {
					if inline1, _, _, _ = mounterBuilds(t, m, false); inline1 > inline0 {
						break
					}
					time.Sleep(25 * time.Millisecond)
				}
				require.Greater(t, inline1, inline0, "the stock is built inline again")
			}
		})
	}
}

// r18Holder returns the pid of a live holder of the mounter's (a child
// in a user namespace other than the mounter's), or 0.
func r18Holder(t *testing.T, m *Mounter) int {
	t.Helper()
	pid := strconv.Itoa(m.cmd.Process.Pid)
	own, err := os.Readlink("/proc/" + pid + "/ns/user")
	require.NoError(t, err)
	kids, _ := os.ReadFile("/proc/" + pid + "/task/" + pid + "/children")
	for _, k := range strings.Fields(string(kids)) {
		if u, err := os.Readlink("/proc/" + k + "/ns/user"); err == nil && u != own {
			n, _ := strconv.Atoi(k)
			return n
		}
	}
	return 0
}

// r18Sleeping says whether the holder pid sleeps with no SIGKILL pending
// (the mounter was not stopped between its kill and its reaping).
func r18Sleeping(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	sleeping := false
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "State":
			sleeping = strings.HasPrefix(v, "S")
		case "SigPnd", "ShdPnd":
			if n, err := strconv.ParseUint(v, 16, 64); err != nil || n&(1<<(unix.SIGKILL-1)) != 0 {
				return false
			}
		}
	}
	return sleeping
}

// r18Stopped waits until pid is stopped (state T).
func r18Stopped(t *testing.T, pid int) {
	t.Helper()
	for range 2000 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		require.NoError(t, err)
		s := string(b)
		if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 0 && (f[0] == "T" || f[0] == "t") {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the mounter %d never stopped", pid)
}

// r18Alive says whether pid is a live process (not gone, not a zombie).
func r18Alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// r18CatchHolder stops the mounter at random points after builds
// (each build taken makes it build one for its stock) until it is
// stopped while a holder lives and sleeps; it returns the holder's pid,
// the mounter left stopped. Skips if none is found in 400 tries.
func r18CatchHolder(t *testing.T, m *Mounter, src int) int {
	t.Helper()
	pid := m.cmd.Process.Pid
	for try := 0; try < 400; try++ {
		ns, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
		require.NoError(t, err)
		ns.Close()
		spin := time.Duration(rand.IntN(1500)) * time.Microsecond
		for start := time.Now(); time.Since(start) < spin; {
		}
		require.NoError(t, unix.Kill(pid, unix.SIGSTOP))
		r18Stopped(t, pid)
		if holder := r18Holder(t, m); holder != 0 && r18Sleeping(holder) {
			return holder
		}
		require.NoError(t, unix.Kill(pid, unix.SIGCONT))
	}
	t.Skip("no stop of the mounter found a holder alive in 400 tries")
	return 0
}

// The mounter killed in the middle of an inline build, while its holder
// lives: the holder (a copy of the mounter's descriptor table, the host's
// socket among them, and in a user namespace of its own) outlives it for
// up to INLINE_HOLD seconds, sleeping; the host must see the mounter's
// death at once rather than when the holder's copy of the socket closes
// (its next request used to wait for the holder's end, the mounter's
// lock held all that while, so every mount job of the pool stalled).
// The probe stops the mounter at random points after builds until one
// stop finds a holder (it skips if none is found in its tries).
func TestReview18MounterDeathMidBuild(t *testing.T) {
	m := preparedMounter(t, 2, 0, false)
	settle(t, m, 1+2)
	if _, _, on, seed := mounterBuilds(t, m, false); !on || !seed {
		t.Skip("no inline builds here (no seed namespace or no clone)")
	}
	pid := m.cmd.Process.Pid
	src := openPath(t, dataDir(t, "A"))
	holder := r18CatchHolder(t, m, src)
	// What the holder holds: the mounter's socket to the host, among the
	// rest of its descriptors.
	sock, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/3")
	require.NoError(t, err)
	hs, err := os.Readlink("/proc/" + strconv.Itoa(holder) + "/fd/3")
	require.NoError(t, err)
	t.Logf("holder %d of mounter %d; its fd 3 is %s (the mounter's: %s)", holder, pid, hs, sock)
	require.NoError(t, unix.Kill(pid, unix.SIGKILL))
	var (
		wg      sync.WaitGroup
		aliveAt bool
		err2    error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ns *Namespace
		ns, err2 = m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
		if ns != nil {
			ns.Close()
		}
		aliveAt = r18Alive(holder)
	}()
	wg.Wait()
	t.Logf("the build after the mounter died: %v", err2)
	require.Error(t, err2, "a build answered by a dead mounter")
	require.True(t, aliveAt, "the host saw the mounter's death only once its holder was gone (%v)", err2)
	// The holder goes by itself (within INLINE_HOLD seconds: waited for
	// in long runs only).
	if os.Getenv(testenv.LongEnv) != "1" {
		return
	}
	for range 1200 {
		if !r18Alive(holder) {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("the holder %d outlived its mounter by 30 s", holder)
}

// Requests racing the inline builds from several goroutines (attaches,
// leases, their attaches and releases, in any order) never get one
// namespace twice: every namespace held at once is a different one, and
// each attached one shows exactly its job's mount.
func TestReview18RacingRequestsNeverShareNamespace(t *testing.T) {
	m := preparedMounter(t, 2, 0, false)
	settle(t, m, 1+2)
	src := openPath(t, dataDir(t, "A"))
	var (
		mu   sync.Mutex
		held = map[uint64]bool{}
		errs []string
		keep []*Namespace
	)
	take := func(ns *Namespace) {
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(int(ns.Mount.Fd()), &st))
		mu.Lock()
		defer mu.Unlock()
		if held[st.Ino] {
			errs = append(errs, fmt.Sprintf("namespace %d handed out twice", st.Ino))
		}
		held[st.Ino] = true
		keep = append(keep, ns)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 15 {
				switch (g + i) % 3 {
				case 0:
					ns, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
					if err == nil {
						take(ns)
					}
				case 1:
					l, err := m.Lease()
					if err == nil {
						take(l.Namespace)
						if err := m.Attach(l.ID, Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}}); err != nil {
							mu.Lock()
							errs = append(errs, "attach of a lease: "+err.Error())
							mu.Unlock()
						}
					}
				case 2:
					l, err := m.Lease()
					if err == nil {
						take(l.Namespace)
						_ = m.Release(l.ID)
					}
				}
			}
		}()
	}
	wg.Wait()
	require.Empty(t, errs)
	require.GreaterOrEqual(t, len(keep), 20, "few requests got a namespace")
	for i, ns := range keep[:4] {
		got := look(t, ns)
		require.Subset(t, []any{"/", "/usr", "/proc", "/data"}, got["mounts"], "namespace %d", i)
	}
	for _, ns := range keep {
		ns.Close()
	}
	settle(t, m, 1+2)
	r18Home(t, m, "after racing requests")
}

// A signal sent to a holder (by whoever may signal the mounter's
// processes: a root process of the host, a terminal's Ctrl-C to the
// pool's process group) touches nothing of the mounter's: the holder
// shares the mounter's memory and, cloned with the mounter's signal
// handlers, would run Python's C-level handler there (SIGINT: the
// mounter then raised KeyboardInterrupt and died, failing every later
// mount job of the pool). The mounter serves on, its builds proper.
func TestReview18SignalToHolder(t *testing.T) {
	testenv.Slow(t)
	m := preparedMounter(t, 2, 0, false)
	settle(t, m, 1+2)
	if _, _, on, seed := mounterBuilds(t, m, false); !on || !seed {
		t.Skip("no inline builds here (no seed namespace or no clone)")
	}
	pid := m.cmd.Process.Pid
	src := openPath(t, dataDir(t, "A"))
	for _, sig := range []unix.Signal{unix.SIGINT, unix.SIGUSR1, unix.SIGTERM} {
		holder := r18CatchHolder(t, m, src)
		require.NoError(t, unix.Kill(holder, sig))
		require.NoError(t, unix.Kill(pid, unix.SIGCONT))
		for i := range 3 {
			ns, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
			require.NoError(t, err, "build %d after %v to the holder", i, sig)
			got := look(t, ns, "/data/f.txt")
			ns.Close()
			require.Equal(t, "A", got["read /data/f.txt"])
		}
		require.True(t, r18Alive(pid), "the mounter died of %v sent to its holder", sig)
		settle(t, m, 1+2)
		r18Home(t, m, "after "+sig.String()+" to a holder")
	}
}

// A stock build that fails with an error other than an OSError (here a
// base plan's link name the C library cannot take: a ValueError in the
// build) fails that build only, as a builder child's failure did: the
// mounter answers each request with the build's error and serves on.
// (Inline, the error came up through the main loop's refill, outside
// any request, and ended the mounter.)
func TestReview18BuildErrorKeepsMounter(t *testing.T) {
	requireMounter(t)
	m, err := Start("/usr/bin/python3")
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	require.NoError(t, m.Prepare(Plan{
		Binds: []Bind{{Source: openPath(t, "/usr"), Path: "/usr", ReadOnly: true}},
		Links: [][2]string{{"bad\x00link", "usr/lib"}},
	}, 2))
	src := openPath(t, dataDir(t, "A"))
	for i := range 3 {
		_, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
		require.Error(t, err, "build %d", i)
		t.Logf("build %d: %v", i, err)
		require.Contains(t, err.Error(), "null", "build %d: the error names the build's failure", i)
	}
	require.True(t, r18Alive(m.cmd.Process.Pid), "the mounter died of a build's error")
	mounterBuilds(t, m, false) // it answers
	r18Home(t, m, "after failed builds")
}

// r18FDs counts the mounter's open descriptors.
func r18FDs(t *testing.T, m *Mounter) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(m.cmd.Process.Pid) + "/fd")
	require.NoError(t, err)
	return len(ents)
}

// Stock builds that fail midway leave no descriptor behind in the
// mounter: neither the detached root nor the clones of the base's binds
// not attached yet. (A builder child's were closed by its exit; an
// inline build's stayed open in the mounter, one root and the rest of
// the clones per failed build, until it ran out of descriptors.) Here
// the base plan has a bind beneath a file's bind, so that every build
// fails at that mountpoint, with a deeper bind still to attach; and one
// whose link name the C library refuses (a failure before any bind).
func TestReview18FailedBuildsLeakNothing(t *testing.T) {
	requireMounter(t)
	file := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(file, []byte("f"), 0o644))
	for name, base := range map[string]Plan{
		"bind beneath a file": {Binds: []Bind{{Source: openPath(t, file), Path: "/f", ReadOnly: true},
			{Source: openPath(t, "/usr"), Path: "/f/x", ReadOnly: true},
			{Source: openPath(t, "/usr"), Path: "/z/y/w", ReadOnly: true}}},
		"bad link": {Binds: []Bind{{Source: openPath(t, "/usr"), Path: "/usr", ReadOnly: true}},
			Links: [][2]string{{"bad\x00link", "usr/lib"}}},
	} {
		t.Run(name, func(t *testing.T) {
			m, err := Start("/usr/bin/python3")
			require.NoError(t, err)
			t.Cleanup(func() { m.Close() })
			require.NoError(t, m.Prepare(base, 2))
			src := openPath(t, dataDir(t, "A"))
			try := func() {
				_, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
				require.Error(t, err)
				require.Contains(t, err.Error(), "building a namespace")
			}
			try()
			before := r18FDs(t, m)
			for range 10 {
				try()
			}
			require.Equal(t, before, r18FDs(t, m), "the mounter's descriptors after 10 more failed builds")
		})
	}
}
