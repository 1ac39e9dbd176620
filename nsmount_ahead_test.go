package pynox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// aheadStats is what a pool's namespaces attached ahead did so far.
type aheadStats struct {
	took, offered, recycled, reattached, ready, failures int
	active                                               bool
}

func aheadOf(p *Pool) aheadStats {
	a := &p.ns.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	return aheadStats{took: a.took, offered: a.tookOffer, recycled: a.recycled, reattached: a.reattached,
		ready: len(a.ready), failures: a.failures, active: a.src != nil}
}

// aheadDrop makes p drop what it attached ahead (as after nsAheadIdle
// without mount jobs), for tests that count what the pool holds.
func aheadDrop(p *Pool) {
	a := &p.ns.ahead
	a.mu.Lock()
	a.last, a.streak = nil, 0
	r := a.dropLocked()
	a.mu.Unlock()
	p.discardAhead(r)
}

// aheadEntered says whether the process pid sits in a namespace showing
// a mount at /data (one attached ahead: a leased one shows none before
// its job), waiting up to 2 s for it to enter one.
func aheadEntered(p *Pool, pid int) bool {
	for range 40 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
		if err == nil && strings.Contains(string(b), " /data ") {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// aheadWarm runs mount jobs with mounts until the pool has namespaces
// attached ahead ready for them. (A change to the process's mount
// namespace, which other tests' pools make as they start, makes those
// attached before it stale: more jobs then.)
func aheadWarm(t *testing.T, p *Pool, mounts []MountSpec) {
	t.Helper()
	for i := range 30 {
		requireOK(t, run(t, p, Job{Mounts: mounts, Code: "pass"}))
		if i >= 2 && aheadOf(p).ready > 0 {
			return
		}
		if i >= 2 {
			time.Sleep(20 * time.Millisecond) // for the fill after the answer
		}
	}
	t.Fatalf("no namespace was attached ahead: %+v", aheadOf(p))
}

// aheadSpare warms p (aheadWarm) until its worker's ready ns spare has
// entered a namespace attached ahead, and returns the spare's pid.
func aheadSpare(t *testing.T, p *Pool, mounts []MountSpec) int {
	t.Helper()
	for range 10 {
		aheadWarm(t, p, mounts)
		if pid := nsSparePid(t, p.workers[0].live.Load()); aheadEntered(p, pid) {
			return pid
		}
	}
	t.Fatalf("the ready ns spare never entered a namespace attached ahead: %+v", aheadOf(p))
	return 0
}

// aheadUsed says whether, from before to after, jobs took namespaces
// attached ahead (some entered by their process before the job) and
// some came back after their job, a few times each.
func aheadUsed(before, after aheadStats) bool {
	return after.took-before.took >= 4 && after.offered-before.offered >= 2 && after.recycled-before.recycled >= 2
}

// aheadJobCode is a job that reports its scratch directory (TMPDIR, its
// entries before it writes anything, HOME and PYNOX_OUTPUTS), writes a
// file of its own there and an output, and reads /data.
const aheadJobCode = `import os, sys
t = os.environ["TMPDIR"]
print(t, sorted(os.listdir(t)), os.environ["HOME"] == t, os.environ["PYNOX_OUTPUTS"] == t + "/outputs")
open(os.path.join(t, "mine-%s" % sys.argv[1]), "w").write("x")
open(os.path.join(os.environ["PYNOX_OUTPUTS"], "out-%s.txt" % sys.argv[1]), "w").write(sys.argv[1])
print(open("/data/f.txt").read())
`

// TestAheadTakenAndRecycled: once a pool's mount jobs repeat their
// mounts, a job takes a namespace attached ahead (its process entered it
// before the job came) and it comes back for a later job once the job's
// process is gone; each job still finds its own scratch directory empty
// but for its outputs directory, with TMPDIR, HOME and PYNOX_OUTPUTS
// pointing at it, sees its mount, and gets its outputs; the scratch
// directories are emptied afterwards.
func TestAheadTakenAndRecycled(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	before := aheadOf(p)
	// At least 12 jobs, more while a namespace attached ahead was not yet
	// taken and taken back a few times (a mount change in the process,
	// which other tests' pools make as they start, makes one stale).
	for i := 0; i < 12 || (i < 60 && !aheadUsed(before, aheadOf(p))); i++ {
		res := run(t, p, Job{Mounts: mounts, Code: aheadJobCode, Args: []string{strconv.Itoa(i)}})
		requireOK(t, res)
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		require.Len(t, lines, 2, res.Stdout)
		dir := strings.Fields(lines[0])[0]
		require.Equal(t, dir+" ['outputs'] True True", lines[0], "job %d: its scratch directory was not fresh", i)
		require.Equal(t, "hello", lines[1])
		require.Len(t, res.Files, 1)
		require.Equal(t, dir+"/outputs/out-"+strconv.Itoa(i)+".txt", res.Files[0].Path)
		require.Equal(t, strconv.Itoa(i), string(res.Files[0].Data))
	}
	after := aheadOf(p)
	t.Logf("before %+v after %+v", before, after)
	require.True(t, aheadUsed(before, after), "namespaces attached ahead were not taken, entered ahead and taken back")
	requireScratchEmpty(t, p, "scratch left behind after jobs in namespaces attached ahead")
}

// TestAheadOtherMounts: a job asking for other mounts than the namespace
// attached ahead holds, whose process entered it already, gets exactly
// its own: the part held before is gone, its mountpoint too (not even
// the name shows), and the pool then stops attaching ahead until a part
// repeats again.
func TestAheadOtherMounts(t *testing.T) {
	t.Parallel()
	p, data := r13ProcPool(t)
	out := filepath.Join(p.Config().Dir, "out")
	require.NoError(t, os.Mkdir(out, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(out, "o.txt"), []byte("other"), 0o644))
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	pid := aheadSpare(t, p, mounts)
	before := aheadOf(p)
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: out, Path: "/deep/other", Mode: ReadOnly}}, Code: `import os
print(os.path.lexists("/data"), os.path.lexists("/deep/other/o.txt") and open("/deep/other/o.txt").read(), os.readlink("/proc/self"))`,
		AllowRead: []string{"/proc"}})
	requireOK(t, res)
	require.Equal(t, fmt.Sprintf("False other %d\n", pid), res.Stdout, "the job did not run in the spare that entered the namespace ahead, or saw its mount")
	require.Equal(t, before.reattached+1, aheadOf(p).reattached)
	require.False(t, aheadOf(p).active, "the pool kept attaching ahead the part no job asks for now")
	// The first part again: served, and attached ahead again once it repeats.
	for range 3 {
		res = run(t, p, Job{Mounts: mounts, Code: `import os; print(open("/data/f.txt").read(), os.path.lexists("/deep"))`})
		requireOK(t, res)
		require.Equal(t, "hello False\n", res.Stdout)
	}
	require.True(t, aheadOf(p).active)
}

// TestAheadSourceChanged: a namespace attached ahead is not taken when
// what the job's request names is not what it shows: the host directory
// replaced by another at the same path, or a file system mounted beneath
// it since (each job sees the host as it was when its request was
// accepted).
func TestAheadSourceChanged(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	// Replaced: renamed away, a new directory in its place.
	require.NoError(t, os.Rename(data, data+".old"))
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("new"), 0o644))
	res := run(t, p, Job{Mounts: mounts, Code: `print(open("/data/f.txt").read())`})
	requireOK(t, res)
	require.Equal(t, "new\n", res.Stdout)
	// A tmpfs mounted beneath the source after the namespaces ahead were
	// attached shows, and its unmount shows too.
	aheadWarm(t, p, mounts)
	sub := filepath.Join(data, "sub")
	require.NoError(t, os.Mkdir(sub, 0o755))
	aheadWarm(t, p, mounts)
	if err := unix.Mount("pynox-ahead", sub, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs for the test (%v): the mount-change case is not checked", err)
	}
	mounted := true
	defer func() {
		if mounted {
			unix.Unmount(sub, unix.MNT_DETACH)
		}
	}()
	require.NoError(t, os.WriteFile(filepath.Join(sub, "in-tmpfs"), []byte("t"), 0o644))

	res = run(t, p, Job{Mounts: mounts, Code: `import os; print(sorted(os.listdir("/data/sub")))`})
	requireOK(t, res)
	require.Equal(t, "['in-tmpfs']\n", res.Stdout, "a namespace attached before the host's mount was taken: %+v", aheadOf(p))
	aheadWarm(t, p, mounts)
	require.NoError(t, unix.Unmount(sub, 0))
	mounted = false
	res = run(t, p, Job{Mounts: mounts, Code: `import os; print(sorted(os.listdir("/data/sub")))`})
	requireOK(t, res)
	require.Equal(t, "[]\n", res.Stdout, "a namespace attached before the host's unmount was taken")
}

// TestAheadOverlayFresh: an overlay attached ahead is as empty as a fresh
// one, and a namespace with an overlay is never taken back for another
// job: no job sees another's overlay writes.
func TestAheadOverlayFresh(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/work", Mode: Overlay}}
	aheadWarm(t, p, mounts)
	before := aheadOf(p)
	for i := range 6 {
		res := run(t, p, Job{Mounts: mounts, Code: `import os, sys
print(sorted(os.listdir("/work")))
open("/work/w-" + sys.argv[1], "w").write("x")`, Args: []string{strconv.Itoa(i)}})
		requireOK(t, res)
		require.Equal(t, "['f.txt', 'fifo']\n", res.Stdout, "job %d saw another job's overlay writes", i)
	}
	after := aheadOf(p)
	require.Positive(t, after.took-before.took)
	require.Equal(t, before.recycled, after.recycled, "a namespace with an overlay came back for another job")
	_, err := os.Stat(filepath.Join(data, "w-0"))
	require.ErrorIs(t, err, os.ErrNotExist, "an overlay write reached the host")
}

// TestAheadConcurrentScratch: jobs running at once in namespaces attached
// ahead (two workers, taken and recycled many times) each see only their
// own scratch directory, never another's, and a different one from every
// job running beside them.
func TestAheadConcurrentScratch(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	requireNS(t, p)
	data := filepath.Join(p.Config().Dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("hello"), 0o644))
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	before := aheadOf(p)
	var wg sync.WaitGroup
	var mu sync.Mutex
	errs := []string{}
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := run(t, p, Job{Mounts: mounts, Args: []string{strconv.Itoa(i)}, Code: `import os, sys, time
t = os.environ["TMPDIR"]
first = sorted(os.listdir(t))
open(os.path.join(t, "mine"), "w").write(sys.argv[1])
time.sleep(0.02)
print(first, sorted(os.listdir(t)), open(os.path.join(t, "mine")).read(), open("/data/f.txt").read())`})
			if res.Error != nil || res.Stdout != fmt.Sprintf("['outputs'] ['mine', 'outputs'] %d hello\n", i) {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("job %d: %+v %q %q", i, res.Error, res.Stdout, res.Stderr))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Empty(t, errs)
	after := aheadOf(p)
	t.Logf("before %+v after %+v", before, after)
	require.Positive(t, after.took-before.took)
	requireScratchEmpty(t, p, "scratch left behind")
}

// TestAheadIdleStops: a pool stops attaching ahead, and drops what it
// attached, once no mount job came for a while.
func TestAheadIdleStops(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	p.ns.ahead.mu.Lock()
	p.ns.ahead.idleAfter = 300 * time.Millisecond
	p.ns.ahead.mu.Unlock()
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	require.True(t, eventually(func() bool { s := aheadOf(p); return !s.active && s.ready == 0 }), "still attaching ahead: %+v", aheadOf(p))
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: `print(open("/data/f.txt").read())`}))
}

// TestAheadIdleWhileLeasing: the pool goes idle just as a ready ns spare
// leases a namespace ahead (after the pool took it for the spare, before
// the spare holds it where RetireNSSpares looks): the spare still gives
// it back, and the pool counts no namespace ahead as a spare's. (Review
// 31's probe of this race failed in CI once, before the pool looked
// again for such spares.)
func TestAheadIdleWhileLeasing(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	a := &p.ns.ahead
	var armed, fired atomic.Bool
	a.mu.Lock()
	a.leased = func() {
		if !armed.Load() || !fired.CompareAndSwap(false, true) {
			return
		}
		// Idle now: as if the last mount job came long ago.
		a.mu.Lock()
		a.idleAfter = time.Millisecond
		a.used = time.Now().Add(-time.Second)
		a.mu.Unlock()
		p.aheadIdle()
	}
	a.mu.Unlock()
	for i := 0; i < 10 && !fired.Load(); i++ {
		// The ready ns spare sits in a namespace ahead: the job takes it
		// at once, and its replacement leases one with no job waiting.
		aheadSpare(t, p, mounts)
		armed.Store(true)
		requireOK(t, run(t, p, Job{Mounts: mounts, Code: "pass"}))
		time.Sleep(50 * time.Millisecond)
		armed.Store(false)
	}
	require.True(t, fired.Load(), "no spare leased a namespace ahead: %+v", aheadOf(p))
	a.mu.Lock()
	a.leased = nil
	a.mu.Unlock()
	tpl := p.workers[0].live.Load()
	require.True(t, eventually(func() bool {
		a.mu.Lock()
		lent := a.lent
		a.mu.Unlock()
		return lent == 0
	}), "a spare still holds a namespace ahead after the pool idled")
	pid := nsSparePid(t, tpl)
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	require.NoError(t, err)
	require.NotContains(t, string(b), " /data ", "the ready ns spare still sits in a namespace attached ahead after the pool idled")
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: `print(open("/data/f.txt").read())`}))
}

// TestAheadMounterDies: with the mounter dead, a job asking for other
// mounts than the namespace its spare entered ahead holds cannot have
// them attached: it fails closed (SandboxSetupError, no code ran) and
// nothing hangs; a job asking for the part attached ahead may still run
// in one (it needs no mounter), and jobs without mounts are served.
func TestAheadMounterDies(t *testing.T) {
	before := mounterPids(t)
	p, data, out := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadSpare(t, p, mounts)
	mounter := newMounter(t, before)
	require.NoError(t, unix.Kill(mounter, unix.SIGKILL))
	require.True(t, eventually(func() bool { return !processAlive(mounter) }))
	marker := filepath.Join(out, "ran")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := p.Run(ctx, Job{Mounts: []MountSpec{{HostPath: out, Path: "/out", Mode: ReadWrite}},
		Code: `open("/out/ran", "w").write("ran")`})
	require.NoError(t, err, "a mount job after the mounter's death did not answer")
	require.NotNil(t, res.Error)
	require.Equal(t, "SandboxSetupError", res.Error.Type, res.Error.Message)
	require.Contains(t, res.Error.Message, "no code ran")
	require.NoFileExists(t, marker)
	res, err = p.Run(ctx, Job{Mounts: mounts, Code: `print(open("/data/f.txt").read())`})
	require.NoError(t, err)
	if res.Error == nil {
		require.Equal(t, "hello\n", res.Stdout)
	} else {
		require.Equal(t, "SandboxSetupError", res.Error.Type, res.Error.Message)
	}
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
}

// TestAheadSession: a session asking for the part attached ahead may
// start in such a namespace (it is never taken back: a session keeps its
// namespace): its scratch directory starts empty, each step gets the
// outputs it wrote, and its files stay between steps.
func TestAheadSession(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	took := false
	// (More attempts while a mount change in the process, which other
	// tests' pools make as they start, makes the namespace ahead stale.)
	for attempt := 0; !took && attempt < 15; attempt++ {
		aheadSpare(t, p, mounts)
		before := aheadOf(p)
		c, err := p.Checkout(t.Context(), Job{Mounts: mounts})
		require.NoError(t, err)
		for i := range 2 {
			ev, err := c.Feed(t.Context(), Step{Code: `import os
t = os.environ["TMPDIR"]
print(sorted(os.listdir(t)), open("/data/f.txt").read())
open(os.path.join(t, "kept-%d" % ` + strconv.Itoa(i) + `), "w").write("k")
open(os.path.join(os.environ["PYNOX_OUTPUTS"], "step-%d.txt" % ` + strconv.Itoa(i) + `), "w").write("s")`})
			require.NoError(t, err)
			requireOK(t, ev.Result)
			want := map[int]string{0: "['outputs'] hello\n", 1: "['kept-0', 'outputs'] hello\n"}[i]
			require.Equal(t, want, ev.Result.Stdout, "step %d", i)
			require.Len(t, ev.Result.Files, 1, "step %d", i)
			require.True(t, strings.HasSuffix(ev.Result.Files[0].Path, "/outputs/step-"+strconv.Itoa(i)+".txt"), ev.Result.Files[0].Path)
		}
		took = aheadOf(p).took > before.took
		require.NoError(t, c.Finish(t.Context()))
	}
	require.True(t, took, "no session started in a namespace attached ahead: %+v", aheadOf(p))
}

// TestAheadUnattachablePart: a part that no attach can make (a mount
// path under one of the host's top-level links), asked for again and
// again, is not kept being attached ahead: after the one attach ahead
// that fails the pool stops, each job fails closed on its own (no code
// ran), and a job with a good part is served.
func TestAheadUnattachablePart(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	link := ""
	for _, l := range []string{"/lib", "/bin", "/lib64", "/sbin"} {
		if fi, err := os.Lstat(l); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			link = l
			break
		}
	}
	if link == "" {
		t.Skip("the host has no top-level symbolic link")
	}
	bad := []MountSpec{{HostPath: data, Path: link + "/pynox-ahead"}}
	for range 5 {
		res := run(t, p, Job{Mounts: bad, Code: `print("ran")`})
		require.NotNil(t, res.Error)
		require.Equal(t, "SandboxSetupError", res.Error.Type, res.Error.Message)
		require.Contains(t, res.Error.Message, "no code ran")
		require.Empty(t, res.Stdout)
		time.Sleep(20 * time.Millisecond) // for a fill after the answer
	}
	s := aheadOf(p)
	require.False(t, s.active, "the pool keeps attaching ahead a part no attach can make: %+v", s)
	require.LessOrEqual(t, s.failures, 1, "the pool tried again and again to attach ahead a part no attach can make")
	require.Zero(t, s.ready)
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `print(open("/data/f.txt").read())`})
	requireOK(t, res)
	require.Equal(t, "hello\n", res.Stdout)
}
