package pynox

// Hostile probes for issue 9's seccomp escapes: the filter is an allow
// list, so a system call nobody listed (file_setattr, io_setup, listmount,
// any number beyond the table) fails with EPERM, and ioctl, fcntl, prctl
// and socketpair pass only for the arguments a job needs. Each probe is
// real Python making the raw system call through ctypes, checked from the
// host side where it targets something outside the job; after each the
// pool must still serve.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// advFlags returns a file's inode flags (FS_IOC_GETFLAGS) and change time,
// what file_setattr and FS_IOC_SETFLAGS would change.
func advFlags(t *testing.T, path string) (uint32, unix.Timespec) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	require.NoError(t, err)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(int(f.Fd()), &st))
	return flags, st.Ctim
}

// advDatagramListener is a host datagram service at path: what a job
// without a grant for its directory must not reach.
func advDatagramListener(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	require.NoError(t, err)
	require.NoError(t, os.Chmod(path, 0o777))
	t.Cleanup(func() { c.Close() })
	return c
}

// requireNoDatagram asserts that nothing reached the host service: the
// job has finished, so anything it sent is already queued.
func requireNoDatagram(t *testing.T, c *net.UnixConn) {
	t.Helper()
	raw, err := c.SyscallConn()
	require.NoError(t, err)
	buf := make([]byte, 64)
	var n int
	var rerr error
	require.NoError(t, raw.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
		return true // one non-blocking attempt, never a wait
	}))
	require.True(t, errors.Is(rerr, unix.EAGAIN), "the host service received %q (err %v)", buf[:max(n, 0)], rerr)
}

func TestHostileSeccompEscapes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := newTestPool(t, Config{Workers: 1, Dir: dir})
	// A root-owned file the job may read (FS_IOC_SETFLAGS and F_SETLEASE
	// through a read-only descriptor), and one outside every grant
	// (file_setattr by path).
	ro := filepath.Join(dir, "ro")
	require.NoError(t, os.Mkdir(ro, 0o755))
	readable := filepath.Join(ro, "data.txt")
	require.NoError(t, os.WriteFile(readable, []byte("shared\n"), 0o644))
	outside := t.TempDir()
	secret := filepath.Join(outside, "root-owned.txt")
	require.NoError(t, os.WriteFile(secret, []byte("root\n"), 0o644))
	svcPath := filepath.Join(outside, "svc.sock")
	svc := advDatagramListener(t, svcPath)
	readableFlags, readableCtime := advFlags(t, readable)
	secretFlags, secretCtime := advFlags(t, secret)

	code := advCode(fmt.Sprintf(`import fcntl, socket, struct
NR_SOCKETPAIR, NR_FILE_SETATTR, NR_FILE_GETATTR, NR_IO_SETUP, NR_LISTMOUNT = %d, %d, %d, %d, %d
SVC, SECRET, READABLE = %q, %q, %q
# Issue 9, item 1: a datagram pair reached a host service by path.
def dgram():
    a, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"escaped", SVC)
attempt("dgram_sendto", dgram)
def dgram_unspec_bind():
    a, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    unspec = ctypes.create_string_buffer(16)  # sa_family = AF_UNSPEC: disconnect
    if _libc.connect(a.fileno(), unspec, 16) != 0:
        raise OSError(ctypes.get_errno(), "connect(AF_UNSPEC)")
    a.bind(b"\0pynox-squat-dgram")
attempt("dgram_unspec_bind", dgram_unspec_bind)
# A stream pair still works, and cannot reach the service either.
a, b = socket.socketpair()
a.sendall(b"x"); assert b.recv(1) == b"x"
R["stream_pair"] = "ok"
attempt("stream_sendto", lambda: a.sendto(b"escaped", SVC))
attempt("stream_connect", lambda: a.connect(SVC))
attempt("stream_bind_abstract", lambda: a.bind(b"\0pynox-squat-stream"))
a.close(); b.close()
# Item 12: socketpair reached netlink, vsock and inet code.
fds = (ctypes.c_int * 2)()
for name, dom, typ in [("pair_netlink", 16, 3), ("pair_vsock", 40, 1), ("pair_inet", 2, 1),
                       ("pair_inet6", 10, 2), ("pair_unix_seqpacket", 1, 5), ("pair_unix_dgram_cloexec", 1, 2 | 0o2000000)]:
    if sc(name, NR_SOCKETPAIR, dom, typ, 0, fds) == 0:
        os.close(fds[0]); os.close(fds[1])
# Item 4: metadata writes outside the grants. struct file_attr (24 bytes):
# fa_xflags = FS_XFLAG_NODUMP.
attr = ctypes.create_string_buffer(struct.pack("<QIIII", 0x80, 0, 0, 0, 0), 24)
sc("file_setattr", NR_FILE_SETATTR, -100, SECRET, attr, 24, 0)
sc("file_getattr", NR_FILE_GETATTR, -100, SECRET, attr, 24, 0)
fd = os.open(READABLE, os.O_RDONLY)
flags = ctypes.c_int(0x40)  # FS_NODUMP_FL
sc("ioctl_setflags", %d, fd, %d, ctypes.byref(flags))
attempt("fcntl_setlease", lambda: fcntl.fcntl(fd, 1024, 0))  # F_SETLEASE, F_RDLCK
attempt("fcntl_notify", lambda: fcntl.fcntl(fd, 1026, 0x80000000))  # F_NOTIFY
attempt("fcntl_getfd", lambda: fcntl.fcntl(fd, fcntl.F_GETFD))
os.close(fd)
# Item 12: AIO and listmount.
aio = ctypes.c_ulong(0)
sc("io_setup", NR_IO_SETUP, 1, ctypes.byref(aio))
sc("listmount", NR_LISTMOUNT, 0, 0, 0, 0)
# Item 2: the parent-death signal stays SIGKILL.
ctypes.set_errno(0)
R["set_pdeathsig"] = "ok" if _libc.prctl(1, 0, 0, 0, 0) == 0 else _name(ctypes.get_errno())
sig = ctypes.c_int(-1)
_libc.prctl(2, ctypes.byref(sig), 0, 0, 0)
R["pdeathsig"] = str(sig.value)
# Numbers nobody listed, up to and beyond what the kernel knows.
seen = set()
for nr in list(range(470, 521)) + [1000, 4095]:
    sc("beyond", nr)
    seen.add(R.pop("beyond"))
R["beyond"] = ",".join(sorted(seen))
# What a job legitimately does still works.
R["isatty"] = str(os.isatty(1))
attempt("get_terminal_size", os.get_terminal_size)
r, w = os.pipe(); os.set_blocking(r, False); os.set_inheritable(r, True)
R["pipe_flags"] = str(os.get_blocking(r))
`, unix.SYS_SOCKETPAIR, unix.SYS_FILE_SETATTR, unix.SYS_FILE_GETATTR, unix.SYS_IO_SETUP, unix.SYS_LISTMOUNT,
		svcPath, secret, readable, unix.SYS_IOCTL, uint32(unix.FS_IOC_SETFLAGS)))
	r := run(t, p, Job{ID: "seccomp-escapes", Code: code, AllowRead: []string{ro}})
	advExpect(t, advProbes(t, r), map[string][]string{
		"dgram_sendto":            {"EPERM"},
		"dgram_unspec_bind":       {"EPERM"},
		"stream_pair":             {"ok"},
		"stream_sendto":           {"EISCONN"},
		"stream_connect":          {"EPERM"},
		"stream_bind_abstract":    {"EPERM"},
		"pair_netlink":            {"EPERM"},
		"pair_vsock":              {"EPERM"},
		"pair_inet":               {"EPERM"},
		"pair_inet6":              {"EPERM"},
		"pair_unix_seqpacket":     {"EPERM"},
		"pair_unix_dgram_cloexec": {"EPERM"},
		"file_setattr":            {"EPERM"},
		"file_getattr":            {"EPERM"},
		"ioctl_setflags":          {"EPERM"},
		"fcntl_setlease":          {"EPERM"},
		"fcntl_notify":            {"EPERM"},
		"fcntl_getfd":             {"ok"},
		"io_setup":                {"EPERM"},
		"listmount":               {"EPERM"},
		"set_pdeathsig":           {"EPERM"},
		"pdeathsig":               {fmt.Sprint(int(syscall.SIGKILL))},
		"beyond":                  {"EPERM"},
		"isatty":                  {"False"},
		"get_terminal_size":       {"ENOTTY"},
		"pipe_flags":              {"False"},
	})
	// Checked from the host: nothing reached the service, no flag or
	// change time moved.
	t.Run("host: no datagram", func(t *testing.T) { requireNoDatagram(t, svc) })
	t.Run("host: file_setattr changed nothing", func(t *testing.T) {
		flags, ctime := advFlags(t, secret)
		require.Equal(t, secretFlags, flags, "file_setattr changed the flags of %s", secret)
		require.Equal(t, secretCtime, ctime, "file_setattr changed the ctime of %s", secret)
	})
	t.Run("host: FS_IOC_SETFLAGS changed nothing", func(t *testing.T) {
		flags, ctime := advFlags(t, readable)
		require.Equal(t, readableFlags, flags, "FS_IOC_SETFLAGS changed the flags of %s", readable)
		require.Equal(t, readableCtime, ctime, "FS_IOC_SETFLAGS changed the ctime of %s", readable)
	})
	advServes(t, p)
}

// TestHostileSeccompHeldState checks, while a session holds what it got,
// that it squats no abstract name a host service needs and holds no lease
// that would block the file's writers.
func TestHostileSeccompHeldState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := newTestPool(t, Config{Workers: 1, Dir: dir})
	shared := filepath.Join(dir, "shared.txt")
	require.NoError(t, os.WriteFile(shared, []byte("shared\n"), 0o644))
	name := fmt.Sprintf("pynox-squat-%d", os.Getpid())
	co := checkout(t, p, Job{AllowRead: []string{dir}})
	r := feed(t, co, advCode(fmt.Sprintf(`import fcntl, socket
pair = socket.socketpair()
attempt("bind_abstract", lambda: pair[0].bind(b"\0" + %q.encode()))
lease_fd = os.open(%q, os.O_RDONLY)
attempt("lease", lambda: fcntl.fcntl(lease_fd, 1024, 0))  # F_SETLEASE, F_RDLCK
`, name, shared)))
	advExpect(t, advProbes(t, r), map[string][]string{"bind_abstract": {"EPERM"}, "lease": {"EPERM"}})

	// The host binds the name the job tried to take...
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
	require.NoError(t, err, "the session squats the abstract name %q", name)
	l.Close()
	// ...and opens the file for writing without meeting a lease.
	fd, err := unix.Open(shared, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	require.NoError(t, err, "a lease held by the session blocks the file's writers")
	unix.Close(fd)

	r = feed(t, co, "print(pair[0].fileno() > 0, lease_fd > 0)")
	requireOK(t, r)
	require.Equal(t, "True True\n", r.Stdout)
	require.NoError(t, co.Finish(context.Background()))
	advServes(t, p)
}

// TestHostileSeccompNetworkJob checks what a job granted the network may
// do with sockets: AF_INET and AF_INET6 sockets, but still no datagram or
// foreign socketpair, and no AF_UNIX socket.
func TestHostileSeccompNetworkJob(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := newTestPool(t, Config{Workers: 1, Dir: dir, Limits: Limits{AllowNetwork: true}})
	outside := t.TempDir()
	svcPath := filepath.Join(outside, "svc.sock")
	svc := advDatagramListener(t, svcPath)
	r := run(t, p, Job{AllowNetwork: true, Code: advCode(fmt.Sprintf(`import socket
SVC = %q
def dgram():
    a, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"escaped", SVC)
attempt("dgram_sendto", dgram)
attempt("unix_socket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"escaped", SVC))
def inet():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.close()
attempt("inet_bind", inet)
fds = (ctypes.c_int * 2)()
sc("pair_inet", %d, 2, 1, 0, fds)
`, svcPath, unix.SYS_SOCKETPAIR))})
	advExpect(t, advProbes(t, r), map[string][]string{
		"dgram_sendto": {"EPERM"},
		"unix_socket":  {"EPERM"},
		"inet_bind":    {"ok"},
		"pair_inet":    {"EPERM"},
	})
	requireNoDatagram(t, svc)
	advServes(t, p)
	require.False(t, strings.Contains(r.Stderr, "Traceback"), r.Stderr)
}
