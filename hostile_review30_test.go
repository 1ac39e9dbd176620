package pynox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
	"github.com/pynox/pynox/internal/worker"
)

// r30Check is a job that reports what it finds of the jobs before it:
// its scratch directory's entries, its outputs directory's, and /data.
const r30Check = `import os
t = os.environ["TMPDIR"]
print(sorted(os.listdir(t)), sorted(os.listdir(os.environ["PYNOX_OUTPUTS"])), open("/data/f.txt").read())
`

// TestHostileReview30NetworkKindsSameMounts: mount jobs with the same
// mounts alternate between allowing the network and not (the two kinds
// of ns spare, both of which enter namespaces attached ahead): each job
// gets its own network policy, whichever namespace ahead it took.
func TestHostileReview30NetworkKindsSameMounts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := newTestPool(t, Config{Workers: 1, Dir: dir, Limits: Limits{AllowNetwork: true}})
	requireNS(t, p)
	data := filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("hello"), 0o644))
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	code := `import socket
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close(); print("net")
except OSError as e:
    print("nonet")
print(open("/data/f.txt").read())
`
	before := aheadOf(p)
	for i := range 12 {
		net := i%3 != 0
		res := run(t, p, Job{Mounts: mounts, AllowNetwork: net, Code: code})
		requireOK(t, res)
		want := "nonet\nhello\n"
		if net {
			want = "net\nhello\n"
		}
		require.Equal(t, want, res.Stdout, "job %d (network %v)", i, net)
	}
	t.Logf("before %+v after %+v", before, aheadOf(p))
}

// TestHostileReview30RecycleAfterAbnormalEnd: a one-shot job that took a
// namespace attached ahead and ended abnormally (its timeout, its
// memory limit, a crash by signal, an exit in the middle of writing),
// after planting files in its scratch directory and outputs, is reported
// as what it was; the later jobs of the same mounts (among them, once it
// came back, the one in that namespace) find a fresh scratch directory
// and no outputs of it.
func TestHostileReview30RecycleAfterAbnormalEnd(t *testing.T) {
	testenv.Slow(t) // about 5 s
	t.Parallel()
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	plant := `import os
t = os.environ["TMPDIR"]
open(t + "/left", "w").write("x")
open(os.environ["PYNOX_OUTPUTS"] + "/left.txt", "w").write("x")
`
	ends := []struct {
		name string
		job  Job
		kind string
	}{
		{"timeout", Job{Code: plant + "import time\ntime.sleep(30)", Timeout: 400 * time.Millisecond}, "TimeoutError"},
		{"memory", Job{Code: plant + "x = []\nwhile True:\n    x.append(bytearray(1 << 24))", Memory: 64 << 20}, ""},
		{"signal", Job{Code: plant + "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"}, ""},
		{"exit", Job{Code: plant + "import os\nos._exit(3)"}, ""},
	}
	before := aheadOf(p)
	for _, e := range ends {
		e.job.Mounts = mounts
		res := run(t, p, e.job)
		require.True(t, res.Error != nil || res.Exit == 3, "%s: exit %d", e.name, res.Exit)
		t.Logf("%s: %+v exit %d", e.name, res.Error, res.Exit)
		if e.kind != "" {
			require.Equal(t, e.kind, res.Error.Type, e.name)
		}
		time.Sleep(100 * time.Millisecond)
		for i := range 4 {
			res := run(t, p, Job{Mounts: mounts, Code: r30Check})
			requireOK(t, res)
			require.Equal(t, "['outputs'] [] hello\n", res.Stdout, "after %s, job %d", e.name, i)
			require.Empty(t, res.Files, "after %s, job %d collected", e.name, i)
		}
	}
	t.Logf("before %+v after %+v", before, aheadOf(p))
	time.Sleep(2500 * time.Millisecond)
	requireScratchEmpty(t, p, "scratch left behind after abnormal ends")
}

// TestHostileReview30FileSource: a mount whose source is a file, attached
// ahead: each job sees the file's current content, a write through a
// read-write file mount reaches the host, and once the host replaces the
// file (a rename over it: another inode) the next job sees the new one,
// never the old object the namespace ahead holds.
func TestHostileReview30FileSource(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data, _ := nsPool(t)
	f := filepath.Join(data, "f.txt")
	mounts := []MountSpec{{HostPath: f, Path: "/cfg.txt", Mode: ReadOnly}}
	for range 30 {
		requireOK(t, run(t, p, Job{Mounts: mounts, Code: "pass"}))
		if aheadOf(p).ready > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := range 8 {
		want := "v" + strconv.Itoa(i)
		tmp := filepath.Join(data, "new")
		require.NoError(t, os.WriteFile(tmp, []byte(want), 0o644))
		require.NoError(t, os.Rename(tmp, f))
		for k := range 3 {
			res := run(t, p, Job{Mounts: mounts, Code: `print(open("/cfg.txt").read())`})
			requireOK(t, res)
			require.Equal(t, want, strings.TrimSpace(res.Stdout), "round %d job %d", i, k)
		}
	}
	t.Logf("%+v", aheadOf(p))
}

// TestHostileReview30SessionRestartAhead: a session with repeated mounts
// whose process ends now and then (os._exit in a step): each replacement
// process may start in a namespace attached ahead, whose scratch
// directory then becomes the session's (the old one goes back to the
// pool for other jobs). Every step's TMPDIR, HOME and PYNOX_OUTPUTS name
// the session's current scratch directory, which its policy reports;
// each step gets exactly the files it wrote (its outputs, and its
// $TMPDIR collect pattern), never those of the one-shot jobs running
// beside it, which get scratch directories the session gave back.
func TestHostileReview30SessionRestartAhead(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	before := aheadOf(p)
	c, err := p.Checkout(t.Context(), Job{Mounts: mounts})
	require.NoError(t, err)
	defer c.Finish(t.Context())
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			mo := mounts
			if i%2 == 0 {
				mo = nil
			}
			res, err := p.Run(t.Context(), Job{Mounts: mo, Code: `import os
t = os.environ["TMPDIR"]
open(t + "/other.txt", "w").write("other")
open(os.environ["PYNOX_OUTPUTS"] + "/other-out.txt", "w").write("other")
import time; time.sleep(0.05)`})
			if err != nil || res.Error != nil {
				return
			}
		}
	}()
	scratches := map[string]bool{}
	for i := range 10 {
		code := `import os
t = os.environ["TMPDIR"]
print(t, os.environ["HOME"] == t, os.environ["PYNOX_OUTPUTS"] == t + "/outputs", open("/data/f.txt").read())
open(t + "/s%d.txt", "w").write("s")
open(os.environ["PYNOX_OUTPUTS"] + "/o%d.txt", "w").write("o")
`
		code = strings.ReplaceAll(code, "%d", strconv.Itoa(i))
		if i%2 == 1 {
			code += "import sys; sys.stdout.flush(); os._exit(0)\n"
		}
		ev, err := c.Feed(t.Context(), Step{Code: code, Collect: []string{"$TMPDIR/*.txt"}})
		require.NoError(t, err)
		res := ev.Result
		require.Nil(t, res.Error, "step %d: %+v %s", i, res.Error, res.Stderr)
		f := strings.Fields(res.Stdout)
		require.Len(t, f, 4, "step %d: %q", i, res.Stdout)
		require.Equal(t, []string{"True", "True", "hello"}, f[1:], "step %d", i)
		require.Equal(t, res.Policy.Scratch, f[0], "step %d: TMPDIR is not the session's scratch directory", i)
		scratches[res.Policy.Scratch] = true
		var got []string
		for _, fl := range res.Files {
			require.True(t, strings.HasPrefix(fl.Path, res.Policy.Scratch+"/"), "step %d: %s", i, fl.Path)
			got = append(got, filepath.Base(fl.Path))
		}
		// The files in $TMPDIR stay for the process's later steps; its
		// outputs are collected once; a replacement starts empty.
		n := strconv.Itoa(i)
		want := []string{"s" + n + ".txt", "o" + n + ".txt"}
		if i%2 == 1 {
			want = append(want, "s"+strconv.Itoa(i-1)+".txt")
		}
		require.ElementsMatch(t, want, got, "step %d files", i)
	}
	close(stop)
	<-done
	t.Logf("before %+v after %+v; the session's scratch directories: %d", before, aheadOf(p), len(scratches))
}

const r30SelfConfineEnv = "PYNOX_R30_SELFCONFINE"

// TestHostileReview30SelfConfinedSlots: in a pool that confines itself
// (every namespace's root a clone of a slot of its own: nsSlots), one
// worker, two sessions at most, the network allowed for some jobs (two
// kinds of ready ns spare, both entering namespaces ahead), an idle
// expiry firing every few tens of milliseconds (the spares in
// namespaces ahead retired and replaced): sessions with the same mounts
// that restart their process, and one-shot jobs of both kinds beside
// them, never run out of slots, and each gets its own mounts and a
// fresh scratch directory.
func TestHostileReview30SelfConfinedSlots(t *testing.T) {
	dir, child := nsChildProcess(t, r30SelfConfineEnv)
	if !child {
		return
	}
	p, err := New(Config{Python: testPython(), Dir: dir, ConfineSelf: true, Workers: 1, MaxSessions: 2,
		Limits: Limits{AllowRead: []string{dir}, AllowWrite: []string{dir}, AllowNetwork: true}})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	requireNS(t, p)
	data := helloDataDir(t, dir)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	p.ns.ahead.mu.Lock()
	p.ns.ahead.idleAfter = 40 * time.Millisecond
	p.ns.ahead.mu.Unlock()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	fail := func(s string) {
		mu.Lock()
		errs = append(errs, s)
		mu.Unlock()
	}
	check := `import os
t = os.environ["TMPDIR"]
first = sorted(os.listdir(t))
open(t + "/mine", "w").write("x")
print(open("/data/f.txt").read(), first)`
	for s := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := p.Checkout(t.Context(), Job{Mounts: mounts, AllowNetwork: s == 1})
			if err != nil {
				fail(fmt.Sprintf("session %d: %v", s, err))
				return
			}
			defer c.Finish(t.Context())
			for i := range 8 {
				code := check
				if i%2 == 1 {
					code += "\nimport sys; sys.stdout.flush(); os._exit(0)"
				}
				ev, err := c.Feed(t.Context(), Step{Code: code})
				want := "hello ['outputs']\n"
				if i%2 == 1 {
					want = "hello ['mine', 'outputs']\n"
				}
				if err != nil || ev.Result.Error != nil || ev.Result.Stdout != want {
					var r *Result
					if err == nil {
						r = ev.Result
					}
					fail(fmt.Sprintf("session %d step %d: %v %+v", s, i, err, r))
				}
			}
		}()
	}
	for lane := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 12 {
				time.Sleep(time.Duration((i*13+lane*7)%50) * time.Millisecond)
				res := run(t, p, Job{Mounts: mounts, AllowNetwork: (i+lane)%2 == 0, Code: check})
				if res.Error != nil || res.Stdout != "hello ['outputs']\n" {
					fail(fmt.Sprintf("lane %d job %d: %+v %q %q", lane, i, res.Error, res.Stdout, res.Stderr))
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("ahead %+v", aheadOf(p))
	require.Empty(t, errs)
}

// TestHostileReview30RetireRacesTake: the templates' RetireNSSpares (as
// the pool's idle expiry calls it) running without pause while jobs of
// both network kinds, with the same mounts, take their ready ns spares
// (TakeNS): no job waits for a spare that never comes (a template
// declared wedged), fails, or runs with another's mounts or scratch.
func TestHostileReview30RetireRacesTake(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	dir := t.TempDir()
	p := newTestPool(t, Config{Workers: 2, Dir: dir, Limits: Limits{AllowNetwork: true}})
	requireNS(t, p)
	data := helloDataDir(t, dir)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	stop := make(chan struct{})
	retired := make(chan int)
	go func() {
		n := 0
		defer func() { retired <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, w := range p.workers {
				if tpl := w.live.Load(); tpl != nil {
					tpl.RetireNSSpares(func(l *worker.NSLease) bool {
						n++
						return true
					})
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	for lane := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				start := time.Now()
				res := run(t, p, Job{Mounts: mounts, AllowNetwork: (i+lane)%2 == 0, Code: `import os
t = os.environ["TMPDIR"]
first = sorted(os.listdir(t))
open(t + "/mine", "w").write("x")
print(open("/data/f.txt").read(), first)`})
				if res.Error != nil || res.Stdout != "hello ['outputs']\n" || time.Since(start) > 5*time.Second {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("lane %d job %d: %+v %q %q in %s", lane, i, res.Error, res.Stdout, res.Stderr, time.Since(start)))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	t.Logf("retired %d spares; ahead %+v", <-retired, aheadOf(p))
	require.Empty(t, errs)
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "pass"}))
}

// TestHostileReview30CancelAndCloseAhead: jobs in namespaces attached
// ahead whose callers give up (their context cancelled mid-job) are
// answered as cancelled and the next jobs find fresh scratch
// directories; then the pool closes while jobs run in namespaces ahead
// and others wait: Close returns promptly, every caller is answered,
// and no process of the pool's (templates, spares, jobs, the mounter)
// is left.
func TestHostileReview30CancelAndCloseAhead(t *testing.T) {
	testenv.Slow(t)
	// Not parallel: it counts the test process's descendants.
	dir := t.TempDir()
	p, err := New(Config{Python: testPython(), Dir: dir, Workers: 2, Limits: Limits{AllowWrite: []string{dir}}})
	require.NoError(t, err)
	defer p.Close()
	requireNS(t, p)
	data := helloDataDir(t, dir)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	plant := `import os, time
open(os.environ["TMPDIR"] + "/left", "w").write("x")
open(os.environ["PYNOX_OUTPUTS"] + "/left.txt", "w").write("x")
time.sleep(30)`
	for i := range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		_, err := p.Run(ctx, Job{Mounts: mounts, Code: plant})
		cancel()
		require.Error(t, err, "job %d", i)
		for k := range 3 {
			res := run(t, p, Job{Mounts: mounts, Code: r30Check})
			requireOK(t, res)
			require.Equal(t, "['outputs'] [] hello\n", res.Stdout, "after cancel %d, job %d", i, k)
		}
	}
	before := r30Procs(t)
	var wg sync.WaitGroup
	answered := make(chan error, 6)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := p.Run(context.Background(), Job{Mounts: mounts, Code: plant})
			answered <- err
		}()
	}
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	require.NoError(t, p.Close())
	require.Less(t, time.Since(start), 10*time.Second, "Close took long")
	wg.Wait()
	close(answered)
	for err := range answered {
		require.Error(t, err)
	}
	t.Logf("ahead %+v; pool processes before close: %d", aheadOf(p), len(before))
	for range 50 {
		if len(r30Procs(t)) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.Empty(t, r30Procs(t), "processes of the pool left after Close")
}

// r30Procs lists the processes whose parent is this process or whose
// ancestry leads to it (the pool's templates, spares, jobs, mounter).
func r30Procs(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	parent := map[int]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) > 1 {
			pp, _ := strconv.Atoi(f[1])
			parent[pid] = pp
		}
	}
	me := os.Getpid()
	var out []int
	for pid := range parent {
		for q, n := parent[pid], 0; q > 1 && n < 64; q, n = parent[q], n+1 {
			if q == me {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// TestHostileReview30KeyringAcrossRecycle: a job's user keyring belongs
// to its user namespace, which a namespace attached ahead and taken back
// keeps for a later job: a key a job adds there must not reach the next
// job in that namespace. (Held: add_key and keyctl are denied to jobs.)
func TestHostileReview30KeyringAcrossRecycle(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	code := `import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
add, keyctl = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
r = libc.syscall(add, b"user", b"r30secret", b"leaked", 6, -4)  # KEY_SPEC_USER_KEYRING
s = libc.syscall(keyctl, 10, -4, b"user", b"r30secret", 0)      # KEYCTL_SEARCH
print(os.readlink("/proc/self/ns/user"), r >= 0, s >= 0)
`
	seen := map[string]bool{}
	again := 0
	for i := range 12 {
		res := run(t, p, Job{Mounts: mounts, Code: code})
		requireOK(t, res)
		f := strings.Fields(res.Stdout)
		require.Len(t, f, 3, res.Stdout)
		if seen[f[0]] {
			again++
		}
		seen[f[0]] = true
		require.Equal(t, []string{"False", "False"}, f[1:], "job %d (%s): a key added, or one found", i, f[0])
	}
	t.Logf("jobs in a user namespace an earlier job ran in: %d; %+v", again, aheadOf(p))
}

// TestHostileReview30TwoPools: two pools in one process whose jobs ask
// for the same mounts (each pool attaching its own namespaces ahead),
// run side by side, and one closes (its scratch tmpfs unmounted: a
// mount change the other's namespaces ahead must notice): every job of
// the other pool still sees its mounts and a fresh scratch directory
// of its own pool, and gets its own outputs.
func TestHostileReview30TwoPools(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	dir := t.TempDir()
	data := helloDataDir(t, dir)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	a := newTestPool(t, Config{Workers: 1, Dir: dir})
	requireNS(t, a)
	b := newTestPool(t, Config{Workers: 1, Dir: dir})
	aheadWarm(t, a, mounts)
	aheadWarm(t, b, mounts)
	code := `import os, sys
t = os.environ["TMPDIR"]
seen = sorted(os.listdir(t))
open(t + "/mine", "w").write("x")
open(os.environ["PYNOX_OUTPUTS"] + "/o-" + sys.argv[1] + ".txt", "w").write(sys.argv[1])
print(open("/data/f.txt").read(), seen)`
	check := func(p *Pool, who string, i int) {
		id := who + strconv.Itoa(i)
		res := run(t, p, Job{Mounts: mounts, Code: code, Args: []string{id}})
		requireOK(t, res)
		require.Equal(t, "hello ['outputs']\n", res.Stdout, id)
		require.True(t, strings.HasPrefix(res.Policy.Scratch, p.scratch.path+"/"), "%s: scratch %s not in its pool's %s", id, res.Policy.Scratch, p.scratch.path)
		require.Len(t, res.Files, 1, id)
		require.Equal(t, id, string(res.Files[0].Data), id)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 8 {
			check(a, "a", i)
		}
	}()
	for i := range 8 {
		check(b, "b", i)
	}
	wg.Wait()
	require.NoError(t, a.Close())
	for i := 8; i < 16; i++ {
		check(b, "b", i)
	}
	t.Logf("a %+v b %+v", aheadOf(a), aheadOf(b))
}

// TestHostileReview30ProfileGrants: jobs with the same mounts, some
// through a profile that adds a read grant of a host directory beside
// the mount (a bind of its own in the namespace), others without it:
// once either kind repeats and is attached ahead, a job without the
// grant never finds the granted directory in its namespace (a fresh one
// shows no such path), and a job with it reads it.
func TestHostileReview30ProfileGrants(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	dir := t.TempDir()
	outside := t.TempDir()
	g := filepath.Join(outside, "g")
	require.NoError(t, os.Mkdir(g, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(g, "s"), []byte("granted"), 0o644))
	p := newTestPool(t, Config{Workers: 1, Dir: dir, Limits: Limits{AllowRead: []string{dir, outside}},
		Profiles: map[string]Profile{"g": {AllowRead: []string{g}}}})
	requireNS(t, p)
	data := helloDataDir(t, dir)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	code := `import os
g = ` + strconv.Quote(g) + `
print(open("/data/f.txt").read(), os.path.lexists(g), open(g + "/s").read() if os.path.lexists(g) else "-")`
	for i := range 24 {
		prof := map[bool]string{true: "g", false: ""}[(i/3)%2 == 0]
		res := run(t, p, Job{Mounts: mounts, Profile: prof, Code: code})
		requireOK(t, res)
		want := "hello False -\n"
		if prof != "" {
			want = "hello True granted\n"
		}
		require.Equal(t, want, res.Stdout, "job %d (profile %q)", i, prof)
	}
	t.Logf("%+v", aheadOf(p))
}
