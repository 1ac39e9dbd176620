package pynox

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// scratchEntries lists what the pool's scratch directories hold (they are
// kept, empty, for the next jobs).
func scratchEntries(t *testing.T, p *Pool) []string {
	t.Helper()
	var names []string
	require.NoError(t, filepath.WalkDir(p.scratch.path, func(path string, d os.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // being removed as we look
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(p.scratch.path, path)
		if strings.Count(rel, "/") > 0 || (rel != "." && !d.IsDir()) || (rel != "." && !strings.HasPrefix(rel, "j")) {
			names = append(names, rel)
		}
		return nil
	}))
	return names
}

// requireScratchEmpty waits until the pool's scratch directories are empty
// (a job's is emptied once its process is reported gone).
func requireScratchEmpty(t *testing.T, p *Pool, msg string) {
	t.Helper()
	var left []string
	require.Eventually(t, func() bool {
		left = scratchEntries(t, p)
		return len(left) == 0
	}, 20*time.Second, 10*time.Millisecond, "%s: %v", msg, left)
}

// A job with no grants at all has a private TMPDIR (and HOME): tempfile,
// pandas.to_csv and plain files work there, nobody else may use it, and it
// is gone when the job is.
func TestScratchJobWithoutGrants(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	res := run(t, p, Job{Code: `
import os, stat, tempfile
d = os.environ["TMPDIR"]
assert os.environ["HOME"] == d, os.environ["HOME"]
assert tempfile.gettempdir() == d, tempfile.gettempdir()
with tempfile.NamedTemporaryFile("w", delete=False) as f:
    f.write("hello")
assert os.path.dirname(f.name) == d
with tempfile.TemporaryDirectory() as td:
    open(os.path.join(td, "x"), "w").write("y")
print(d)
print(oct(stat.S_IMODE(os.stat(d).st_mode)))
try:
    open(os.path.join(os.path.dirname(d), "beside"), "w")
    print("parent writable")
except PermissionError:
    print("parent denied")
try:
    os.listdir(os.path.dirname(d))
    print("parent listed")
except PermissionError:
    print("parent unlisted")
`})
	requireOK(t, res)
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	require.Equal(t, []string{"0o700", "parent denied", "parent unlisted"}, lines[1:])
	dir := lines[0]
	require.Equal(t, p.scratch.path, filepath.Dir(dir))
	require.Equal(t, dir, res.Policy.Scratch)
	requireScratchEmpty(t, p, "the scratch directory's contents outlived its job")
}

// pandas writes a CSV to TMPDIR in a job without grants (the issue's
// example of real code that needs scratch space).
func TestScratchPandas(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	res := run(t, p, Job{Code: `
try:
    import pandas as pd
except ImportError:
    print("no pandas")
    raise SystemExit(0)
import os
path = os.path.join(os.environ["TMPDIR"], "out.csv")
pd.DataFrame({"a": [1, 2, 3]}).to_csv(path, index=False)
print(pd.read_csv(path)["a"].sum())
`})
	requireOK(t, res)
	if strings.TrimSpace(res.Stdout) == "no pandas" {
		t.Skip("pandas is not installed for " + testPython())
	}
	require.Equal(t, "6\n", res.Stdout)
}

// Two jobs running at once each have their own scratch directory and
// cannot list, read or write the other's.
func TestScratchTwoConcurrentJobs(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	shared := filepath.Join(p.Config().Dir, "shared")
	require.NoError(t, os.Mkdir(shared, 0o755))
	// a leaves a secret in its scratch, tells b where, and waits for b.
	a := `
import os, time
d = os.environ["TMPDIR"]
open(os.path.join(d, "secret"), "w").write("s3cr3t-a")
open(os.path.join(SHARED, "a.path.tmp"), "w").write(d)
os.rename(os.path.join(SHARED, "a.path.tmp"), os.path.join(SHARED, "a.path"))
for _ in range(3000):
    if os.path.exists(os.path.join(SHARED, "b.done")):
        break
    time.sleep(0.01)
else:
    raise SystemExit("b never finished")
print(open(os.path.join(d, "secret")).read())
print(sorted(os.listdir(d)))
`
	b := `
import os, time
for _ in range(3000):
    if os.path.exists(os.path.join(SHARED, "a.path")):
        break
    time.sleep(0.01)
else:
    raise SystemExit("a never started")
other = open(os.path.join(SHARED, "a.path")).read()
mine = os.environ["TMPDIR"]
print(other != mine)
for what, f in [("list", lambda: os.listdir(other)),
                ("read", lambda: open(os.path.join(other, "secret")).read()),
                ("write", lambda: open(os.path.join(other, "planted"), "w").write("x")),
                ("chmod", lambda: os.chmod(other, 0o777))]:
    try:
        f()
        print(what, "allowed")
    except PermissionError:
        print(what, "denied")
open(os.path.join(SHARED, "b.done"), "w").close()
`
	prefix := "SHARED = " + pyQuote(shared) + "\n"
	grant := []string{shared}
	var wg sync.WaitGroup
	var ra, rb *Result
	wg.Add(2)
	go func() { defer wg.Done(); ra = run(t, p, Job{Code: prefix + a, AllowWrite: grant}) }()
	go func() { defer wg.Done(); rb = run(t, p, Job{Code: prefix + b, AllowWrite: grant}) }()
	wg.Wait()
	requireOK(t, ra)
	requireOK(t, rb)
	require.Equal(t, "s3cr3t-a\n['outputs', 'secret']\n", ra.Stdout) // outputs: its $PYNOX_OUTPUTS
	require.Equal(t, "True\nlist denied\nread denied\nwrite denied\nchmod denied\n", rb.Stdout)
	require.NotEqual(t, ra.Policy.Scratch, rb.Policy.Scratch)
	requireScratchEmpty(t, p, "scratch left behind")
}

// A job that makes its scratch as awkward as it can — permissions taken
// away, symlinks out of it (to a directory the host cares about, whose
// names match the scratch's), a FIFO, hard links, deep nesting — leaves
// nothing behind, and the pool follows none of its links.
func TestScratchRemovedAfterHostileJob(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	victim := t.TempDir()
	for _, n := range []string{"keep", "a", "deep"} {
		require.NoError(t, os.WriteFile(filepath.Join(victim, n), []byte("precious"), 0o644))
	}
	require.NoError(t, os.Mkdir(filepath.Join(victim, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(victim, "sub", "keep"), []byte("precious"), 0o644))
	res := run(t, p, Job{Code: `
import os
VICTIM = ` + pyQuote(victim) + `
d = os.environ["TMPDIR"]
os.chdir(d)
os.makedirs("a/b/c")
for n in ("keep", "a/keep", "a/b/keep", "a/b/c/keep"):
    open(n, "w").write("x")
os.symlink(VICTIM, "a/b/c/sub")           # a directory outside, by absolute path
os.symlink(VICTIM + "/keep", "a/keep2")   # a file outside
os.symlink("../../../../../../../../" + VICTIM, "a/rel")
os.symlink("a", "loop"); os.symlink("loop2", "loop2")
try:
    os.mkfifo("fifo")                    # seccomp denies mknod today
except PermissionError:
    pass
os.link("keep", "a/b/hard")
p = "deep"
for i in range(80):                      # deeper than the remover descends
    p = os.path.join(p, "d")
os.makedirs(p)
open(os.path.join(p, "leaf"), "w").write("x")
os.symlink(VICTIM, os.path.join(p, "out"))
for path, mode in (("a/b/c", 0), ("a/b", 0o500), ("a", 0o100), (d, 0o500)):
    try:                                 # seccomp denies chmod today
        os.chmod(path, mode)
    except PermissionError:
        pass
print("ok")
`})
	requireOK(t, res)
	require.Equal(t, "ok\n", res.Stdout)
	requireScratchEmpty(t, p, "scratch left behind")
	for _, n := range []string{"keep", "a", "deep", "sub/keep"} {
		b, err := os.ReadFile(filepath.Join(victim, n))
		require.NoError(t, err, "%s was removed through a link the job planted", n)
		require.Equal(t, "precious", string(b))
	}
}

// A session keeps its scratch between steps and loses it when it ends.
func TestScratchSession(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	ev, err := c.Feed(ctx, Step{Code: "import os\nd = os.environ['TMPDIR']\nopen(os.path.join(d, 'f'), 'w').write('kept')\nprint(d)"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	dir := strings.TrimSpace(ev.Result.Stdout)
	require.Equal(t, dir, ev.Result.Policy.Scratch)
	ev, err = c.Feed(ctx, Step{Code: "print(open(os.path.join(d, 'f')).read())"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "kept\n", ev.Result.Stdout)
	require.DirExists(t, dir)
	require.NoError(t, c.Finish(ctx))
	require.NoFileExists(t, filepath.Join(dir, "f"))
	requireScratchEmpty(t, p, "scratch left behind")
}

// The request's env may name TMPDIR and HOME itself.
func TestScratchEnvOverride(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	res := run(t, p, Job{Env: map[string]string{"HOME": "/nonexistent"}, Code: "import os\nprint(os.environ['HOME'], os.environ['TMPDIR'] != '/nonexistent')"})
	requireOK(t, res)
	require.Equal(t, "/nonexistent True\n", res.Stdout)
}

// No grant may cover the pool's scratch directory (it holds other jobs'
// scratch) or lie beneath it, whatever field names it; and the scratch
// directory goes with the pool.
func TestScratchGrantsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := newTestPool(t, Config{Workers: 1, Dir: dir, ScratchDir: filepath.Join(dir)})
	root := p.scratch.path
	require.True(t, strings.HasPrefix(root, dir+"/"))
	inside := filepath.Join(root, "j999")
	require.NoError(t, os.Mkdir(inside, 0o700))
	for name, job := range map[string]Job{
		"allow_read covers":  {AllowRead: []string{dir}},
		"allow_read beneath": {AllowRead: []string{inside}},
		"allow_write covers": {AllowWrite: []string{dir}},
		"package_dirs":       {PackageDirs: []string{root}},
		"ro mount":           {Mounts: []MountSpec{{HostPath: dir}}},
		"rw mount beneath":   {Mounts: []MountSpec{{HostPath: inside, Mode: ReadWrite}}},
	} {
		job.Code = "print(1)"
		res := run(t, p, job)
		requireErrorType(t, res, "RequestError")
		require.Contains(t, res.Error.Message, "scratch directory", name)
	}
	require.NoError(t, os.Remove(inside))
	require.NoError(t, p.Close())
	require.NoDirExists(t, root)
}

// The remover, on its own: it removes a tree with links out of it (to a
// directory whose names match the tree's), directories without
// permissions and nesting deeper than it descends, and follows nothing.
func TestScratchRemover(t *testing.T) {
	t.Parallel()
	s, err := newScratchRoot(t.TempDir())
	require.NoError(t, err)
	victim := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(victim, "a", "b"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(victim, "a", "b", "f"), []byte("precious"), 0o644))
	name, fd, err := s.create()
	require.NoError(t, err)
	require.NoError(t, unix.Close(fd))
	d := s.dir(name)
	require.NoError(t, os.MkdirAll(filepath.Join(d, "a", "b"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(d, "a", "b", "f"), nil, 0o644))
	require.NoError(t, os.Symlink(victim, filepath.Join(d, "out")))
	require.NoError(t, os.Symlink(filepath.Join(victim, "a"), filepath.Join(d, "a", "b", "a")))
	deep := d
	for range 3 * scratchDepth {
		deep = filepath.Join(deep, "d")
		require.NoError(t, os.Mkdir(deep, 0o755))
	}
	require.NoError(t, os.Symlink(victim, filepath.Join(deep, "out")))
	require.NoError(t, unix.Mkfifo(filepath.Join(d, "fifo"), 0o600))
	require.NoError(t, os.Chmod(filepath.Join(d, "a", "b"), 0))
	require.NoError(t, os.Chmod(filepath.Join(d, "a"), 0o100))
	require.NoError(t, s.release(name))
	ents, err := os.ReadDir(s.path)
	require.NoError(t, err)
	require.Len(t, ents, 1, "only the emptied directory, kept for reuse")
	ents, err = os.ReadDir(d)
	require.NoError(t, err)
	require.Empty(t, ents)
	again, fd, err := s.create()
	require.NoError(t, err)
	require.NoError(t, unix.Close(fd))
	require.Equal(t, name, again, "the emptied directory is reused")
	require.NoError(t, os.WriteFile(filepath.Join(d, "x"), nil, 0o600))
	require.NoError(t, s.remove(name))
	require.NoDirExists(t, d)
	b, err := os.ReadFile(filepath.Join(victim, "a", "b", "f"))
	require.NoError(t, err)
	require.Equal(t, "precious", string(b))
	require.NoError(t, s.close())
	require.NoDirExists(t, s.path)
	_, _, err = s.create()
	require.ErrorIs(t, err, errScratchClosed)
}

// A scratch directory the pool cannot make fails New, naming the setting.
func TestScratchDirUnusable(t *testing.T) {
	t.Parallel()
	requireSandbox(t)
	_, err := New(Config{Workers: 1, Dir: t.TempDir(), Python: testPython(), ScratchDir: filepath.Join(t.TempDir(), "missing")})
	var ce *ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "pool.scratch_dir", ce.Key)
	require.Contains(t, ce.Problem, "cannot make the pool's scratch directory")
}

// On a tmpfs (the default, /dev/shm) what a job writes to its scratch is
// memory charged to its cgroup: filling it past the job's allowance ends
// the job with MemoryError, as any other memory would, and the pool goes
// on serving with the scratch emptied.
func TestScratchCountsAsMemory(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(p.scratch.path, &st))
	if st.Type != unix.TMPFS_MAGIC {
		t.Skipf("the scratch directory %s is not on a tmpfs", p.scratch.path)
	}
	if p.Cgroups() == "none" {
		t.Skip("no per-job cgroups on this machine: tmpfs pages are bounded only by the tmpfs's size")
	}
	res := run(t, p, Job{Memory: 64 << 20, Code: `
import os
block = b"x" * (1 << 20)
with open(os.path.join(os.environ["TMPDIR"], "big"), "wb") as f:
    for i in range(1024):
        f.write(block)
        f.flush()
print("wrote 1 GiB")
`})
	requireErrorType(t, res, "MemoryError")
	require.Empty(t, res.Stdout)
	requireScratchEmpty(t, p, "the filled scratch was not emptied")
	advServes(t, p)
}

// A preload that asked tempfile for its directory at import (caching the
// template's, /tmp) does not send jobs there: each job's tempfile uses its
// own TMPDIR.
func TestScratchTempfileAfterPreloadCachedIt(t *testing.T) {
	t.Parallel()
	pkgs := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(pkgs, "cachetmp.py"), []byte("import tempfile\nSEEN = tempfile.gettempdir()\n"), 0o644))
	p := newTestPool(t, Config{Workers: 1, Preload: []string{"cachetmp"}, PackageDirs: []string{pkgs}})
	res := run(t, p, Job{Code: "import cachetmp, os, tempfile\nprint(cachetmp.SEEN != os.environ['TMPDIR'])\nf = tempfile.NamedTemporaryFile()\nprint(os.path.dirname(f.name) == os.environ['TMPDIR'])"})
	requireOK(t, res)
	require.Equal(t, "True\nTrue\n", res.Stdout)
}

// A new pool removes the scratch directories that killed pools left
// behind — those nobody holds the lock of — and leaves alone those of
// live pools and anything that is not such a directory.
func TestScratchStaleSwept(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	victim := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(victim, "keep"), []byte("precious"), 0o644))
	stale := filepath.Join(parent, scratchPrefix+"dead")
	require.NoError(t, os.MkdirAll(filepath.Join(stale, "j1", "sub"), 0o700))
	require.NoError(t, os.Symlink(victim, filepath.Join(stale, "j1", "out")))
	require.NoError(t, os.Symlink(victim, filepath.Join(parent, scratchPrefix+"link")))
	live, err := newScratchRoot(parent)
	require.NoError(t, err)
	defer live.close()
	again, err := newScratchRoot(parent)
	require.NoError(t, err)
	defer again.close()
	require.NoDirExists(t, stale)
	require.DirExists(t, live.path, "a live pool's scratch directory was swept")
	b, err := os.ReadFile(filepath.Join(victim, "keep"))
	require.NoError(t, err)
	require.Equal(t, "precious", string(b))
	_, err = os.Lstat(filepath.Join(parent, scratchPrefix+"link"))
	require.NoError(t, err, "a symlink named like a scratch directory was removed")
}

// A pool's own scratch tmpfs (mountOwn, in a tmpfs parent, as root): it
// is mounted on the scratch directory with no inode limit; a live one is
// not swept by another pool; one whose pool died (its descriptors gone,
// the mount left) is unmounted and removed by the next pool's sweep,
// following no link; Close unmounts it and removes the directory.
func TestScratchOwnTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs takes root")
	}
	parent := t.TempDir()
	require.NoError(t, unix.Mount("pynox-scratch-test", parent, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=8m,nr_inodes=64,mode=0755"))
	t.Cleanup(func() { unix.Unmount(parent, unix.MNT_DETACH) })
	var pst unix.Stat_t
	require.NoError(t, unix.Stat(parent, &pst))

	live, err := newScratchRoot(parent)
	require.NoError(t, err)
	live.mountOwn()
	require.True(t, live.mounted, "a root pool mounts a tmpfs of its own on its scratch directory")
	var sf unix.Statfs_t
	require.NoError(t, unix.Statfs(live.path, &sf))
	require.Zero(t, sf.Files, "no inode limit")
	var st unix.Stat_t
	require.NoError(t, unix.Stat(live.path, &st))
	require.NotEqual(t, pst.Dev, st.Dev)
	// More files than the parent has inodes.
	name, fd, err := live.create()
	require.NoError(t, err)
	unix.Close(fd)
	for i := range 200 {
		require.NoError(t, os.WriteFile(filepath.Join(live.dir(name), strconv.Itoa(i)), nil, 0o600))
	}

	// A pool killed with its tmpfs mounted: its descriptors go, the
	// mount stays.
	dead, err := newScratchRoot(parent)
	require.NoError(t, err)
	dead.mountOwn()
	require.True(t, dead.mounted)
	victim := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(victim, "keep"), []byte("precious"), 0o644))
	require.NoError(t, os.Symlink(victim, filepath.Join(dead.path, "out")))
	deadPath := dead.path
	unix.Close(dead.fd)
	unix.Close(dead.mountLock)
	unix.Close(dead.lock)

	again, err := newScratchRoot(parent)
	require.NoError(t, err)
	require.NoDirExists(t, deadPath, "a dead pool's scratch tmpfs was not swept")
	require.DirExists(t, live.path, "a live pool's scratch tmpfs was swept")
	require.NoError(t, unix.Stat(live.path, &st))
	require.NotEqual(t, pst.Dev, st.Dev, "a live pool's scratch tmpfs was unmounted")
	b, err := os.ReadFile(filepath.Join(victim, "keep"))
	require.NoError(t, err)
	require.Equal(t, "precious", string(b))
	require.NoError(t, again.close())

	livePath := live.path
	require.NoError(t, live.close())
	require.NoDirExists(t, livePath)
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	require.NotContains(t, string(mounts), livePath+" ", "Close left the tmpfs mounted")
	require.NotContains(t, string(mounts), deadPath+" ", "the sweep left the dead pool's tmpfs mounted")
}
