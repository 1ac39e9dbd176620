package pynox

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/mountns"
	"github.com/pynox/pynox/internal/testenv"
)

// An outside review of per-job mount namespaces (issue 13): each test is
// a probe by a job that holds a mount namespace, against real python3
// under the real sandbox. The probes that found nothing stay as
// regression tests.

// nsProbePrelude defines t(name, f), which prints "name ok", "name <value>"
// or "name <ERRNO>", and raw(name, nr, *args), which prints the errno of
// a raw system call (or "ok" when it succeeded).
const nsProbePrelude = `
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def t(name, f):
    try:
        r = f()
        print(name, "ok" if r is None else r)
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
def raw(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *args)
    print(name, "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
`

// requireLines asserts that out holds each of want as a whole line.
func requireLines(t *testing.T, out string, want ...string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	for _, w := range want {
		require.Contains(t, lines, w, "stdout:\n%s", out)
	}
}

// Probes 1-3: after entering, every capability set is empty (the
// bounding and ambient sets too), no_new_privs holds and both seccomp
// layers are attached; the job's own ids are unmapped (65534) in the
// user namespace, whose map is the one id no file has. It cannot raise a
// capability again (capset, ambient raise, dropping from the bounding
// set), enter a namespace again (setns of its own user or mount
// namespace), make one (unshare, clone with CLONE_NEWUSER, clone3), take
// other ids (setuid, setresuid, setgroups), or rewrite its id maps.
func TestHostileReviewNS2Capabilities(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: nsProbePrelude + `
print("ids", os.getuid(), os.geteuid(), os.getgid())
libc.prctl.restype = ctypes.c_int
print("nnp", libc.prctl(39, 0, 0, 0, 0), "seccomp", libc.prctl(21, 0, 0, 0, 0))
print("bnd", [c for c in range(64) if libc.prctl(23, c, 0, 0, 0) == 1])
print("amb", [c for c in range(64) if libc.prctl(47, 1, c, 0, 0) == 1])
t("read uid_map", lambda: open("/proc/self/uid_map").read().split())
class H(ctypes.Structure): _fields_ = [("v", ctypes.c_uint32), ("pid", ctypes.c_int)]
class D(ctypes.Structure): _fields_ = [("e", ctypes.c_uint32), ("p", ctypes.c_uint32), ("i", ctypes.c_uint32)]
d = (D * 2)()
for x in d:
    x.e = x.p = x.i = 0xFFFFFFFF
libc.syscall(125, ctypes.byref(H(0x20080522, 0)), ctypes.byref(d))
print("capget", [(x.e, x.p, x.i) for x in d])
d = (D * 2)()
for x in d:
    x.e = x.p = x.i = 0xFFFFFFFF
raw("capset all", 126, ctypes.byref(H(0x20080522, 0)), ctypes.byref(d))
d = (D * 2)()
d[0].e = d[0].p = 1 << 21  # CAP_SYS_ADMIN
raw("capset sys_admin", 126, ctypes.byref(H(0x20080522, 0)), ctypes.byref(d))
raw("ambient raise", 157, 47, 2, 21, 0, 0)
raw("bset drop", 157, 24, 0, 0, 0, 0)
raw("keepcaps", 157, 8, 1, 0, 0, 0)
raw("securebits", 157, 28, 0, 0, 0, 0)
ufd = os.open("/proc/self/ns/user", os.O_RDONLY)
mfd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
raw("setns user", 308, ufd, 0x10000000)
raw("setns mnt", 308, mfd, 0x00020000)
raw("setns any", 308, mfd, 0)
raw("unshare user", 272, 0x10000000)
raw("unshare mnt", 272, 0x00020000)
raw("unshare uts", 272, 0x04000000)
raw("unshare net", 272, 0x40000000)
raw("clone newuser", 56, 0x10000000 | 17, 0, 0, 0, 0)
raw("clone newns", 56, 0x00020000 | 17, 0, 0, 0, 0)
raw("clone3", 435, 0, 0)
raw("setuid 0", 105, 0)
raw("setuid nobody", 105, 65534)
raw("setresuid", 117, 4294967294, 4294967294, 4294967294)
raw("setgroups", 116, 0, 0)
t("write uid_map", lambda: open("/proc/self/uid_map", "w").write("0 0 1"))
t("write setgroups", lambda: open("/proc/self/setgroups", "w").write("deny"))
`})
	requireOK(t, res)
	requireLines(t, res.Stdout,
		"capget [(0, 0, 0), (0, 0, 0)]", "nnp 1 seccomp 2", "bnd []", "amb []",
		"ids 65534 65534 65534",
		"capset all EPERM", "capset sys_admin EPERM", "ambient raise EPERM", "bset drop EPERM",
		"setns user EPERM", "setns mnt EPERM", "setns any EPERM",
		"unshare user EPERM", "unshare mnt EPERM", "unshare uts EPERM", "unshare net EPERM",
		"clone newuser EPERM", "clone newns EPERM", "clone3 ENOSYS",
		"setuid 0 EPERM", "setuid nobody EPERM", "setresuid EPERM", "setgroups EPERM",
	)
	// /proc is read-only in the namespace; the map files refuse either way.
	for _, name := range []string{"write uid_map", "write setgroups"} {
		require.Regexp(t, "(?m)^"+name+" (EROFS|EPERM|EACCES)$", res.Stdout)
	}
	// Landlock gives the job no read of /proc/self/uid_map (nor of
	// /proc/self/status); where it did, the map is the one id no file has.
	require.Regexp(t, `(?m)^read uid_map (EACCES|\['0', '4294967294', '1'\])$`, res.Stdout)
}

// Probes 4-7: the mount family from inside. Unmounting a bind (to see
// what is under it), detaching the root, remounting a read-only bind
// read-write, mount_setattr, open_tree, move_mount, fsopen, pivot_root
// and chroot all fail; mknod of a device or an overlay whiteout, and the
// trusted.overlay.* (or any) extended attributes fail; sethostname and
// writing a sysctl fail. Afterwards the binds are intact and the host is
// unchanged.
func TestHostileReviewNS2MountOps(t *testing.T) {
	t.Parallel()
	p, data, out := nsPool(t)
	host, err := os.Hostname()
	require.NoError(t, err)
	res := run(t, p, Job{Mounts: []MountSpec{
		{HostPath: data, Path: "/data"}, {HostPath: data, Path: "/work", Mode: Overlay},
		{HostPath: out, Path: "/out", Mode: ReadWrite},
	}, Code: nsProbePrelude + `
raw("umount data", 166, b"/data", 0)
raw("umount data detach", 166, b"/data", 2)
raw("umount work detach", 166, b"/work", 2)
raw("umount root detach", 166, b"/", 2)
raw("umount proc", 166, b"/proc", 2)
MS_REMOUNT, MS_BIND, MS_RDONLY = 32, 4096, 1
raw("remount data rw", 165, None, b"/data", None, MS_REMOUNT | MS_BIND, None)
raw("remount root rw", 165, None, b"/", None, MS_REMOUNT | MS_BIND, None)
raw("mount tmpfs", 165, b"none", b"/data", b"tmpfs", 0, None)
raw("bind out over data", 165, b"/out", b"/data", None, MS_BIND, None)
attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0)  # clear MOUNT_ATTR_RDONLY
raw("mount_setattr", 442, -100, b"/data", 0, ctypes.byref(attr), 32)
raw("open_tree", 428, -100, b"/data", 1)
raw("move_mount", 429, -100, b"/out", -100, b"/data", 0)
raw("fsopen", 430, b"tmpfs", 0)
raw("fspick", 433, -100, b"/data", 0)
raw("pivot_root", 155, b"/out", b"/out")
raw("chroot", 161, b"/out")
raw("mknod chr", 133, b"/out/null", 0o20666, 0x103)
raw("mknod whiteout", 133, b"/work/f.txt.wh", 0o20000, 0)
raw("mknod fifo", 133, b"/out/fifo", 0o10666, 0)
raw("setxattr opaque", 188, b"/work", b"trusted.overlay.opaque", b"y", 1, 0)
raw("setxattr redirect", 188, b"/work", b"trusted.overlay.redirect", b"/etc", 4, 0)
raw("setxattr user", 188, b"/out", b"user.x", b"y", 1, 0)
raw("sethostname", 170, b"evil", 4)
t("sysctl", lambda: open("/proc/sys/kernel/hostname", "w").write("evil"))
t("statvfs data ro", lambda: bool(os.statvfs("/data").f_flag & 1))
t("data intact", lambda: open("/data/f.txt").read())
t("work intact", lambda: open("/work/f.txt").read())
`})
	requireOK(t, res)
	requireLines(t, res.Stdout,
		"umount data EPERM", "umount data detach EPERM", "umount work detach EPERM", "umount root detach EPERM",
		"umount proc EPERM", "remount data rw EPERM", "remount root rw EPERM", "mount tmpfs EPERM",
		"bind out over data EPERM", "mount_setattr EPERM", "open_tree EPERM", "move_mount EPERM", "fsopen EPERM",
		"fspick EPERM", "pivot_root EPERM", "chroot EPERM", "mknod chr EPERM", "mknod whiteout EPERM",
		"setxattr opaque EPERM", "setxattr redirect EPERM", "setxattr user EPERM", "sethostname EPERM",
		"statvfs data ro True", "data intact hello", "work intact hello",
	)
	require.Regexp(t, `(?m)^sysctl (EROFS|EACCES|EPERM)$`, res.Stdout)
	h, err := os.Hostname()
	require.NoError(t, err)
	require.Equal(t, host, h)
	ents, err := os.ReadDir(out)
	require.NoError(t, err)
	for _, e := range ents {
		require.NotEqual(t, "null", e.Name(), "a device node appeared on the host")
	}
}

// mounterPids lists the pool mounters (python3 running builder.py) that
// are children of this test process.
func mounterPids(t *testing.T) map[int]bool {
	t.Helper()
	pids := map[int]bool{}
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(os.Getpid()) || f[0] == "Z" {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if bytes.Contains(cmd, []byte("pynox mount-namespace builder")) {
			pids[pid] = true
		}
	}
	return pids
}

// hostMounts returns the mounts of this process's mount namespace, by
// mount id, leaving out every pool's scratch tmpfs (scratch.go: pools of
// other tests, in this process or beside it, make and remove theirs).
func hostMounts(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && !strings.Contains(line, "/"+scratchPrefix) {
			m[f[0]] = line
		}
	}
	return m
}

// hostMountsAdded returns the mounts in after that are not in before
// and that a pool's mounter could have left: an overlay, or a mount at
// one of paths (a job's virtual paths and host directories). Other
// tests, in this process or beside it, mount and unmount their own file
// systems meanwhile: those are not the pool's.
func hostMountsAdded(before, after map[string]string, paths ...string) []string {
	var added []string
	for id, line := range after {
		if _, ok := before[id]; ok {
			continue
		}
		f := strings.Fields(line)
		mine := strings.Contains(line, " - overlay ")
		for _, p := range paths {
			mine = mine || f[4] == p || strings.HasPrefix(f[4], p+"/")
		}
		if mine {
			added = append(added, line)
		}
	}
	return added
}

// Probes 8-10: the mounter (real root, unconfined) from a job with a
// namespace: the job can neither signal it nor read its /proc entries
// (command line, environment, descriptors, namespaces), nor reach its
// socket (a socket pair: no name to connect to). A job with a namespace
// that tried goes on, the mounter survives, and the next namespace is
// built.
func TestHostileReviewNS2Mounter(t *testing.T) {
	p, data, _ := nsPool(t)
	before := mounterPids(t)
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `print("ok")`})
	requireOK(t, res)
	var pid int
	for q := range mounterPids(t) {
		if !before[q] {
			pid = q
		}
	}
	require.NotZero(t, pid, "the pool's mounter was not found")
	res = run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: nsProbePrelude + `
import signal, socket
P = ` + strconv.Itoa(pid) + `
t("visible", lambda: os.path.exists("/proc/%d" % P))
t("kill 0", lambda: os.kill(P, 0))
t("kill term", lambda: os.kill(P, signal.SIGTERM))
t("kill kill", lambda: os.kill(P, signal.SIGKILL))
t("kill stop", lambda: os.kill(P, signal.SIGSTOP))
t("cmdline", lambda: len(open("/proc/%d/cmdline" % P, "rb").read()))
t("environ", lambda: len(open("/proc/%d/environ" % P, "rb").read()))
t("fds", lambda: len(os.listdir("/proc/%d/fd" % P)))
t("fd 3", lambda: os.open("/proc/%d/fd/3" % P, os.O_RDWR))
t("ns mnt", lambda: os.open("/proc/%d/ns/mnt" % P, os.O_RDONLY))
t("root", lambda: os.listdir("/proc/%d/root/" % P))
t("mem", lambda: os.open("/proc/%d/mem" % P, os.O_RDONLY))
pfd = libc.syscall(434, P, 0)
print("pidfd_open", "ok" if pfd >= 0 else errno.errorcode.get(ctypes.get_errno()))
raw("ptrace attach", 101, 16, P, 0, 0)
`})
	requireOK(t, res)
	t.Log(res.Stdout)
	for _, name := range []string{"kill 0", "kill term", "kill kill", "kill stop"} {
		require.Regexp(t, "(?m)^"+name+" (ESRCH|EPERM)$", res.Stdout)
	}
	for _, name := range []string{"cmdline", "environ", "fds", "fd 3", "ns mnt", "root", "mem", "pidfd_open", "ptrace attach"} {
		require.Regexp(t, "(?m)^"+name+" (ENOENT|EACCES|EPERM|ESRCH)$", res.Stdout)
	}
	require.True(t, mounterPids(t)[pid], "the mounter is gone")
	// The same number of grants without a namespace.
	var reads []string
	for i := range 64 {
		d := filepath.Join(p.Config().Dir, "r"+strconv.Itoa(i))
		require.NoError(t, os.Mkdir(d, 0o755))
		reads = append(reads, d)
	}
	res = run(t, p, Job{AllowRead: reads, Code: `import os; print(len(os.listdir(` + pyQuote(reads[63]) + `)))`})
	requireOK(t, res)
	require.Equal(t, "0\n", res.Stdout)
	res = run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `print(open("/data/f.txt").read())`})
	requireOK(t, res)
	require.Equal(t, "hello\n", res.Stdout)
}

// Probe 11: closing the pool leaves no mounter, no builder and no
// mount behind on the host.
func TestHostileReviewNS2CloseLeavesNothing(t *testing.T) {
	before := mounterPids(t)
	mounts := hostMounts(t)
	p, data, _ := nsPool(t)
	for range 2 {
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}, {HostPath: data, Path: "/work", Mode: Overlay}},
			Code: `open("/work/x", "w").write("x")`})
		requireOK(t, res)
	}
	c, err := p.Checkout(t.Context(), Job{Mounts: []MountSpec{{HostPath: data, Path: "/work", Mode: Overlay}}})
	require.NoError(t, err)
	ev, err := c.Feed(t.Context(), Step{Code: `open("/work/y", "w").write("y")`})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	var ours []int
	for q := range mounterPids(t) {
		if !before[q] {
			ours = append(ours, q)
		}
	}
	require.NotEmpty(t, ours)
	scratch := p.scratch.path
	require.NoError(t, p.Close()) // with the session still open
	mi, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	require.NotContains(t, string(mi), " "+scratch+" ", "the pool's scratch tmpfs left mounted")
	for _, q := range ours {
		_, err := os.Stat("/proc/" + strconv.Itoa(q))
		require.True(t, os.IsNotExist(err), "mounter %d left running after Close", q)
	}
	require.Empty(t, hostMountsAdded(mounts, hostMounts(t), "/data", "/work", data, p.Config().Dir, scratch), "mounts left on the host")
}

// Probes 12-14: mount paths that name the runtime, the system or the
// namespace's own structure: /proc, /dev, /dev/null, /usr, the
// interpreter's standard library, /etc, the pool's working directory,
// the scratch directory, /lib (a top-level symbolic link) and a path
// under it, and the same with "..", "//" and a trailing slash. Each is
// refused before any code runs, or, where accepted, shows the mount
// there and nothing of the runtime changes (the job still runs the
// host's standard library).
func TestHostileReviewNS2Paths(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data, _ := nsPool(t)
	stdlib := filepath.Dir(strings.TrimSpace(run(t, p, Job{Code: `import os; print(os.__file__)`}).Stdout))
	scratch := p.Mounts().Scratch
	for _, path := range []string{
		"/proc", "/proc/self", "/dev", "/dev/null", "/usr", stdlib, "/usr/lib/x/../../bin",
		"/lib", "/lib/x", "/lib64", "/bin", p.Config().Dir, scratch, scratch + "/x", "//usr//", "/usr/",
		"/etc", "/etc/passwd", "/tmp", "/data/../usr",
	} {
		if path == "" {
			continue
		}
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: path}},
			Code: `import os, json; print(os.__file__, os.path.exists("/usr/bin"), sorted(os.listdir(` + pyQuote(path) + `)))`})
		if res.Error != nil {
			require.Contains(t, []string{"RequestError", "SandboxSetupError"}, res.Error.Type, "%s: %+v", path, res.Error)
			require.Contains(t, res.Error.Message, "no code ran", "%s: %+v", path, res.Error)
			t.Logf("%s: refused: %s", path, res.Error.Message)
			continue
		}
		t.Logf("%s: accepted: %s", path, res.Stdout)
		// Accepted: the host directory is what the job sees there, and
		// the standard library is still the host's.
		requireOK(t, res)
		require.True(t, strings.HasPrefix(res.Stdout, stdlib+"/os.py True ['f.txt', 'fifo']"), "%s: %s", path, res.Stdout)
	}
}

// Probe 15: overlay escapes. A rename of a directory the overlay shows
// from its lower layer (redirect_dir), a hard link from the overlay to a
// read-write mount and back, a symlink planted in the overlay and read
// through, and opening a lower file for writing (copy-up) change nothing
// on the host and reach nothing outside.
func TestHostileReviewNS2OverlayEscape(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data, out := nsPool(t)
	require.NoError(t, os.Mkdir(filepath.Join(data, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "sub", "s.txt"), []byte("sub"), 0o644))
	res := run(t, p, Job{Mounts: []MountSpec{
		{HostPath: data, Path: "/work", Mode: Overlay}, {HostPath: out, Path: "/out", Mode: ReadWrite},
	}, Code: nsProbePrelude + `
t("rename dir", lambda: os.rename("/work/sub", "/work/moved"))
t("read moved", lambda: open("/work/moved/s.txt").read())
t("link to out", lambda: os.link("/work/f.txt", "/out/l"))
open("/out/o.txt", "w").write("o")
t("link from out", lambda: os.link("/out/o.txt", "/work/l"))
t("symlink", lambda: os.symlink("/proc/1/root/etc/passwd", "/work/evil"))
t("read evil", lambda: len(open("/work/evil").read()))
t("symlink up", lambda: os.symlink("../../../../etc/shadow", "/work/up"))
t("read up", lambda: len(open("/work/up").read()))
with open("/work/f.txt", "r+") as f:
    f.write("HELLO")
t("copy up", lambda: open("/work/f.txt").read())
t("unlink lower", lambda: os.unlink("/work/sub/s.txt") if os.path.exists("/work/sub") else None)
`})
	requireOK(t, res)
	requireLines(t, res.Stdout, "rename dir EXDEV", "link to out EXDEV", "link from out EXDEV", "copy up HELLO")
	require.Regexp(t, `(?m)^read evil (ENOENT|EACCES|EPERM|ELOOP)$`, res.Stdout)
	require.Regexp(t, `(?m)^read up (ENOENT|EACCES|EPERM)$`, res.Stdout)
	b, err := os.ReadFile(filepath.Join(data, "f.txt"))
	require.NoError(t, err)
	require.Equal(t, "hello", string(b))
	b, err = os.ReadFile(filepath.Join(data, "sub", "s.txt"))
	require.NoError(t, err)
	require.Equal(t, "sub", string(b))
	ents, err := os.ReadDir(data)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, []string{"f.txt", "fifo", "sub"}, names)
}

// Probe 16: a job with a namespace sees no more of /proc than a job
// without one: the pool's and the mounter's /proc entries are as
// visible (by stat, which Landlock does not mediate) and as unreadable.
func TestHostileReviewNS2Proc(t *testing.T) {
	p, data, _ := nsPool(t)
	before := mounterPids(t)
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `pass`}))
	var mounter int
	for q := range mounterPids(t) {
		if !before[q] {
			mounter = q
		}
	}
	require.NotZero(t, mounter)
	code := nsProbePrelude + `
for name, q in (("pool", ` + strconv.Itoa(os.Getpid()) + `), ("mounter", ` + strconv.Itoa(mounter) + `), ("init", 1)):
    t(name + " stat", lambda: os.path.exists("/proc/%d" % q))
    t(name + " status", lambda: len(open("/proc/%d/status" % q).read()) > 0)
    t(name + " mountinfo", lambda: len(open("/proc/%d/mountinfo" % q).read()) > 0)
t("self mountinfo", lambda: len(open("/proc/self/mountinfo").read()) > 0)
t("list proc", lambda: len(os.listdir("/proc")) > 0)
`
	plain := run(t, p, Job{Code: code})
	requireOK(t, plain)
	ns := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: code})
	requireOK(t, ns)
	t.Logf("without:\n%s\nwith:\n%s", plain.Stdout, ns.Stdout)
	require.Equal(t, plain.Stdout, ns.Stdout)
	require.NotContains(t, ns.Stdout, "mountinfo True")
	require.NotContains(t, ns.Stdout, "status True")
}

// Probe 17: many mounts in one request (a slow build holding the
// mounter, which serves one request at a time) are bounded: more than
// the pool's limit of paths is a RequestError before anything is built,
// and 64 read-only virtual mounts (with the runtime's own binds more
// descriptors than the mounter used to take in one message: the rest
// were cut off and the job refused with "list index out of range") run;
// the pool serves on.
func TestHostileReviewNS2ManyMounts(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	var mounts []MountSpec
	for i := range 300 {
		mounts = append(mounts, MountSpec{HostPath: data, Path: "/m/" + strconv.Itoa(i), Mode: Overlay, WriteBytesLimit: 1 << 30})
	}
	res := run(t, p, Job{Mounts: mounts, Code: `print("ran")`})
	requireErrorType(t, res, "RequestError")
	require.Empty(t, res.Stdout)
	mounts = mounts[:0]
	for i := range 64 {
		mounts = append(mounts, MountSpec{HostPath: data, Path: "/m/" + strconv.Itoa(i)})
	}
	res = run(t, p, Job{Mounts: mounts, Code: `import os; print(len(os.listdir("/m/63")))`})
	requireOK(t, res)
	require.Equal(t, "2\n", res.Stdout)
	res = run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `print(open("/data/f.txt").read())`})
	requireOK(t, res)
	require.Equal(t, "hello\n", res.Stdout)
}

// Probe 18: a job with a namespace holds no descriptor of a directory
// (from which ".." would lead to the host's tree that the namespace
// hides), and cannot list the namespace's own root or working directory
// (whose entries, in a pool that confines itself, are mountpoint names
// shared by every namespace of the pool: its own Landlock layer has no
// rule on them).
func TestHostileReviewNS2Descriptors(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/srv/a/data"}}, Code: nsProbePrelude + `
import stat
dirs = []
for fd in range(0, 1024):
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            dirs.append(fd)
    except OSError:
        pass
print("dir descriptors", dirs)
t("list root", lambda: sorted(os.listdir("/")))
t("list srv", lambda: sorted(os.listdir("/srv")))
t("list cwd", lambda: os.listdir("."))
t("up from cwd", lambda: os.stat("../../../../../etc/passwd") and "exists")
t("data", lambda: sorted(os.listdir("/srv/a/data")))
`})
	requireOK(t, res)
	requireLines(t, res.Stdout, "dir descriptors []", "list root EACCES", "list srv EACCES", "list cwd EACCES",
		"up from cwd ENOENT", "data ['f.txt', 'fifo']")
}

// Probe 19: in a pool that confines itself every namespace's root is a
// clone of one shared tmpfs (65536 inodes), and the mountpoints the
// mounter made in it for a request stayed there for good: three requests
// with a mount path of 32000 components filled it (here: four of 300, in
// a tmpfs of 1024 inodes), and every later
// namespace that needed a new mountpoint (a new virtual path, a new
// scratch directory) failed with ENOSPC for every tenant. Now the
// mounter removes the mountpoints no live namespace uses (at its next
// request), never one a live namespace still uses.
func TestHostileReviewNS2SharedRootInodes(t *testing.T) {
	if why := nsMachineObstacles(); len(why) > 0 {
		t.Skipf("no mount namespaces here: %v", why)
	}
	// Like the pool's (newBaseTmpfs), with fewer inodes, to fill it fast.
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.FsconfigSetString(fsfd, "nr_inodes", "1024"))
	require.NoError(t, unix.FsconfigCreate(fsfd))
	base, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	unix.Close(fsfd)
	require.NoError(t, err)
	defer unix.Close(base)
	m, err := mountns.Start(nsPython)
	require.NoError(t, err)
	defer m.Close()
	src, err := unix.Open(t.TempDir(), unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(src)
	build := func(path string) (*mountns.Namespace, error) {
		return m.Build(mountns.Plan{Binds: []mountns.Bind{{Source: src, Path: path, ReadOnly: true}}, Root: base, RootSet: true})
	}
	exists := func(rel string) bool {
		var st unix.Stat_t
		return unix.Fstatat(base, rel, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	}
	// A live namespace's mountpoints stay, whatever comes after.
	keep, err := build("/keep/x")
	require.NoError(t, err)
	for _, c := range "abcd" {
		ns, err := build("/" + string(c) + strings.Repeat("/a", 300))
		if err == nil {
			ns.Close()
		}
	}
	ns, err := build("/fresh")
	require.NoError(t, err, "a new mountpoint after deep requests")
	ns.Close()
	var st unix.Statfs_t
	require.NoError(t, unix.Fstatfs(base, &st))
	require.Greater(t, st.Ffree, uint64(1000), "inodes of the shared root left in use")
	require.True(t, exists("keep/x"), "a live namespace's mountpoint was removed")
	require.False(t, exists("a"), "a gone namespace's mountpoints stayed")
	// A process in the namespace keeps it (and its mountpoints) after the
	// descriptors are closed, as a job's process does after the pool's.
	cmd := exec.Command(nsPython, "-I", "-S", "-c", `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for fd, kind in ((3, 0x10000000), (4, 0x00020000)):
    if libc.setns(fd, kind) != 0:
        sys.exit("setns: %d" % ctypes.get_errno())
os.close(3); os.close(4)
print(os.path.isdir("/keep/x"), flush=True)
sys.stdin.read()
`)
	cmd.ExtraFiles = []*os.File{keep.User, keep.Mount}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line := make([]byte, 5)
	_, err = io.ReadFull(stdout, line)
	require.NoError(t, err)
	require.Equal(t, "True\n", string(line))
	keep.Close()
	for range 3 {
		ns, err := build("/other")
		require.NoError(t, err)
		ns.Close()
	}
	require.True(t, exists("keep/x"), "the mountpoint of a namespace a process is in was removed")
	// Once the namespace is gone its mountpoints go too (at a later
	// request; the kernel frees a namespace when its last user is gone).
	stdin.Close()
	require.NoError(t, cmd.Wait())
	for i := 0; i < 50 && exists("keep"); i++ {
		ns, err := build("/other")
		require.NoError(t, err)
		ns.Close()
	}
	require.False(t, exists("keep"), "a gone namespace's mountpoint stayed")
}
