package pynox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// nsPool is a pool that builds mount namespaces, with a data directory
// (f.txt, a FIFO, a listening socket) and an output directory in its
// ceiling, or a skip saying why it cannot.
func nsPool(t *testing.T) (p *Pool, data, out string) {
	t.Helper()
	p = newTestPool(t, Config{Workers: 1})
	requireNS(t, p)
	dir := p.Config().Dir
	data, out = filepath.Join(dir, "data"), filepath.Join(dir, "out")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.Mkdir(out, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("hello"), 0o644))
	require.NoError(t, unix.Mkfifo(filepath.Join(data, "fifo"), 0o644))
	return p, data, out
}

// TestHostileMountNSEscapes: from a read-write mount at a virtual path, a
// planted symlink and ".." lead nowhere outside (the host's /etc is not in
// the namespace at all), renames and hard links across mounts fail with
// EXDEV, the host's paths the job was not given do not exist for it (not
// even for stat, which Landlock does not mediate), the namespace's own
// directories are read-only, and the job holds no capability and cannot
// setns. The host keeps the symlink the job planted, and no mountpoint
// appears on the host.
func TestHostileMountNSEscapes(t *testing.T) {
	t.Parallel()
	p, data, out := nsPool(t)
	secret := filepath.Join(p.Config().Dir, "secret.txt")
	require.NoError(t, os.WriteFile(secret, []byte("secret"), 0o644))
	virtual := "/pynox-test-out-" + strings.ReplaceAll(filepath.Base(p.Config().Dir), "/", "")
	res := run(t, p, Job{
		Mounts: []MountSpec{{HostPath: data, Path: "/data"}, {HostPath: out, Path: virtual, Mode: ReadWrite}},
		Code: `
import ctypes, errno, os
V = ` + pyQuote(virtual) + `
def t(name, f):
    try:
        r = f()
        print(name, "ok" if r is None else r)
    except OSError as e:
        print(name, errno.errorcode[e.errno])
open(V + "/f", "w").write("x")
t("symlink", lambda: os.symlink("/etc/passwd", V + "/evil"))
t("read via symlink", lambda: open(V + "/evil").read())
t("dotdot", lambda: open(V + "/../etc/passwd").read())
t("dotdot data", lambda: open("/data/../../etc/passwd").read())
t("rename to scratch", lambda: os.rename(V + "/f", os.environ["TMPDIR"] + "/f"))
t("rename to data", lambda: os.rename(V + "/f", "/data/f"))
t("rename to root", lambda: os.rename(V + "/f", "/f"))
t("link from outside", lambda: os.link(os.__file__, V + "/l"))
t("link to scratch", lambda: os.link(V + "/f", os.environ["TMPDIR"] + "/l"))
t("stat secret", lambda: os.stat(` + pyQuote(secret) + `) and "exists")
t("stat /etc/passwd", lambda: os.stat("/etc/passwd") and "exists")
t("mkdir /x", lambda: os.mkdir("/x"))
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/data", os.O_RDONLY)
r = libc.setns(fd, 0x00020000)
print("setns", r, errno.errorcode.get(ctypes.get_errno()))
class H(ctypes.Structure): _fields_ = [("v", ctypes.c_uint32), ("pid", ctypes.c_int)]
class D(ctypes.Structure): _fields_ = [("e", ctypes.c_uint32), ("p", ctypes.c_uint32), ("i", ctypes.c_uint32)]
d = (D * 2)()
libc.capget(ctypes.byref(H(0x20080522, 0)), ctypes.byref(d))
print("caps", [(x.e, x.p, x.i) for x in d])
`})
	requireOK(t, res)
	for _, want := range []string{
		"symlink ok", "read via symlink ENOENT", "dotdot ENOENT", "dotdot data ENOENT",
		"rename to scratch EXDEV", "rename to data EXDEV", "rename to root EXDEV",
		"link from outside EXDEV", "link to scratch EXDEV", "stat secret ENOENT", "stat /etc/passwd ENOENT",
		"mkdir /x EROFS", "setns -1 EPERM", "caps [(0, 0, 0), (0, 0, 0)]",
	} {
		require.Contains(t, res.Stdout, want+"\n")
	}
	target, err := os.Readlink(filepath.Join(out, "evil"))
	require.NoError(t, err)
	require.Equal(t, "/etc/passwd", target)
	_, err = os.Lstat(virtual)
	require.True(t, os.IsNotExist(err), "%s exists on the host", virtual)
	_, err = os.Lstat("/data")
	require.True(t, os.IsNotExist(err), "/data exists on the host")
}

// TestHostileMountNSOverlayLimit: filling an overlay past its
// write_bytes_limit fails inside the job with ENOSPC (no kill: the job
// goes on and exits 0), the host directory is unchanged, and the next
// job's overlay starts from the host directory again.
func TestHostileMountNSOverlayLimit(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/work", Mode: Overlay, WriteBytesLimit: 256 << 10}}
	res := run(t, p, Job{Mounts: mounts, Code: `
import errno, os
open("/work/f.txt", "w").write("changed")
try:
    with open("/work/big", "wb") as f:
        for _ in range(64):
            f.write(b"x" * 65536)
            f.flush()
except OSError as e:
    print("fill", errno.errorcode[e.errno])
print(open("/work/f.txt").read())
`})
	requireOK(t, res)
	require.Equal(t, "fill ENOSPC\nchanged\n", res.Stdout)
	b, err := os.ReadFile(filepath.Join(data, "f.txt"))
	require.NoError(t, err)
	require.Equal(t, "hello", string(b))
	require.NoFileExists(t, filepath.Join(data, "big"))
	res = run(t, p, Job{Mounts: mounts, Code: `import os; print(open("/work/f.txt").read(), os.path.exists("/work/big"))`})
	requireOK(t, res)
	require.Equal(t, "hello False\n", res.Stdout)
}

// TestHostileMountNSFifo: a FIFO inside a mount, and a FIFO as a mount's
// host path, hang neither the pool nor the mounter (nothing opens them
// but the job); a job that blocks opening one times out and the pool
// serves on.
func TestHostileMountNSFifo(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data, _ := nsPool(t)
	fifo := filepath.Join(data, "fifo")
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}, {HostPath: fifo, Path: "/pipe"}},
		Code: `import os, stat; print(stat.S_ISFIFO(os.stat("/pipe").st_mode)); os.close(os.open("/data/fifo", os.O_RDONLY | os.O_NONBLOCK)); print("nonblocking ok")`})
	requireOK(t, res)
	require.Equal(t, "True\nnonblocking ok\n", res.Stdout)
	res = run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Timeout: time.Second,
		Code: `open("/data/fifo").read()`})
	requireErrorType(t, res, "TimeoutError")
	res = run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `print(open("/data/f.txt").read())`})
	requireOK(t, res)
	require.Equal(t, "hello\n", res.Stdout)
}

// TestHostileMountNSSwap: the host swaps the mounted directory for a
// symlink to /etc after the checkout was accepted (its descriptor
// opened) and before the namespace is built (at the first step): the
// session sees the directory it was given.
func TestHostileMountNSSwap(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	c, err := p.Checkout(t.Context(), Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}, {HostPath: data, Path: "/work", Mode: Overlay}}})
	require.NoError(t, err)
	defer c.Finish(context.Background())
	require.NoError(t, os.Rename(data, data+".old"))
	require.NoError(t, os.Symlink("/etc", data))
	ev, err := c.Feed(t.Context(), Step{Code: `import os; print(sorted(os.listdir("/data")), sorted(os.listdir("/work")))`})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "['f.txt', 'fifo'] ['f.txt', 'fifo']\n", ev.Result.Stdout)
}

// TestHostileMountNSConcurrentScratch: two jobs with mount namespaces at
// once each get their own scratch directory, and neither can see the
// other's (it is not in its namespace); both are removed afterwards,
// though each job chmods and plants a symlink inside its own.
func TestHostileMountNSConcurrentScratch(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	requireNS(t, p)
	data := filepath.Join(p.Config().Dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	var wg sync.WaitGroup
	results := make([]*Result, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `
import os, time
d = os.environ["TMPDIR"]
open(d + "/mine", "w").write("x")
os.symlink("/etc", d + "/link")
os.mkdir(d + "/sub")
print(d)
time.sleep(0.5)
print(sorted(e for e in os.listdir(d) if e != "outputs"))
`})
		}()
	}
	wg.Wait()
	var dirs []string
	for _, res := range results {
		requireOK(t, res)
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		require.Len(t, lines, 2)
		require.Equal(t, "['link', 'mine', 'sub']", lines[1])
		dirs = append(dirs, lines[0])
	}
	require.NotEqual(t, dirs[0], dirs[1])
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}},
		Code: `import os; print([d for d in (` + pyQuote(dirs[0]) + `, ` + pyQuote(dirs[1]) + `) if d != os.environ["TMPDIR"] and os.path.lexists(d)], sorted(os.listdir(os.environ["TMPDIR"])))`})
	requireOK(t, res)
	// The scratch directory a later job may reuse was emptied first.
	require.Equal(t, "[] ['outputs']\n", res.Stdout)
	requireScratchEmpty(t, p, "scratch of namespaced jobs left behind")
}
