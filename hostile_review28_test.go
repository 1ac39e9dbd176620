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
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// Review 28: namespaces attached ahead (nsmount_ahead.go).

// r28NS is a job's own mount namespace as the host names it (its
// /proc/self/ns/mnt link), printed first by the probes below.
const r28NS = `import os
print("NS", os.readlink("/proc/self/ns/mnt"), flush=True)
`

func r28NSOf(t *testing.T, res *Result) string {
	t.Helper()
	for _, l := range strings.Split(res.Stdout, "\n") {
		if s, ok := strings.CutPrefix(l, "NS "); ok {
			return s
		}
	}
	t.Fatalf("no NS line in %q (stderr %q)", res.Stdout, res.Stderr)
	return ""
}

// Probe: a one-shot job in a namespace attached ahead leaves everything
// it can in its scratch directory (a deep tree, a directory it made
// unreadable and unwritable, a FIFO, a bound socket, a file of mode 0,
// hard links, a symlink to the mount, outputs) and changes the scratch
// directory itself (its mode, its extended attributes, its times); the
// next jobs of the same mounts, one of which runs in that very namespace
// once it came back, find a scratch directory as fresh as ever: only
// outputs, mode 0700, no user xattr.
func TestHostileReview28RecycledScratchLeftovers(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data := r13ProcPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	plant := r28NS + `import os, socket, stat
t = os.environ["TMPDIR"]
d = t
for i in range(120):
    d = os.path.join(d, "d")
    os.mkdir(d)
open(os.path.join(d, "deep"), "w").write("x")
os.mkdir(t + "/sub"); open(t + "/sub/f", "w").write("x")
for name, f in [("fifo", lambda: os.mkfifo(t + "/fifo")),
                ("sock", lambda: socket.socket(socket.AF_UNIX).bind(t + "/sock"))]:
    try:
        f()
    except OSError as e:
        pass
open(t + "/file", "w").write("x")
os.link(t + "/file", t + "/hard")
fd = os.open(t + "/unlinked", os.O_CREAT | os.O_RDWR); os.unlink(t + "/unlinked")
os.symlink("/data/f.txt", t + "/sym")
open(os.environ["PYNOX_OUTPUTS"] + "/o.txt", "w").write("planted")
res = []
for name, f in [("xattr", lambda: os.setxattr(t, "user.r28", b"x")),
                ("utime", lambda: os.utime(t, (1, 1))),
                ("chmod", lambda: os.chmod(t, 0o777))]:
    try:
        f(); res.append(name + "=ok")
    except OSError as e:
        res.append(name + "=" + str(e.errno))
print(" ".join(res))
`
	check := r28NS + `import os, stat
t = os.environ["TMPDIR"]
try:
    xs = os.listxattr(t)
except OSError as e:
    xs = "err%d" % e.errno
st = os.stat(t)
print(sorted(os.listdir(t)), oct(stat.S_IMODE(st.st_mode)), xs, st.st_mtime > 1000, sorted(os.listdir(os.environ["PYNOX_OUTPUTS"])))
`
	gen := func() uint64 {
		a := &p.ns.ahead
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.genLocked()
	}
	gen0 := gen()
	var planted string
	for range 6 {
		res := run(t, p, Job{Mounts: mounts, Code: plant})
		requireOK(t, res)
		t.Logf("plant: %s", res.Stdout)
		planted = r28NSOf(t, res)
		r0 := aheadOf(p).recycled
		time.Sleep(300 * time.Millisecond)
		t.Logf("recycled after the plant: %d -> %d", r0, aheadOf(p).recycled)
		same := false
		for range 6 {
			res := run(t, p, Job{Mounts: mounts, Code: check})
			requireOK(t, res)
			lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
			require.Equal(t, "['outputs'] 0o700 [] True []", lines[len(lines)-1], "a job found what the job before it left")
			same = same || r28NSOf(t, res) == planted
		}
		if same {
			t.Logf("a later job ran in the planting job's namespace %s: %+v", planted, aheadOf(p))
			requireScratchEmpty(t, p, "scratch left behind")
			return
		}
	}
	if gen() != gen0 {
		// Mounts made on the host meanwhile (other tests' pools) made the
		// namespaces ahead stale: the planting jobs' were dropped, not
		// reused. Every check above still held.
		t.Logf("inconclusive: the planting job's namespace was not reused (mount changes on the host meanwhile): %+v", aheadOf(p))
		return
	}
	t.Fatalf("no job ran in the planting job's namespace (%s) after it came back: %+v", planted, aheadOf(p))
}

// Probe: a job whose process sits in a namespace attached ahead holding
// one part, but which asks for another at the same or an overlapping
// path (a file where a directory was, a directory beneath the old one,
// the same source read-write where it was read-only, and read-only where
// it was read-write), gets exactly its own part through the mounter's
// reattach: the right object at the path, the right mode, and nothing of
// the old part.
func TestHostileReview28ReattachShapes(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data := r13ProcPool(t)
	dir := p.Config().Dir
	other := filepath.Join(dir, "other")
	require.NoError(t, os.Mkdir(other, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(other, "o.txt"), []byte("other"), 0o644))
	rw := filepath.Join(dir, "rw")
	require.NoError(t, os.Mkdir(rw, 0o755))
	ro := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	cases := []struct {
		name   string
		warm   []MountSpec
		mounts []MountSpec
		code   string
		want   string
	}{
		{"file where a dir was", ro, []MountSpec{{HostPath: filepath.Join(other, "o.txt"), Path: "/data", Mode: ReadOnly}},
			`import os; print(os.path.isfile("/data"), open("/data").read())`, "True other"},
		{"dir beneath the old dir", ro, []MountSpec{{HostPath: other, Path: "/data/sub", Mode: ReadOnly}},
			`import os; print(os.path.isdir("/data"), os.path.lexists("/data/f.txt"), sorted(os.listdir("/data/sub")))`, "True False ['o.txt']"},
		{"parent of the old dir", []MountSpec{{HostPath: data, Path: "/a/b/c", Mode: ReadOnly}}, []MountSpec{{HostPath: other, Path: "/a", Mode: ReadOnly}},
			`import os; print(sorted(os.listdir("/a")), os.path.lexists("/a/b"), os.path.lexists("/a/b/c/f.txt"))`, "['o.txt'] False False"},
		{"read-write where read-only was", []MountSpec{{HostPath: rw, Path: "/data", Mode: ReadOnly}}, []MountSpec{{HostPath: rw, Path: "/data", Mode: ReadWrite}},
			`open("/data/w", "w").write("w"); print("wrote")`, "wrote"},
		{"read-only where read-write was", []MountSpec{{HostPath: rw, Path: "/data", Mode: ReadWrite}}, []MountSpec{{HostPath: rw, Path: "/data", Mode: ReadOnly}},
			`import errno
try:
    open("/data/w2", "w").write("w"); print("wrote")
except OSError as e:
    print(errno.errorcode[e.errno])`, "EROFS"},
	}
	for _, c := range cases {
		pid := 0
		for range 10 {
			aheadWarm(t, p, c.warm)
			if q := nsSparePid(t, p.workers[0].live.Load()); r28HasMount(q, c.warm[0].Path) {
				pid = q
				break
			}
		}
		require.NotZero(t, pid, "%s: the ready ns spare never entered a namespace attached ahead", c.name)
		before := aheadOf(p)
		res := run(t, p, Job{Mounts: c.mounts, Code: `import os
print(os.readlink("/proc/self"))
` + c.code})
		requireOK(t, res)
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		require.Equal(t, strconv.Itoa(pid), lines[0], "%s: not run in the spare that entered the namespace ahead", c.name)
		require.Equal(t, c.want, lines[len(lines)-1], c.name)
		require.Equal(t, before.reattached+1, aheadOf(p).reattached, c.name)
	}
	_, err := os.Stat(filepath.Join(rw, "w2"))
	require.ErrorIs(t, err, os.ErrNotExist)
	requireScratchEmpty(t, p, "scratch left behind")
}

// r28SpareAhead is aheadSpare, but with other processes of the template
// in namespaces of their own (except).
func r28SpareAhead(t *testing.T, p *Pool, mounts []MountSpec, except ...int) int {
	t.Helper()
	for range 10 {
		aheadWarm(t, p, mounts)
		if pid := nsSparePid(t, p.workers[0].live.Load(), except...); r28HasMount(pid, mounts[0].Path) {
			return pid
		}
	}
	t.Fatalf("the ready ns spare never entered a namespace attached ahead: %+v", aheadOf(p))
	return 0
}

// r28HasMount says whether the process pid's namespace shows a mount at
// path.
func r28HasMount(pid int, path string) bool {
	for range 40 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
		if err == nil && strings.Contains(string(b), " "+path+" ") {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// r28Fds counts the open descriptors of the process pid.
func r28Fds(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	require.NoError(t, err)
	return len(ents)
}

// r28FdList lists what the process pid's descriptors name.
func r28FdList(t *testing.T, pid int) map[string]int {
	t.Helper()
	d := "/proc/" + strconv.Itoa(pid) + "/fd/"
	ents, err := os.ReadDir(d)
	require.NoError(t, err)
	out := map[string]int{}
	for _, e := range ents {
		l, _ := os.Readlink(d + e.Name())
		if i := strings.IndexByte(l, '['); i > 0 {
			l = l[:i]
		}
		out[l]++
	}
	return out
}

// r28Mounter returns the pid of p's mounter (the one mounter child of
// this process that was not there in before).
func r28Mounter(t *testing.T, before map[int]bool) int {
	t.Helper()
	var got []int
	for pid := range mounterPids(t) {
		if !before[pid] {
			got = append(got, pid)
		}
	}
	require.Len(t, got, 1, "expected one new mounter")
	return got[0]
}

// Probe (not parallel: it counts this process's descriptors): many mount
// jobs alternating between mount sets in pairs (each pair starts
// attaching ahead, the next set drops it; sessions among them), with
// reattaches in spares that entered a namespace ahead: afterwards the
// test process's descriptors, the mounter's and the pool's scratch
// directories are back where they were, and the ahead's counters say the
// paths ran.
func TestHostileReview28AlternatingNoLeak(t *testing.T) {
	testenv.Slow(t)
	before := mounterPids(t)
	p, data := r13ProcPool(t)
	dir := p.Config().Dir
	other := filepath.Join(dir, "other")
	require.NoError(t, os.Mkdir(other, 0o755))
	sets := [][]MountSpec{
		{{HostPath: data, Path: "/data", Mode: ReadOnly}},
		{{HostPath: other, Path: "/other", Mode: ReadOnly}},
		{{HostPath: data, Path: "/data", Mode: ReadOnly}, {HostPath: other, Path: "/w", Mode: Overlay}},
	}
	round := func(i int) {
		m := sets[i%len(sets)]
		for j := range 3 {
			if i%4 == 3 && j == 1 {
				co, err := p.Checkout(t.Context(), Job{Mounts: m})
				require.NoError(t, err)
				requireOK(t, feed(t, co, "import os; open(os.environ['TMPDIR'] + '/s', 'w').write('s')"))
				require.NoError(t, co.Finish(context.Background()))
				continue
			}
			requireOK(t, run(t, p, Job{Mounts: m, Code: "import os; open(os.environ['TMPDIR'] + '/x', 'w').write('x')"}))
		}
	}
	// settle leaves nothing attached ahead: single jobs, each asking for
	// other mounts than the one before (the last takes the namespace
	// ahead the ready ns spare may still sit in).
	settle := func() {
		for i := range 4 {
			requireOK(t, run(t, p, Job{Mounts: sets[i%2], Code: "pass"}))
		}
		require.False(t, aheadOf(p).active)
		time.Sleep(300 * time.Millisecond)
	}
	round(0)
	round(1)
	settle()
	mounter := r28Mounter(t, before)
	// What namespaces attached ahead hold: namespaces, scratch
	// directories, the sources (beneath the pool's directory).
	ours := func(pid int) int {
		n := 0
		for k, v := range r28FdList(t, pid) {
			if strings.HasPrefix(k, "mnt:") || strings.HasPrefix(k, "user:") || strings.HasPrefix(k, p.scratch.path) || strings.HasPrefix(k, dir) {
				n += v
			}
		}
		return n
	}
	self0, m0 := ours(os.Getpid()), ours(mounter)
	for i := range 8 {
		round(i)
	}
	settle()
	st := aheadOf(p)
	t.Logf("ahead %+v; descriptors %d (mounter %d)", st, self0, m0)
	require.Positive(t, st.took)
	require.Positive(t, st.reattached)
	requireScratchEmpty(t, p, "scratch left behind")
	var self1, m1 int
	ok := eventually(func() bool {
		self1, m1 = ours(os.Getpid()), ours(mounter)
		return self1 <= self0 && m1 <= m0
	})
	require.True(t, ok, "descriptors grew: test process %d -> %d, mounter %d -> %d", self0, self1, m0, m1)
}

// Probe (not parallel: it counts this process's descriptors): Close while
// namespaces are being attached ahead, taken and recycled by jobs running
// at once: every Run returns, and afterwards the pool's mounter is gone,
// its scratch root removed, and the test process holds no more
// descriptors than before the pool.
func TestHostileReview28CloseDuringFill(t *testing.T) {
	testenv.Slow(t)
	for round := range 3 {
		before := mounterPids(t)
		fds0 := r28Fds(t, os.Getpid())
		dir := t.TempDir()
		p, err := New(Config{Workers: 2, Dir: dir})
		require.NoError(t, err)
		requireNS(t, p)
		data := filepath.Join(dir, "data")
		require.NoError(t, os.Mkdir(data, 0o755))
		mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
		scratch := p.scratch.path
		aheadWarm(t, p, mounts)
		mounter := r28Mounter(t, before)
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; ; j++ {
					_, err := p.Run(context.Background(), Job{Mounts: mounts, Code: "pass"})
					if err != nil {
						return
					}
					if j > 50 {
						t.Errorf("worker %d: still running", i)
						return
					}
				}
			}()
		}
		time.Sleep(time.Duration(100+150*round) * time.Millisecond)
		require.NoError(t, p.Close())
		wg.Wait()
		require.True(t, eventually(func() bool { return unix.Kill(mounter, 0) != nil }), "the mounter outlived Close")
		_, err = os.Stat(scratch)
		require.ErrorIs(t, err, os.ErrNotExist, "the scratch root outlived Close")
		var fds1 int
		require.True(t, eventually(func() bool { fds1 = r28Fds(t, os.Getpid()); return fds1 <= fds0 }),
			"round %d: descriptors grew %d -> %d", round, fds0, fds1)
	}
}

// Probe: a session whose processes take namespaces attached ahead (its
// first, and its replacement after a crash): state stays within a
// process, the replacement starts with an empty scratch directory, and
// each step's outputs are reported by that step (the outputs watch
// follows the scratch directory the session took over).
func TestHostileReview28SessionAhead(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data := r13ProcPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	spare := aheadSpare(t, p, mounts)
	t.Logf("spare %d", spare)
	before := aheadOf(p)
	co, err := p.Checkout(t.Context(), Job{Mounts: mounts})
	require.NoError(t, err)
	defer co.Finish(context.Background())
	res := feed(t, co, `import os
t = os.environ["TMPDIR"]
open(t + "/state", "w").write("1")
open(os.environ["PYNOX_OUTPUTS"] + "/a.txt", "w").write("a")
print(t, sorted(os.listdir(t)))`)
	requireOK(t, res)
	t.Logf("session pid %d; ahead %+v -> %+v", co.Pid(), before, aheadOf(p))
	got := aheadOf(p)
	require.Equal(t, 1, got.took-before.took+got.reattached-before.reattached, "the session's process did not run in the namespace ahead")
	first := strings.Fields(res.Stdout)[0]
	require.Len(t, res.Files, 1)
	require.Equal(t, "a", string(res.Files[0].Data))
	res = feed(t, co, `import os; print(os.listdir(os.environ["TMPDIR"]).count("state"), open("/data/f.txt").read())`)
	requireOK(t, res)
	require.Equal(t, "1 hello\n", res.Stdout)
	require.Empty(t, res.Files)
	// The replacement: the template's ready ns spare entered a namespace
	// ahead again by now.
	sessionPid := co.Pid()
	r28SpareAhead(t, p, mounts, sessionPid)
	res = feed(t, co, `import os, signal; os.kill(os.getpid(), signal.SIGKILL)`)
	require.NotNil(t, res.Error)
	r28SpareAhead(t, p, mounts, sessionPid)
	mid := aheadOf(p)
	res = feed(t, co, `import os
t = os.environ["TMPDIR"]
print(t, sorted(os.listdir(t)), os.environ["PYNOX_OUTPUTS"] == t + "/outputs")
open(os.environ["PYNOX_OUTPUTS"] + "/b.txt", "w").write("b")`)
	requireOK(t, res)
	t.Logf("first %s then %s; ahead %+v -> %+v", first, res.Stdout, mid, aheadOf(p))
	f := strings.Fields(res.Stdout)
	require.Equal(t, []string{"['outputs']", "True"}, f[1:])
	require.Len(t, res.Files, 1, "the replacement's output was not reported")
	require.Equal(t, "b", string(res.Files[0].Data))
	res = feed(t, co, `import os
open(os.environ["PYNOX_OUTPUTS"] + "/c.txt", "w").write("c")`)
	requireOK(t, res)
	require.Len(t, res.Files, 1, "a later step's output was not reported")
	require.Equal(t, "c", string(res.Files[0].Data))
	require.NoError(t, co.Finish(context.Background()))
	requireScratchEmpty(t, p, "scratch left behind")
}

// Probe: the host changes the source after namespaces were attached
// ahead in ways the names do not show: the directory deleted and made
// again (the same name; on some file systems the same inode number),
// the same directory reached through a read-only bind mount of it, and
// a path component swapped for a symlink to where it went. Each job sees
// what a fresh attach would show it.
func TestHostileReview28SourceSwaps(t *testing.T) {
	// Not parallel: its mounts on the host make every pool's namespaces
	// ahead stale, which tests counting takes do not expect.
	p, data, _ := nsPool(t)
	dir := p.Config().Dir
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadWrite}}
	aheadWarm(t, p, mounts)
	// Deleted and made again.
	require.NoError(t, os.RemoveAll(data))
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("again"), 0o644))
	res := run(t, p, Job{Mounts: mounts, Code: `print(open("/data/f.txt").read())`})
	requireOK(t, res)
	require.Equal(t, "again\n", res.Stdout)
	// The same directory through a read-only bind mount.
	aheadWarm(t, p, mounts)
	robind := filepath.Join(dir, "robind")
	require.NoError(t, os.Mkdir(robind, 0o755))
	if err := unix.Mount(data, robind, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind mount (%v)", err)
	}
	defer unix.Unmount(robind, unix.MNT_DETACH)
	require.NoError(t, unix.Mount("", robind, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""))
	aheadWarm(t, p, mounts) // stale after the host's mounts: attached again
	res = run(t, p, Job{Mounts: []MountSpec{{HostPath: robind, Path: "/data", Mode: ReadWrite}}, Code: `import errno
try:
    open("/data/w", "w").write("w"); print("wrote")
except OSError as e:
    print(errno.errorcode[e.errno])`})
	requireOK(t, res)
	require.Equal(t, "EROFS\n", res.Stdout, "the job wrote through a read-only bind mount of the source")
	// A path component swapped for a symlink: the request resolves to
	// the same directory (or is refused), never to something else.
	nested := filepath.Join(dir, "n1", "data")
	require.NoError(t, os.MkdirAll(nested, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(nested, "f.txt"), []byte("n1"), 0o644))
	nm := []MountSpec{{HostPath: nested, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, nm)
	require.NoError(t, os.Rename(filepath.Join(dir, "n1"), filepath.Join(dir, "n2")))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "n3", "data"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "n3", "data", "f.txt"), []byte("n3"), 0o644))
	require.NoError(t, os.Symlink("n3", filepath.Join(dir, "n1")))
	res = run(t, p, Job{Mounts: nm, Code: `print(open("/data/f.txt").read())`})
	if res.Error == nil {
		require.Equal(t, "n3\n", res.Stdout, "the job saw the directory its request no longer names")
	} else {
		t.Logf("refused: %v", res.Error)
	}
}

// Finding: a job's collect patterns beneath $TMPDIR are resolved when its
// request is accepted, to the scratch directory the pool made for it;
// a job that takes a namespace attached ahead takes over that
// namespace's scratch directory instead (swapScratch), and its patterns
// must follow: the files it leaves at $TMPDIR/... are its result's.
func TestHostileReview28CollectFollowsScratch(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	before := aheadOf(p)
	for i := range 4 {
		res := run(t, p, Job{Mounts: mounts, Collect: []string{"$TMPDIR/*.csv"}, Code: `import os, sys
open(os.path.join(os.environ["TMPDIR"], "r%s.csv" % sys.argv[1]), "w").write(sys.argv[1])
print(os.environ["TMPDIR"])`, Args: []string{strconv.Itoa(i)}})
		requireOK(t, res)
		dir := strings.TrimSpace(res.Stdout)
		require.Len(t, res.Files, 1, "job %d: the file it left at $TMPDIR/r%d.csv was not collected (%+v)", i, i, aheadOf(p))
		require.Equal(t, dir+"/r"+strconv.Itoa(i)+".csv", res.Files[0].Path)
		require.Equal(t, strconv.Itoa(i), string(res.Files[0].Data))
	}
	require.Positive(t, aheadOf(p).took-before.took)
}

// Finding: the scratch directory the pool made for a job that then took
// a namespace attached ahead is emptied and kept for the next job (any
// tenant's); the first job's collect patterns beneath $TMPDIR, left
// naming it, collected what the next job wrote there.
func TestHostileReview28CollectOtherTenant(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	requireNS(t, p)
	data := filepath.Join(p.Config().Dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	taken := 0
	for attempt := 0; attempt < 6 && taken < 2; attempt++ {
		aheadWarm(t, p, mounts)
		took := aheadOf(p).took
		ares := make(chan *Result, 1)
		go func() {
			ares <- run(t, p, Job{Mounts: mounts, Collect: []string{"$TMPDIR/*.csv"}, Code: `import time; time.sleep(0.6)`})
		}()
		// Job A is running (and released the scratch directory it was
		// made) once it took its namespace; a namespace ahead made stale
		// by another test's mounts is not taken (then try again).
		deadline := time.Now().Add(400 * time.Millisecond)
		for aheadOf(p).took == took && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if aheadOf(p).took == took {
			requireOK(t, <-ares)
			continue
		}
		taken++
		time.Sleep(100 * time.Millisecond)
		bres := make(chan *Result, 1)
		go func() {
			bres <- run(t, p, Job{Code: `import os, time
open(os.path.join(os.environ["TMPDIR"], "secret.csv"), "w").write("tenant B")
print(os.environ["TMPDIR"], flush=True)
time.sleep(0.9)`})
		}()
		a := <-ares
		b := <-bres
		requireOK(t, a)
		requireOK(t, b)
		for _, f := range a.Files {
			require.NotEqual(t, "tenant B", string(f.Data), "job A's result holds job B's file %s (B's TMPDIR %s)", f.Path, strings.TrimSpace(b.Stdout))
		}
	}
	require.Positive(t, taken, "job A never took a namespace attached ahead")
}

// Probe: the reattach removes the mountpoints the part held before, and
// the directories above them it left empty; never the namespace's own
// entries, such as the pool's working directory (an empty directory of
// the base, where each job starts): a job whose spare entered a namespace
// ahead holding a grant at (or beneath) the working directory, and which
// asks for other mounts, still starts in its working directory; the old
// part's names (its grant's mountpoint, its scratch directory's) are
// gone.
func TestHostileReview28ReattachKeepsWorkdir(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data := r13ProcPool(t)
	dir := p.Config().Dir
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rel.txt"), []byte("rel"), 0o644))
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	for _, grant := range []string{dir, data} {
		warm := Job{Mounts: mounts, AllowRead: []string{grant}, Code: "pass"}
		pid := 0
		for range 10 {
			for range 3 {
				requireOK(t, run(t, p, warm))
			}
			time.Sleep(50 * time.Millisecond)
			if q := nsSparePid(t, p.workers[0].live.Load()); r28HasMount(q, grant) {
				pid = q
				break
			}
		}
		require.NotZero(t, pid, "the ready ns spare never entered a namespace attached ahead holding %s", grant)
		// The namespace ahead's own scratch directory, which the
		// reattach detaches and whose name it removes.
		mi, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
		require.NoError(t, err)
		aheadScratch := ""
		for _, l := range strings.Split(string(mi), "\n") {
			if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], p.scratch.path+"/") {
				aheadScratch = f[4]
			}
		}
		require.NotEmpty(t, aheadScratch, "no scratch directory in the namespace ahead")
		before := aheadOf(p)
		res := run(t, p, Job{Mounts: mounts, Code: `import os
print(os.readlink("/proc/self"), os.getcwd(), os.path.isdir(` + pyQuote(dir) + `), os.path.lexists(` + pyQuote(aheadScratch) + `), os.path.lexists(` + pyQuote(grant) + `))`})
		requireOK(t, res)
		require.Equal(t, before.reattached+1, aheadOf(p).reattached, "grant %s: no reattach", grant)
		want := fmt.Sprintf("%d %s True False %s\n", pid, dir, map[bool]string{true: "True", false: "False"}[grant == dir])
		require.Equal(t, want, res.Stdout, "grant %s: the job did not start in its working directory, or saw the old part's names (scratch %s)", grant, aheadScratch)
	}
}

// Probe: two tenants whose jobs mount different host directories at the
// same path, run at once on two workers in runs of various lengths (so
// that the pool keeps starting and dropping namespaces ahead, and spares
// sitting in one tenant's are reattached for the other's): every job
// sees its own tenant's directory and its own empty scratch directory.
func TestHostileReview28TwoTenantsSamePath(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	requireNS(t, p)
	dir := p.Config().Dir
	src := map[string]string{}
	for _, who := range []string{"A", "B"} {
		d := filepath.Join(dir, who)
		require.NoError(t, os.Mkdir(d, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, "who"), []byte(who), 0o644))
		src[who] = d
	}
	pattern := "AAABBABBBAAAABABBAAB"
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	for lane := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range pattern {
				who := string(pattern[(i+lane*3)%len(pattern)])
				res := run(t, p, Job{Mounts: []MountSpec{{HostPath: src[who], Path: "/data", Mode: ReadOnly}}, Code: `import os
t = os.environ["TMPDIR"]
first = sorted(os.listdir(t))
open(t + "/mine", "w").write("x")
print(open("/data/who").read(), first)`})
				if res.Error != nil || res.Stdout != who+" ['outputs']\n" {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("lane %d job %d (%s): %v %q %q", lane, i, who, res.Error, res.Stdout, res.Stderr))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("ahead %+v", aheadOf(p))
	require.Empty(t, errs)
	requireScratchEmpty(t, p, "scratch left behind")
}

// Probe: an overlay attached ahead shows the host directory beneath it
// as it is when the job runs, not as it was when the overlay was
// attached: files added, changed and removed on the host since.
func TestHostileReview28OverlayLowerChanged(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/work", Mode: Overlay}}
	took := 0
	for i := range 4 {
		aheadWarm(t, p, mounts)
		time.Sleep(50 * time.Millisecond)
		name := "added-" + strconv.Itoa(i)
		require.NoError(t, os.WriteFile(filepath.Join(data, name), []byte(name), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("v"+strconv.Itoa(i)), 0o644))
		if i > 0 {
			require.NoError(t, os.Remove(filepath.Join(data, "added-"+strconv.Itoa(i-1))))
		}
		before := aheadOf(p)
		res := run(t, p, Job{Mounts: mounts, Code: `import os
print(sorted(os.listdir("/work")), open("/work/f.txt").read())`})
		requireOK(t, res)
		require.Equal(t, fmt.Sprintf("['%s', 'f.txt', 'fifo'] v%d\n", name, i), res.Stdout, "round %d (%+v -> %+v)", i, before, aheadOf(p))
		took += aheadOf(p).took - before.took
	}
	require.Positive(t, took, "no job took a namespace attached ahead")
}

// Probe (review 28's finding, fixed): a host file system whose directory
// the pool's mount jobs kept asking for can be unmounted (not lazily)
// once the pool stopped attaching ahead: the clones in the namespaces
// ahead do not make the unmount busy. A ready ns spare that had entered
// a namespace ahead kept it, and the file system's contents with it,
// until its next job came, however long the pool then idled: the pool
// now replaces such a spare when it goes idle, and the contents are gone
// from every process of the pool.
func TestHostileReview28IdleSourcePinned(t *testing.T) {
	testenv.Slow(t)
	// Not parallel: its mounts on the host make every pool's namespaces
	// ahead stale, which tests counting takes do not expect.
	p, _ := r13ProcPool(t)
	p.ns.ahead.mu.Lock()
	p.ns.ahead.idleAfter = 300 * time.Millisecond
	p.ns.ahead.mu.Unlock()
	vol := filepath.Join(p.Config().Dir, "vol")
	require.NoError(t, os.Mkdir(vol, 0o755))
	if err := unix.Mount("pynox-r28", vol, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs for the test (%v)", err)
	}
	mounted := true
	defer func() {
		if mounted {
			unix.Unmount(vol, unix.MNT_DETACH)
		}
	}()
	require.NoError(t, os.WriteFile(filepath.Join(vol, "f.txt"), []byte("vol"), 0o644))
	mounts := []MountSpec{{HostPath: vol, Path: "/data", Mode: ReadOnly}}
	pid := 0
	for range 10 {
		for range 3 {
			requireOK(t, run(t, p, Job{Mounts: mounts, Code: "pass"}))
		}
		if q := nsSparePid(t, p.workers[0].live.Load()); r28HasMount(q, "/data") {
			pid = q
			break
		}
	}
	require.NotZero(t, pid, "the ready ns spare never entered a namespace attached ahead")
	require.True(t, eventually(func() bool { s := aheadOf(p); return !s.active && s.ready == 0 }), "still attaching ahead: %+v", aheadOf(p))
	var err error
	ok := eventually(func() bool {
		err = unix.Unmount(vol, 0)
		return err == nil
	})
	if ok {
		mounted = false
	}
	require.True(t, ok, "the host's file system could not be unmounted after the pool stopped attaching ahead (%v): the ready ns spare %d still holds a namespace ahead (%v)", err, pid, r28HasMount(pid, "/data"))
	// The spare that sat in a namespace ahead was replaced; its
	// replacement sits in a leased namespace, which shows no job's mount.
	require.True(t, eventually(func() bool { return !processAlive(pid) }), "the ready ns spare %d still lives in its namespace ahead", pid)
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/root/data/f.txt")
	require.Error(t, err, "the unmounted file system's file is still readable through the spare: %q", b)
	q := nsSparePid(t, p.workers[0].live.Load(), pid)
	require.False(t, r28HasMount(q, "/data"), "the new ready ns spare %d shows the old part", q)
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: p.Config().Dir, Path: "/d"}}, Code: "pass"}))
}

const r28SelfConfineEnv = "PYNOX_R28_SELFCONFINE"

// Probe: in a pool that confines itself (shared root with slots, its own
// scratch tmpfs), namespaces are attached ahead, taken and recycled, and
// a job asking for other mounts than the namespace ahead its spare
// entered gets them (the mounter's reattach), with nothing of the old
// part; the jobs' scratch directories are fresh.
func TestHostileReview28SelfConfined(t *testing.T) {
	testenv.Slow(t)
	dir, child := nsChildProcess(t, r28SelfConfineEnv)
	if !child {
		return
	}
	p := selfConfinedPool(t, dir, 1, "/proc")
	requireNS(t, p)
	data := helloDataDir(t, dir)
	other := filepath.Join(dir, "other")
	require.NoError(t, os.Mkdir(other, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(other, "o.txt"), []byte("other"), 0o644))
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	reattached := 0
	for round := range 6 {
		aheadWarm(t, p, mounts)
		before := aheadOf(p)
		res := run(t, p, Job{Mounts: mounts, Code: aheadJobCode, Args: []string{"x"}})
		requireOK(t, res)
		require.Contains(t, res.Stdout, "['outputs'] True True\n")
		aheadWarm(t, p, mounts)
		time.Sleep(100 * time.Millisecond) // the ready ns spare enters one
		mid := aheadOf(p)
		res = run(t, p, Job{Mounts: []MountSpec{{HostPath: other, Path: "/o/p", Mode: ReadOnly}}, Code: `import os
print(os.path.lexists("/data"), open("/o/p/o.txt").read(), sorted(os.listdir(os.environ["TMPDIR"])))`})
		requireOK(t, res)
		require.Equal(t, "False other ['outputs']\n", res.Stdout, "round %d", round)
		after := aheadOf(p)
		t.Logf("round %d: %+v -> %+v", round, before, after)
		require.Positive(t, after.took-before.took)
		reattached += after.reattached - mid.reattached
	}
	require.Positive(t, reattached, "no job was reattached")
}

// Probe: the pool's idle expiry firing all the time (every few
// tens of milliseconds) while jobs on two workers take, recycle and reattach
// namespaces ahead, and the mount set changes now and then: every job
// sees its own mounts and a fresh scratch directory, and nothing is left
// in the scratch root afterwards.
func TestHostileReview28IdleChurn(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	requireNS(t, p)
	p.ns.ahead.mu.Lock()
	p.ns.ahead.idleAfter = 25 * time.Millisecond
	p.ns.ahead.mu.Unlock()
	dir := p.Config().Dir
	src := map[string]string{}
	for _, who := range []string{"A", "B"} {
		d := filepath.Join(dir, who)
		require.NoError(t, os.Mkdir(d, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, "who"), []byte(who), 0o644))
		src[who] = d
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	for lane := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 14 {
				time.Sleep(time.Duration((i*7+lane*11)%30) * time.Millisecond)
				who := map[bool]string{true: "A", false: "B"}[(i/5+lane)%3 != 0]
				res := run(t, p, Job{Mounts: []MountSpec{{HostPath: src[who], Path: "/data", Mode: ReadOnly}}, Code: `import os
t = os.environ["TMPDIR"]
first = sorted(os.listdir(t))
open(t + "/mine", "w").write("x")
print(open("/data/who").read(), first)`})
				if res.Error != nil || res.Stdout != who+" ['outputs']\n" {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("lane %d job %d (%s): %v %q %q", lane, i, who, res.Error, res.Stdout, res.Stderr))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("ahead %+v", aheadOf(p))
	require.Empty(t, errs)
	requireScratchEmpty(t, p, "scratch left behind")
}

// Probe: a mount at a path beneath one of the host's top-level symbolic
// links (which every namespace shows as the host has them), asked for by
// a job whose spare entered a namespace ahead holding another part: the
// job is served as a fresh attach would serve it (or refused the same
// way), and the next job's namespace is intact.
func TestHostileReview28ReattachUnderHostLink(t *testing.T) {
	t.Parallel()
	var link string
	for _, l := range []string{"/lib", "/bin", "/sbin", "/lib64"} {
		if fi, err := os.Lstat(l); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			link = l
			break
		}
	}
	if link == "" {
		t.Skip("no top-level symbolic link on this host")
	}
	p, data := r13ProcPool(t)
	other := []MountSpec{{HostPath: data, Path: link + "/r28-x", Mode: ReadOnly}}
	fresh := run(t, p, Job{Mounts: other, Code: `print(open(` + pyQuote(link+"/r28-x/f.txt") + `).read())`})
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadSpare(t, p, mounts)
	res := run(t, p, Job{Mounts: other, Code: `print(open(` + pyQuote(link+"/r28-x/f.txt") + `).read())`})
	t.Logf("fresh: %v %q; after ahead: %v %q", fresh.Error, fresh.Stdout, res.Error, res.Stdout)
	require.Equal(t, fresh.Error == nil, res.Error == nil)
	require.Equal(t, fresh.Stdout, res.Stdout)
	res = run(t, p, Job{Mounts: mounts, Code: `import os; print(open("/data/f.txt").read(), os.path.isdir(` + pyQuote(link+"/") + `))`})
	requireOK(t, res)
	require.Equal(t, "hello True\n", res.Stdout)
}
