package mountns

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/sandbox"
)

// enterScript plays a spare: it gives up every capability and sets
// no_new_privs (as the template does), makes a Landlock ruleset with
// rules on host paths opened before it enters (argv: "path=access" with
// access r or rw), enters the user and then the mount namespace (fds 3
// and 4), drops the capabilities it regained there, adds a read-write
// rule on each overlay path (argv: "+path", opened after entering),
// enforces the ruleset and runs the probes, printing one JSON object:
// probe name -> result or errno name.
const enterScript = `
import ctypes, errno, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CAPSET = {"x86_64": 126, "aarch64": 91}[os.uname().machine]
SETNS = {"x86_64": 308, "aarch64": 268}[os.uname().machine]
def S(nr, *a):
    r = libc.syscall(nr, *a)
    if r < 0:
        e = ctypes.get_errno(); raise OSError(e, "syscall %d: %s" % (nr, os.strerror(e)))
    return r
class H(ctypes.Structure): _fields_ = [("v", ctypes.c_uint32), ("pid", ctypes.c_int)]
class D(ctypes.Structure): _fields_ = [("e", ctypes.c_uint32), ("p", ctypes.c_uint32), ("i", ctypes.c_uint32)]
def drop():
    for c in range(64):
        libc.prctl(24, c, 0, 0, 0)
    S(CAPSET, ctypes.byref(H(0x20080522, 0)), ctypes.byref((D * 2)()))
def eff():
    return [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
class RA(ctypes.Structure): _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("sc", ctypes.c_uint64)]
class PB(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("a", ctypes.c_uint64), ("fd", ctypes.c_int32)]
ALL = (1 << 16) - 1
R = 1 | 4 | 8
RW = ALL
drop()
libc.prctl(38, 1, 0, 0, 0)
out = {"caps_before": eff()}
rs = S(444, ctypes.byref(RA(ALL, 0, 0)), 24, 0)
def rule(path, acc):
    fd = os.open(path, os.O_PATH)
    if not os.path.isdir(path):
        acc &= 1 | 2 | 4
    S(445, rs, 1, ctypes.byref(PB(acc, fd)), 0)
late = []
for a in sys.argv[1:]:
    if a.startswith(("pool:", "poolrw:")):
        # A first domain, like the pool's own (Config.ConfineSelf): read
        # (or everything: poolrw) on the paths listed, enforced at once.
        acc = R if a.startswith("pool:") else RW
        pool = S(444, ctypes.byref(RA(ALL, 0, 0)), 24, 0)
        for p in a.split(":", 1)[1].split(","):
            fd = os.open(p, os.O_PATH)
            S(445, pool, 1, ctypes.byref(PB(acc if os.path.isdir(p) else 4, fd)), 0)
        S(446, pool, 0)
    elif a.startswith("+"):
        late.append(a[1:])
    else:
        p, acc = a.split("=")
        rule(p, RW if acc == "rw" else R)
try:
    open("/etc/hostname").read()
    out["host_etc_before"] = "read"
except OSError as e:
    out["host_etc_before"] = errno.errorcode.get(e.errno, str(e.errno))
S(SETNS, 3, 0x10000000)
out["caps_in_userns"] = eff()
S(SETNS, 4, 0x00020000)
os.chdir("/")
drop()
out["caps_after"] = eff()
for p in late:
    rule(p, RW)
S(446, rs, 0)
def t(name, f):
    try:
        out[name] = f()
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
def wr(p, data="x", mode="w"):
    with open(p, mode) as f:
        return f.write(data)
t("read_data", lambda: open("/data/f.txt").read())
t("write_data", lambda: wr("/data/new.txt"))
t("read_swapped", lambda: sorted(os.listdir("/swapped")))
t("read_work", lambda: open("/work/f.txt").read())
t("write_work", lambda: wr("/work/f.txt", "changed"))
t("reread_work", lambda: open("/work/f.txt").read())
t("fill_work", lambda: wr("/work/big", "x" * 300000))
t("after_fill_work", lambda: wr("/work/small", "ok"))
t("write_out", lambda: wr("/out/new.txt", "persisted"))
t("symlink_out", lambda: open("/out/evil").read())
t("dotdot_out", lambda: open("/out/../../etc/passwd").read())
t("rename_out_to_data", lambda: os.rename("/out/new.txt", "/data/moved.txt"))
t("rename_out_to_root", lambda: os.rename("/out/new.txt", "/moved.txt"))
t("link_outside", lambda: os.link("/usr/bin/env", "/out/hard"))
t("link_out_to_work", lambda: os.link("/out/new.txt", "/work/hard"))
t("mkdir_root", lambda: os.mkdir("/newdir"))
t("etc_passwd", lambda: open("/etc/passwd").read())
t("fifo_nonblock", lambda: os.close(os.open("/data/fifo", os.O_RDONLY | os.O_NONBLOCK)) or "opened")
t("socket_in_data", lambda: socket.socket(socket.AF_UNIX).connect("/data/sock") or "connected")
t("import_json", lambda: __import__("json").dumps([1]))
print(json.dumps(out))
`

func TestMountNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the mounter needs root (CAP_SYS_ADMIN in the initial user namespace)")
	}
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock: %v", err)
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("user namespaces are disabled (user.max_user_namespaces = 0)")
	}
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("hello"), 0o644))
	require.NoError(t, unix.Mkfifo(filepath.Join(data, "fifo"), 0o644))
	ln, err := (&netListenUnix{}).listen(filepath.Join(data, "sock"))
	require.NoError(t, err)
	defer ln.Close()
	outDir := filepath.Join(dir, "out")
	require.NoError(t, os.Mkdir(outDir, 0o755))
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(outDir, "evil")))
	swap := filepath.Join(dir, "swap")
	require.NoError(t, os.Mkdir(swap, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(swap, "mine.txt"), nil, 0o644))

	open := func(p string) *os.File {
		f, err := os.OpenFile(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
		return f
	}
	dataF, outF, swapF, usrF, nullF, procF := open(data), open(outDir), open(swap), open("/usr"), open("/dev/null"), open("/proc")
	fifoF := open(filepath.Join(data, "fifo"))
	// The host swaps the accepted directory for a symlink before the
	// namespace is built: the namespace holds what the descriptor named.
	require.NoError(t, os.Rename(swap, swap+".old"))
	require.NoError(t, os.Symlink("/etc", swap))

	m, err := Start(python)
	require.NoError(t, err)
	defer m.Close()
	ns, err := m.Build(Plan{
		Binds: []Bind{
			{Source: fd(usrF), Path: "/usr", ReadOnly: true},
			{Source: fd(nullF), Path: "/dev/null"},
			{Source: fd(procF), Path: "/proc", ReadOnly: true},
			{Source: fd(dataF), Path: "/data", ReadOnly: true},
			{Source: fd(outF), Path: "/out"},
			{Source: fd(swapF), Path: "/swapped", ReadOnly: true},
			{Source: fd(fifoF), Path: "/srv/a/fifo", ReadOnly: true},
		},
		Overlays: []Overlay{{Lower: fd(dataF), Path: "/work", Limit: 64 << 10}},
		Links:    HostLinks(),
	})
	require.NoError(t, err)
	defer ns.Close()

	cmd := exec.Command(python, "-I", "-S", "-c", enterScript,
		"/usr=r", "/proc=r", "/dev/null=rw", data+"=r", outDir+"=rw", swap+".old=r", "+/work")
	cmd.ExtraFiles = []*os.File{ns.User, ns.Mount}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	b, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		t.Fatalf("entering process: %v: %s", err, ee.Stderr)
	}
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got), string(b))
	t.Logf("%s", b)

	want := map[string]any{
		"caps_before":  "0000000000000000",
		"caps_after":   "0000000000000000",
		"read_data":    "hello",
		"write_data":   "EROFS",
		"read_swapped": []any{"mine.txt"},
		"read_work":    "hello",
		"write_work":   float64(7),
		"reread_work":  "changed",
		"fill_work":    "ENOSPC",
		"write_out":    float64(9),
		// The host's /etc is not in the namespace at all.
		"symlink_out":        "ENOENT",
		"dotdot_out":         "ENOENT",
		"rename_out_to_data": "EXDEV",
		"rename_out_to_root": "EXDEV",
		"link_outside":       "EXDEV",
		"link_out_to_work":   "EXDEV",
		"mkdir_root":         "EROFS",
		"etc_passwd":         "ENOENT",
		"fifo_nonblock":      "opened",
		"import_json":        "[1]",
	}
	for k, v := range want {
		require.Equal(t, v, got[k], k)
	}
	require.NotEqual(t, "0000000000000000", got["caps_in_userns"], "setns into the user namespace gives its owner capabilities there, which the spare must drop")
	// A socket inside a read-only mount: connecting is a write (EACCES
	// from Landlock, or EROFS); it neither hangs nor reaches the host's
	// listener unnoticed.
	require.Contains(t, []any{"EACCES", "EROFS", "ECONNREFUSED", "connected"}, got["socket_in_data"])

	// The host directory behind the overlay is unchanged; the read-write
	// bind's write persisted; nothing was created on the host.
	b, err = os.ReadFile(filepath.Join(data, "f.txt"))
	require.NoError(t, err)
	require.Equal(t, "hello", string(b))
	_, err = os.Stat(filepath.Join(data, "big"))
	require.True(t, os.IsNotExist(err))
	b, err = os.ReadFile(filepath.Join(outDir, "new.txt"))
	require.NoError(t, err)
	require.Equal(t, "persisted", string(b))
	for _, p := range []string{"/data", "/out", "/swapped", "/srv/a"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s exists on the host after building a namespace", p)
		}
	}
}

type netListenUnix struct{}

func (netListenUnix) listen(path string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Listen(fd, 1); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// TestMountNamespaceUnderParentDomain shows why a pool that confines
// itself (Config.ConfineSelf) cannot simply pass these namespaces to its
// jobs: Landlock matches rules along the path walk, which in the job's
// namespace goes from a bind's root (the host directory itself) to the
// namespace's tmpfs root, skipping the host directory's ancestors and the
// mountpoints. A pool domain whose rule is on a ceiling above the mounted
// directory (here its parent) denies the job the mount, though the job's
// own rule is on the directory; only a rule on the very directory (here
// /usr) still matches, and the overlay, a new file system, matches none.
// Wiring mounts into a self-confined pool needs the pool's domain to hold
// a rule on the namespace root, a tmpfs made before the pool confines
// itself.
func TestMountNamespaceUnderParentDomain(t *testing.T) {
	ns, data, python := buildSimple(t)
	cmd := exec.Command(python, "-I", "-S", "-c", enterScript,
		"pool:/usr,/proc,"+filepath.Dir(data), "/usr=r", "/proc=r", data+"=r", "+/work")
	cmd.ExtraFiles = []*os.File{ns.User, ns.Mount}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	b, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		t.Fatalf("entering process: %v: %s", err, ee.Stderr)
	}
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got), string(b))
	require.Equal(t, "EACCES", got["read_data"], "the parent domain's rule on the ceiling does not reach through the bind")
	require.Equal(t, "EACCES", got["read_work"])
	require.Equal(t, "[1]", got["import_json"], "a rule on the bound directory itself still matches")
}

// TestMountNamespaceUnderRootRule shows the way out for a self-confined
// pool: namespaces whose root is a clone of one tmpfs made before the
// pool's domain, with a rule of that domain on its root, give the job its
// mounts (the walk from any path in the namespace ends at that root),
// overlays included, while the job's own domain still decides.
func TestMountNamespaceUnderRootRule(t *testing.T) {
	ns0, data, python := buildSimple(t)
	ns0.Close()
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.FsconfigSetString(fsfd, "size", "1m"))
	require.NoError(t, unix.FsconfigCreate(fsfd))
	base, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	unix.Close(fsfd)
	require.NoError(t, err)
	baseF := os.NewFile(uintptr(base), "base")
	defer baseF.Close()
	var files []*os.File
	for _, p := range []string{"/usr", "/proc", data} {
		f, err := os.OpenFile(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		defer f.Close()
		files = append(files, f)
	}
	m, err := Start(python)
	require.NoError(t, err)
	defer m.Close()
	ns, err := m.Build(Plan{
		Binds: []Bind{{Source: fd(files[0]), Path: "/usr", ReadOnly: true}, {Source: fd(files[1]), Path: "/proc", ReadOnly: true},
			{Source: fd(files[2]), Path: "/data", ReadOnly: true}},
		Overlays: []Overlay{{Lower: fd(files[2]), Path: "/work", Limit: 1 << 20}},
		Links:    HostLinks(), Root: base, RootSet: true,
	})
	require.NoError(t, err)
	defer ns.Close()
	// fd 5 in the entering process is the base tmpfs (ExtraFiles[2]).
	cmd := exec.Command(python, "-I", "-S", "-c", enterScript,
		"poolrw:/usr,/proc,/proc/self/fd/5", "/usr=r", "/proc=r", data+"=r", "+/work")
	cmd.ExtraFiles = []*os.File{ns.User, ns.Mount, baseF}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	b, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		t.Fatalf("entering process: %v: %s", err, ee.Stderr)
	}
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got), string(b))
	require.Equal(t, "hello", got["read_data"])
	require.Equal(t, float64(7), got["write_work"])
	require.Equal(t, "EROFS", got["write_data"])
	require.Equal(t, "[1]", got["import_json"])
	// The rule is on the tmpfs's root, not on the host's: before entering,
	// the domain denies the host's /etc.
	require.Equal(t, "EACCES", got["host_etc_before"])
}

// buildSimple builds a namespace with /usr and /proc read-only, a host
// directory read-only at /data and as an overlay at /work.
func buildSimple(t testing.TB) (*Namespace, string, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the mounter needs root (CAP_SYS_ADMIN in the initial user namespace)")
	}
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock: %v", err)
	}
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	data := filepath.Join(t.TempDir(), "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("hello"), 0o644))
	var files []*os.File
	for _, p := range []string{"/usr", "/proc", data} {
		f, err := os.OpenFile(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
		files = append(files, f)
	}
	m, err := Start(python)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	ns, err := m.Build(Plan{
		Binds: []Bind{{Source: fd(files[0]), Path: "/usr", ReadOnly: true}, {Source: fd(files[1]), Path: "/proc", ReadOnly: true},
			{Source: fd(files[2]), Path: "/data", ReadOnly: true}},
		Overlays: []Overlay{{Lower: fd(files[2]), Path: "/work", Limit: 1 << 20}},
		Links:    HostLinks(),
	})
	require.NoError(t, err)
	t.Cleanup(func() { ns.Close() })
	return ns, data, python
}

// BenchmarkBuild measures one namespace with a read-only virtual mount
// (plus /usr, /proc and an overlay) from a running mounter: the round trip
// a job with mounts would add.
func BenchmarkBuild(b *testing.B) {
	ns, data, python := buildSimple(b)
	ns.Close()
	_ = python
	f, err := os.OpenFile(data, unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(b, err)
	defer f.Close()
	usr, err := os.OpenFile("/usr", unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(b, err)
	defer usr.Close()
	m, err := Start("/usr/bin/python3")
	require.NoError(b, err)
	defer m.Close()
	b.ResetTimer()
	for range b.N {
		ns, err := m.Build(Plan{Binds: []Bind{{Source: fd(usr), Path: "/usr", ReadOnly: true}, {Source: fd(f), Path: "/data", ReadOnly: true}}, Links: HostLinks()})
		require.NoError(b, err)
		ns.Close()
	}
}

func fd(f *os.File) int { return int(f.Fd()) }
