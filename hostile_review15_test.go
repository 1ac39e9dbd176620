package pynox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/mountns"
	"github.com/pynox/pynox/internal/testenv"
)

// Review 15 (issue 13, the seed namespace and the base binds' masters):
// an outside reviewer's probes against stock namespaces built from the
// mounter's seed namespace (mountns.SeedFD) with each base bind cloned
// from a master made once at prepare. Each probe runs real python3 in
// the real sandbox.

// r15Mount is one line of a mountinfo file.
type r15Mount struct {
	id, parent string
	point      string // the mountpoint, as the namespace's root shows it
	opts       string // the mount's own options (ro, nosuid, nodev, ...)
	optional   string // the propagation fields (shared:N, master:N), "" when private
	fstype     string
	super      string // the superblock's options
}

// r15ParseMountinfo parses a mountinfo file's text.
func r15ParseMountinfo(t *testing.T, text string) []r15Mount {
	t.Helper()
	var out []r15Mount
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(l)
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		require.True(t, sep >= 6 && len(f) >= sep+4, "a mountinfo line: %q", l)
		out = append(out, r15Mount{id: f[0], parent: f[1], point: f[4], opts: f[5],
			optional: strings.Join(f[6:sep], " "), fstype: f[sep+1], super: f[sep+3]})
	}
	return out
}

// r15Opt says whether a comma-separated option list holds opt.
func r15Opt(opts, opt string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == opt {
			return true
		}
	}
	return false
}

// r15Inspect is what a probe job prints of its namespace: its pid, its
// mountinfo, its root's entries, and what "..", an O_PATH descriptor of
// "/" and its parent, and chdir("..") from "/" lead to.
const r15Inspect = `import json, os
root = os.open("/", os.O_PATH | os.O_DIRECTORY)
up = os.open("..", os.O_PATH | os.O_DIRECTORY, dir_fd=root)
s, u = os.fstat(root), os.fstat(up)
os.chdir("/")
for _ in range(4):
    os.chdir("..")
c = os.stat(".")
try:
    ents = sorted(os.listdir("/"))
except PermissionError:
    ents = []  # Landlock: the root is no grant
print("R15 " + json.dumps({
    "pid": os.readlink("/proc/self"),
    "mountinfo": open("/proc/self/mountinfo").read(),
    "root": ents,
    "t": os.path.lexists("/t"),
    "tmp": os.environ.get("TMPDIR", ""),
    "dotdot": [s.st_dev == u.st_dev and s.st_ino == u.st_ino, s.st_dev == c.st_dev and s.st_ino == c.st_ino],
}), flush=True)
`

// r15Result is what r15Inspect printed.
type r15Result struct {
	Pid       string `json:"pid"`
	Mountinfo string `json:"mountinfo"`
	Root      []string
	T         bool
	Tmp       string // the job's scratch directory (a grant of its own)
	Dotdot    []bool
}

func r15Read(t *testing.T, res *Result) r15Result {
	t.Helper()
	m := r13Line(t, res, "R15")
	var r r15Result
	r.Pid, _ = m["pid"].(string)
	r.Mountinfo, _ = m["mountinfo"].(string)
	for _, x := range m["root"].([]any) { // empty where Landlock refuses the listing
		r.Root = append(r.Root, x.(string))
	}
	r.T, _ = m["t"].(bool)
	r.Tmp, _ = m["tmp"].(string)
	for _, x := range m["dotdot"].([]any) {
		r.Dotdot = append(r.Dotdot, x.(bool))
	}
	return r
}

// r15CheckTree checks a job's namespace as r15Inspect showed it: no
// trace of the seed (no tmpfs of its size, no /t, no mount above the
// root), ".." of "/" is "/", every mount is nosuid and private, the
// root and every base bind but the four devices (and every mount beneath
// them) read-only and nodev, and every
// mountpoint is the root, beneath a base bind's path, a device, the
// pool's directory or one of want (the job's mounts and grants).
func r15CheckTree(t *testing.T, p *Pool, r r15Result, want map[string]bool) {
	t.Helper()
	base := p.ns.prepBase
	require.NotNil(t, base)
	mounts := r15ParseMountinfo(t, r.Mountinfo)
	ids := map[string]bool{}
	for _, m := range mounts {
		ids[m.id] = true
	}
	require.False(t, r.T, "the job's root shows the seed's t")
	require.NotContains(t, r.Root, "t")
	require.Equal(t, []bool{true, true}, r.Dotdot, "\"..\" of the job's root leads elsewhere")
	devices := map[string]bool{"/dev/null": true, "/dev/zero": true, "/dev/urandom": true, "/dev/random": true}
	roots := 0
	for _, m := range mounts {
		require.False(t, m.fstype == "tmpfs" && strings.Contains(m.super, "size=4k"), "the job's namespace shows the seed's tmpfs: %+v", m)
		require.True(t, r15Opt(m.opts, "nosuid"), "a mount is not nosuid: %+v", m)
		require.Empty(t, m.optional, "a mount of the job's namespace takes part in propagation: %+v", m)
		if m.point == "/" {
			roots++
			require.True(t, r15Opt(m.opts, "ro"), "the job's root is writable: %+v", m)
			require.Equal(t, "tmpfs", m.fstype)
			// The root's parent is no mount of the namespace (the seed's
			// copy it was attached to is gone).
			require.False(t, ids[m.parent] && m.parent != m.id, "the job's root sits on a mount of its namespace: %+v", m)
			continue
		}
		ok := want[m.point] || devices[m.point] || (r.Tmp != "" && m.point == r.Tmp)
		for _, b := range base.binds {
			if beneath(m.point, b.path) {
				ok = true
				// A base bind, and every mount beneath it, is read-only and
				// nodev but the four devices.
				if b.ro {
					require.True(t, r15Opt(m.opts, "ro"), "a read-only base bind is writable: %+v", m)
				}
				if !devices[b.path] {
					require.True(t, r15Opt(m.opts, "nodev"), "a base bind lets device nodes open: %+v", m)
				}
			}
		}
		for w := range want {
			ok = ok || beneath(m.point, w)
		}
		require.True(t, ok, "the job's namespace shows a mount at %s, neither a base bind nor the job's: %+v", m.point, m)
	}
	require.Equal(t, 1, roots, "the job's namespace has %d root mounts", roots)
}

// Probe: a job in a stock namespace (leased by its spare) shows nothing
// of the seed namespace it was built from: no /t, no 4 KiB tmpfs, no
// mount beneath its root besides the base binds, the job's mounts and
// grants; ".." of its root (by path, by an O_PATH descriptor, by chdir)
// is its root; every mount is nosuid and private (no shared or master
// propagation), the root and the base binds but the devices are "ro"
// and "nodev". The host
// reads the same mount table through /proc/<pid>/mountinfo of the
// job's process.
func TestHostileReview15JobShowsNoSeed(t *testing.T) {
	testenv.Slow(t)
	p, data := r13ProcPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	for range 3 {
		spare := r13Leased(t, p)
		// The host reads the job's mount table while it runs.
		host := make(chan string, 1)
		go func() {
			var s string
			for range 2000 {
				b, err := os.ReadFile("/proc/" + strconv.Itoa(spare) + "/mountinfo")
				if err != nil {
					break
				}
				// Once the attach is done: /data mounted and the root made
				// read-only (its last step).
				if s = string(b); strings.Contains(s, " /data ") && strings.Contains(s, " / / ro,") {
					break
				}
				time.Sleep(time.Millisecond)
			}
			host <- s
		}()
		res := run(t, p, Job{Mounts: mounts, AllowRead: []string{"/proc"}, Code: r15Inspect + "import time; time.sleep(0.3)"})
		requireOK(t, res)
		r := r15Read(t, res)
		require.Equal(t, strconv.Itoa(spare), r.Pid, "the job did not run in its leased spare")
		t.Logf("job %s root %v\n%s", r.Pid, r.Root, r.Mountinfo)
		r15CheckTree(t, p, r, map[string]bool{"/data": true, p.Config().Dir: true})
		seen := <-host
		require.Contains(t, seen, " /data ", "the host never read the job's mount table")
		r.Mountinfo = seen
		r15CheckTree(t, p, r, map[string]bool{"/data": true, p.Config().Dir: true})
	}
	advServes(t, p)
}

const r15HostMountsEnv = "PYNOX_R15_HOSTMOUNTS"

// r15Doc is the base path the host mounts beneath in
// TestHostileReview15HostMounts (beneath the base bind /usr), in the
// test's own mount namespace only.
const r15Doc = "/usr/share/doc"

// r15Tmpfs mounts a tmpfs at path holding the file name.
func r15Tmpfs(t *testing.T, path, name string) {
	t.Helper()
	require.NoError(t, unix.Mount("r15", path, "tmpfs", 0, "size=64k"))
	require.NoError(t, os.WriteFile(filepath.Join(path, name), []byte(name), 0o644))
}

// r15Seen is what a job prints of the host's mounts beneath r15Doc and
// the job's /data, and whether it can write to the mount beneath /data.
const r15Seen = `import os
def w():
    try:
        open("/data/sub/job.txt", "w").close()
        return "ok"
    except OSError as e:
        return type(e).__name__
print("SEEN", os.path.exists("/usr/share/doc/early.txt"), os.path.exists("/usr/share/doc/sub/late.txt"),
      os.path.exists("/data/sub/late.txt"), w())
`

// Probe: mounts the host makes, or removes, beneath a base bind's path
// (here /usr, in a mount namespace of the test's own whose mounts are
// shared, as systemd makes them) after the pool prepared its base. The
// base binds' masters are private: a mount the host makes beneath a base
// path after the prepare reaches no job (neither one running then nor a
// later one); one that was there at the prepare stays in every job's
// namespace after the host unmounts it (the base is what the host showed
// at the prepare, until the pool closes). A job's mounts are private
// clones of their source made at its attach: a mount the host makes
// beneath a mount's source while the job runs does not reach it (it
// did: a writable mount inside the job's read-only /data, only Landlock
// refused writes there); one there at the attach is in the job's mount,
// read-only as the mount is. A device node beneath a base path does
// not open (the base binds are nodev, but the four device files).
func TestHostileReview15HostMounts(t *testing.T) {
	if os.Getenv(r15HostMountsEnv) == "" {
		requireSandbox(t)
		if os.Geteuid() != 0 || len(nsMachineObstacles()) > 0 {
			t.Skipf("needs root and mount namespaces: %v", nsMachineObstacles())
		}
		if _, err := os.Stat(r15Doc); err != nil {
			t.Skipf("no %s here", r15Doc)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestHostileReview15HostMounts$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), r15HostMountsEnv+"="+t.TempDir())
		// A mount namespace of its own (its mounts made private first):
		// nothing it mounts reaches the machine.
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "child:\n%s", out)
		require.Contains(t, string(out), "--- PASS: TestHostileReview15HostMounts", "child:\n%s", out)
		require.NotContains(t, string(out), "--- SKIP", "child:\n%s", out)
		t.Logf("child:\n%s", out)
		return
	}
	dir := os.Getenv(r15HostMountsEnv)
	require.NoError(t, unix.Mount("none", "/", "", unix.MS_REC|unix.MS_SHARED, ""))
	r15Tmpfs(t, r15Doc, "early.txt")
	require.NoError(t, os.Mkdir(filepath.Join(r15Doc, "sub"), 0o755))
	// A device node beneath a base path (the null device: harmless).
	require.NoError(t, unix.Mknod(filepath.Join(r15Doc, "r15null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	p := newTestPool(t, Config{Workers: 2, Dir: dir, Limits: Limits{AllowRead: []string{dir, "/proc"}}})
	requireNS(t, p)
	data, ctl := filepath.Join(dir, "data"), filepath.Join(dir, "ctl")
	for _, d := range []string{data, filepath.Join(data, "sub"), ctl} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	res := run(t, p, Job{Mounts: mounts, Code: r15Seen})
	requireOK(t, res)
	t.Logf("before: %s", res.Stdout)
	require.Equal(t, "SEEN True False False OSError\n", res.Stdout)
	// A device node beneath a base path opens for no job (the base binds
	// but the devices are nodev), while the base's own /dev/null does.
	res = run(t, p, Job{Mounts: mounts, Code: `import errno, os
def o(path, flags):
    try:
        os.close(os.open(path, flags))
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print("DEV", o("/usr/share/doc/r15null", os.O_RDONLY), o("/dev/null", os.O_RDWR))`})
	requireOK(t, res)
	require.Equal(t, "DEV EACCES ok\n", res.Stdout, "a device node beneath a base path opens in a job")
	// A job running while the host mounts.
	done := make(chan *Result, 1)
	go func() {
		done <- run(t, p, Job{Mounts: append([]MountSpec{{HostPath: ctl, Path: "/ctl", Mode: ReadWrite}}, mounts...), Timeout: 30 * time.Second,
			Code: `import os, time
open("/ctl/ready", "w").close()
while not os.path.exists("/ctl/go"):
    time.sleep(0.01)
` + r15Seen})
	}()
	require.True(t, eventually(func() bool { _, err := os.Stat(filepath.Join(ctl, "ready")); return err == nil }))
	r15Tmpfs(t, filepath.Join(r15Doc, "sub"), "late.txt")
	r15Tmpfs(t, filepath.Join(data, "sub"), "late.txt")
	require.NoError(t, os.WriteFile(filepath.Join(ctl, "go"), nil, 0o644))
	res = <-done
	requireOK(t, res)
	t.Logf("running: %s", res.Stdout)
	// Nothing the host mounted reached the running job: not beneath the
	// base (a private master's clone), nor beneath its /data (a private
	// clone of data: no propagation).
	require.Equal(t, "SEEN True False False OSError\n", res.Stdout, "a mount the host made while the job ran reached its namespace")
	// A job's mount table: every mount private (no shared: or master: field)
	// though the host's are shared, nothing of the seed.
	res = run(t, p, Job{Mounts: mounts, AllowRead: []string{"/proc"}, Code: r15Inspect})
	requireOK(t, res)
	r := r15Read(t, res)
	t.Logf("mountinfo:\n%s", r.Mountinfo)
	r15CheckTree(t, p, r, map[string]bool{"/data": true})
	res = run(t, p, Job{Mounts: mounts, Code: r15Seen})
	requireOK(t, res)
	t.Logf("after: %s", res.Stdout)
	// A later job: the base is as the prepare saw it; /data is a clone of
	// data made at its attach, its submount with it, read-only (EROFS,
	// an OSError) as /data is.
	require.Equal(t, "SEEN True False True OSError\n", res.Stdout)
	require.NoError(t, unix.Unmount(filepath.Join(data, "sub"), unix.MNT_DETACH))
	require.NoError(t, unix.Unmount(r15Doc, unix.MNT_DETACH))
	res = run(t, p, Job{Mounts: mounts, Code: r15Seen})
	requireOK(t, res)
	t.Logf("unmounted: %s", res.Stdout)
	// The base's master still holds what the host unmounted beneath a
	// base path (early.txt): the base is the prepare's until the pool
	// closes. data's is gone.
	require.Equal(t, "SEEN True False False OSError\n", res.Stdout)
	advServes(t, p)
}

// r15Mounter is what a job tries against the pool's mounter's seed
// namespace and the base binds' masters it holds: its descriptors
// through /proc (listing, opening, O_PATH, readlink), setns on what
// opens, pidfd_getfd.
const r15Mounter = `
import errno
P = "/proc/%d/" % MOUNTER
attempt("fd_list", lambda: os.listdir(P + "fd"))
try:
    fds = [int(x) for x in os.listdir(P + "fd")]
except OSError:
    fds = []
if SEED not in fds:
    fds.append(SEED)
opened = []
def each(name, fn):
    got = set()
    for fd in fds:
        try:
            r = fn(fd)
            got.add("ok")
            if isinstance(r, int):
                opened.append(r)
        except OSError as e:
            if e.errno != errno.ENOENT:  # a descriptor the mounter closed meanwhile
                got.add(_name(e.errno))
    R[name] = ",".join(sorted(got))
each("fd_open", lambda fd: os.open(P + "fd/%d" % fd, os.O_RDONLY))
each("fd_opath", lambda fd: os.open(P + "fd/%d" % fd, os.O_PATH))
each("fd_readlink", lambda fd: os.readlink(P + "fd/%d" % fd))
each("fdinfo", lambda fd: open(P + "fdinfo/%d" % fd).read())
R["setns_opened"] = "none" if not opened else ",".join(sorted({"ok" if _libc.setns(fd, 0) == 0 else _name(ctypes.get_errno()) for fd in opened}))
attempt("seed_open", lambda: os.open(P + "fd/%d" % SEED, os.O_RDONLY))
pfd = sc("pidfd_open", 434, MOUNTER, 0)
if pfd >= 0:
    sc("pidfd_getfd_seed", 438, pfd, SEED, 0)
else:
    R["pidfd_getfd_seed"] = "skipped"
`

// r15OwnNS counts the namespace descriptors the job holds.
const r15OwnNS = `
def _link(x):
    try:
        return os.readlink("/proc/self/fd/" + x)
    except OSError:
        return ""
R["own_ns_fds"] = str(sum(1 for x in os.listdir("/proc/self/fd") if _link(x).startswith(("mnt:", "user:"))))
`

// Probe: a job with /proc cannot reach the mounter's seed namespace
// (mountns.SeedFD) nor any descriptor it holds (the masters, the
// stock's namespaces): it may list the mounter's descriptor numbers (any
// job with /proc may, for any process), but opening, O_PATH, readlink,
// fdinfo and pidfd_getfd of each are refused, so no setns is possible;
// the job itself holds no namespace descriptor.
func TestHostileReview15SeedUnreachable(t *testing.T) {
	before := mounterPids(t)
	p, data := r13ProcPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	mounter := newMounter(t, before)
	_, err := os.Readlink("/proc/" + strconv.Itoa(mounter) + "/fd/" + strconv.Itoa(mountns.SeedFD))
	if err != nil {
		t.Skipf("the mounter holds no seed namespace here: %v", err)
	}
	for _, ns := range []bool{true, false} {
		job := Job{AllowRead: []string{"/proc"}, Code: advCode(fmt.Sprintf("MOUNTER, SEED = %d, %d\n", mounter, mountns.SeedFD) + r15Mounter +
			r15OwnNS)}
		if ns {
			job.Mounts = mounts
		}
		res := run(t, p, job)
		requireOK(t, res)
		denied := []string{"EACCES", "EPERM", "ESRCH", "ENOSYS"}
		advExpect(t, advProbes(t, res), map[string][]string{
			"fd_list": append([]string{"ok"}, denied...), "fd_open": denied, "fd_opath": denied, "fd_readlink": denied,
			"fdinfo": denied, "setns_opened": {"none"}, "seed_open": denied, "pidfd_open": append([]string{"ok"}, denied...),
			"pidfd_getfd_seed": append([]string{"skipped"}, denied...), "own_ns_fds": {"0"},
		})
	}
	advServes(t, p)
}

const r15SelfConfineEnv = "PYNOX_R15_SELFCONFINE"

// Probe: in a pool that confines itself (each namespace's root a slot of
// one shared tmpfs, built from the seed with the masters too), a job's
// namespace shows nothing of the seed, ".." of its root is its root, and
// every mount is nosuid, private and read-only as asked (as
// TestHostileReview15JobShowsNoSeed checks in a plain pool); no earlier
// job's mount is in it.
func TestHostileReview15SelfConfined(t *testing.T) {
	dir, child := nsChildProcess(t, r15SelfConfineEnv)
	if !child {
		return
	}
	p := selfConfinedPool(t, dir, 1, "/proc")
	requireNS(t, p)
	data := helloDataDir(t, dir)
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/r15-earlier"}}, Code: "print(1)"}))
	for range 3 {
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, AllowRead: []string{"/proc"}, Code: r15Inspect})
		requireOK(t, res)
		r := r15Read(t, res)
		t.Logf("job %s\n%s", r.Pid, r.Mountinfo)
		require.NotContains(t, r.Mountinfo, "r15-earlier")
		r15CheckTree(t, p, r, map[string]bool{"/data": true})
	}
	advServes(t, p)
}

const r15NoSeedEnv = "PYNOX_R15_NOSEED"

// Probe: a mounter that cannot hold its seed namespace at
// mountns.SeedFD (here: a descriptor limit below it, which the mounter
// inherits) builds its stock the old way, from a copy of the host's
// mount namespace whose every mount it detaches: the job's namespace is
// the same tree, with nothing of the host's mount table beyond the base
// binds and the job's mounts, every mount nosuid, private and read-only
// as asked.
func TestHostileReview15NoSeedFallback(t *testing.T) {
	dir, child := nsChildProcess(t, r15NoSeedEnv)
	if !child {
		return
	}
	// syscall's Setrlimit: the processes this one starts get this limit
	// too (not the one Go found at its start).
	lim := uint64(mountns.SeedFD / 2)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim, Max: lim}))
	before := mounterPids(t)
	p := newTestPool(t, Config{Workers: 1, Dir: dir, Limits: Limits{AllowRead: []string{dir, "/proc"}}})
	requireNS(t, p)
	data := helloDataDir(t, dir)
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	mounter := newMounter(t, before)
	_, err := os.Readlink("/proc/" + strconv.Itoa(mounter) + "/fd/" + strconv.Itoa(mountns.SeedFD))
	require.True(t, os.IsNotExist(err), "the mounter holds a seed despite its descriptor limit: %v", err)
	for range 3 {
		res := run(t, p, Job{Mounts: mounts, AllowRead: []string{"/proc"}, Code: r15Inspect + `print(open("/data/f.txt").read())`})
		requireOK(t, res)
		require.Contains(t, res.Stdout, "\nhello\n")
		r := r15Read(t, res)
		t.Logf("job %s\n%s", r.Pid, r.Mountinfo)
		r15CheckTree(t, p, r, map[string]bool{"/data": true})
	}
	advServes(t, p)
}

// Probe: the host replaces the pool's working directory (in the
// namespace's base: an empty directory the mounter made by path in the
// root tmpfs, nothing of the host's) with a symbolic link to /etc after
// the prepare. A job granted the directory is refused (the grant now
// resolves to /etc, outside the ceiling: a RequestError naming
// allow_read); a job without the grant sees nothing of /etc (its files
// neither at the working directory's path nor at their own) and nothing
// of the old directory's files; once the host puts the directory back,
// a job starts in it and sees its files again.
func TestHostileReview15DirSwap(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "pool")
	require.NoError(t, os.Mkdir(dir, 0o755))
	p := newTestPool(t, Config{Workers: 1, Dir: dir, Limits: Limits{AllowRead: []string{base, "/proc"}, AllowWrite: []string{dir}}})
	requireNS(t, p)
	data := filepath.Join(base, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f.txt"), []byte("hello"), 0o644))
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	code := `import os
D = ` + pyQuote(dir) + `
print(os.path.exists("f.txt"), os.path.exists(D + "/f.txt"), os.path.exists("passwd"), os.path.exists(D + "/passwd"), os.path.exists("/etc/passwd"))
`
	res := run(t, p, Job{Mounts: mounts, Code: code, AllowRead: []string{dir}})
	requireOK(t, res)
	require.Equal(t, "True True False False False\n", res.Stdout)
	require.NoError(t, os.Rename(dir, dir+".old"))
	require.NoError(t, os.Symlink("/etc", dir))
	swapped := true
	defer func() {
		if swapped {
			_ = os.Remove(dir)
			_ = os.Rename(dir+".old", dir)
		}
	}()
	for range 2 {
		res = run(t, p, Job{Mounts: mounts, Code: code, AllowRead: []string{dir}})
		requireErrorType(t, res, "RequestError")
		require.Contains(t, res.Error.Message, "allow_read")
		res = run(t, p, Job{Mounts: mounts, Code: code})
		requireOK(t, res)
		require.Equal(t, "False False False False False\n", res.Stdout, "a job saw /etc or the old directory's files")
	}
	require.NoError(t, os.Remove(dir))
	require.NoError(t, os.Rename(dir+".old", dir))
	swapped = false
	res = run(t, p, Job{Mounts: mounts, Code: code + "print(os.getcwd())", AllowRead: []string{dir}})
	requireOK(t, res)
	require.Equal(t, "True True False False False\n"+dir+"\n", res.Stdout)
	advServes(t, p)
}

// Probe: a pool whose mounter holds no prepared namespaces (its prepare
// failed: here the test makes it so) builds each job's namespace whole,
// neither from the seed nor from the masters: its tree is the same (no
// seed, every mount nosuid and private, the base binds but the devices
// read-only and nodev).
func TestHostileReview15WholeBuild(t *testing.T) {
	p, data := r13ProcPool(t)
	p.ns.prepOnce.Do(func() {
		p.ns.prepBase = p.nsBaseOf()
		p.ns.prepErr = fmt.Errorf("review 15: no prepare")
	})
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	for range 2 {
		res := run(t, p, Job{Mounts: mounts, AllowRead: []string{"/proc"}, Code: r15Inspect + `print(open("/data/f.txt").read())`})
		requireOK(t, res)
		require.Contains(t, res.Stdout, "\nhello\n")
		r := r15Read(t, res)
		t.Logf("job %s\n%s", r.Pid, r.Mountinfo)
		r15CheckTree(t, p, r, map[string]bool{"/data": true})
	}
	advServes(t, p)
}
