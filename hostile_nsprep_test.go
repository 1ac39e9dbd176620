package pynox

import (
	"github.com/pynox/pynox/internal/mountns"
	"github.com/pynox/pynox/internal/testenv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Prepared mount namespaces (issue 13's latency point): the pool's
// mounter keeps a few namespaces built from the pool's base (runtime and
// system paths, devices, /proc, the host's links, the working directory)
// and attaches a job's mounts to one of them per request, without a
// fork. The mounts it attaches are not locked to the namespace (the
// kernel locks only the mounts a namespace copied when it was made for a
// less privileged user namespace): these probes show that a job still
// cannot unmount, remount, reconfigure or clone them, sees its own
// mounts and no other job's, and that nothing is kept for a pool whose
// jobs use no mounts.

// nsMounterState is what the pool's mounter pid holds: its live children
// (builders) and its mount namespace descriptors (its own, and its stock
// of prepared namespaces).
func nsMounterState(t *testing.T, pid int) (children, mntFDs int) {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid)
	ents, err := os.ReadDir(dir + "/fd")
	require.NoError(t, err)
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "mnt:[") &&
			e.Name() != strconv.Itoa(mountns.SeedFD) {
			mntFDs++
		}
	}
	kids, _ := os.ReadFile(dir + "/task/" + strconv.Itoa(pid) + "/children")
	return len(strings.Fields(string(kids))), mntFDs
}

// nsSettle waits until the mounter pid has no builder child and holds
// want mount namespace descriptors (its stock refilled in the
// background); a wait, not a timing assertion.
func nsSettle(t *testing.T, pid, want int) {
	t.Helper()
	var kids, fds int
	for range 400 {
		// The namespaces leased to ready ns spares (see
		// hostile_nsfast_test.go) are the mounter's too until their
		// job's mounts are attached.
		if kids, fds = nsMounterState(t, pid); kids == 0 && fds == want+nsLeased(pid) {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("the mounter holds %d children and %d mount namespaces; expected none and %d (and %d leased)", kids, fds, want, nsLeased(pid))
}

// newMounter returns the pid of the one pool mounter started since
// before was taken.
func newMounter(t *testing.T, before map[int]bool) int {
	t.Helper()
	var pids []int
	for q := range mounterPids(t) {
		if !before[q] {
			pids = append(pids, q)
		}
	}
	require.Len(t, pids, 1, "expected one new mounter")
	return pids[0]
}

// A pool whose jobs use no mounts starts no mounter and so prepares
// nothing; after its first job with a mount, its mounter keeps a stock
// of nsStock() prepared namespaces (and its own) and no builder process,
// and each job with a mount leaves it that way.
func TestNSPrepStockOnlyAfterMountJob(t *testing.T) {
	before := mounterPids(t)
	p, data, _ := nsPool(t)
	for range 3 {
		requireOK(t, run(t, p, Job{Code: `print(1)`}))
	}
	for q := range mounterPids(t) {
		require.True(t, before[q], "a pool whose jobs use no mounts started a mounter")
	}
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `print(open("/data/f.txt").read())`})
	requireOK(t, res)
	pid := newMounter(t, before)
	nsSettle(t, pid, 1+p.nsStock())
	for range 3 {
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `print(open("/data/f.txt").read())`})
		requireOK(t, res)
		require.Equal(t, "hello\n", res.Stdout)
	}
	nsSettle(t, pid, 1+p.nsStock())
}

// From a job, an attached mount (a read-only bind, an overlay, a
// read-write bind) and the namespace's root cannot be unmounted,
// remounted, reconfigured (mount_setattr, also recursively on the root),
// cloned (open_tree) or moved, by the first job (whose namespace the
// mounter prepared on demand) or by the next ones (from the stock); the
// mounts are intact afterwards and still read-only.
func TestHostileNSPrepAttachedMountOps(t *testing.T) {
	t.Parallel()
	p, data, out := nsPool(t)
	for i := range 3 {
		res := run(t, p, Job{Mounts: []MountSpec{
			{HostPath: data, Path: "/data"}, {HostPath: data, Path: "/work", Mode: Overlay},
			{HostPath: out, Path: "/out", Mode: ReadWrite},
		}, Code: nsProbePrelude + `
for m in (b"/data", b"/work", b"/out", b"/"):
    raw("umount %s" % m.decode(), 166, m, 0)
    raw("umount detach %s" % m.decode(), 166, m, 2)
    raw("remount %s" % m.decode(), 165, None, m, None, 32 | 4096, None)
    attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0)  # clear MOUNT_ATTR_RDONLY
    raw("mount_setattr %s" % m.decode(), 442, -100, m, 0, ctypes.byref(attr), 32)
    raw("mount_setattr rec %s" % m.decode(), 442, -100, m, 0x8000, ctypes.byref(attr), 32)
    raw("open_tree clone %s" % m.decode(), 428, -100, m, 1 | 0x8000)
    raw("open_tree %s" % m.decode(), 428, -100, m, 0)
raw("move_mount", 429, -100, b"/data", -100, b"/out", 0)
raw("fsopen", 430, b"tmpfs", 0)
t("statvfs data ro", lambda: bool(os.statvfs("/data").f_flag & 1))
t("statvfs root ro", lambda: bool(os.statvfs("/").f_flag & 1))
t("mkdir root", lambda: os.mkdir("/evil"))
t("data intact", lambda: open("/data/f.txt").read())
t("work", lambda: open("/work/f.txt", "a").write("!"))
t("out", lambda: open("/out/o.txt", "w").write("x"))
`})
		requireOK(t, res)
		var want []string
		for _, m := range []string{"/data", "/work", "/out", "/"} {
			for _, op := range []string{"umount", "umount detach", "remount", "mount_setattr", "mount_setattr rec", "open_tree clone", "open_tree"} {
				want = append(want, op+" "+m+" EPERM")
			}
		}
		want = append(want, "move_mount EPERM", "fsopen EPERM", "statvfs data ro True", "statvfs root ro True",
			"mkdir root EROFS", "data intact hello", "work 1", "out 1")
		requireLines(t, res.Stdout, want...)
		t.Logf("job %d ok", i)
	}
	b, err := os.ReadFile(filepath.Join(data, "f.txt"))
	require.NoError(t, err)
	require.Equal(t, "hello", string(b))
}

// Jobs one after another with different host directories at the same
// path, and at different paths, see their own mount and no mountpoint of
// another; two sessions alive at once, with different directories at
// /data, see their own.
func TestHostileNSPrepCrossJob(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data, out := nsPool(t)
	require.NoError(t, os.WriteFile(filepath.Join(out, "f.txt"), []byte("other"), 0o644))
	look := `import os
print(open(P + "/f.txt").read(), [q for q in ("/data", "/other", "/work") if os.path.exists(q)])
`
	for _, c := range []struct{ host, path, want string }{
		{data, "/data", "hello ['/data']"}, {out, "/data", "other ['/data']"}, {out, "/other", "other ['/other']"},
		{data, "/work", "hello ['/work']"}, {data, "/data", "hello ['/data']"},
	} {
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: c.host, Path: c.path}}, Code: "P = " + pyQuote(c.path) + "\n" + look})
		requireOK(t, res)
		require.Equal(t, c.want+"\n", res.Stdout, "%s at %s", c.host, c.path)
	}
	a, err := p.Checkout(t.Context(), Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}})
	require.NoError(t, err)
	defer a.Finish(t.Context())
	b, err := p.Checkout(t.Context(), Job{Mounts: []MountSpec{{HostPath: out, Path: "/data"}}})
	require.NoError(t, err)
	defer b.Finish(t.Context())
	for range 2 {
		for c, want := range map[*Checkout]string{a: "hello ['/data']\n", b: "other ['/data']\n"} {
			ev, err := c.Feed(t.Context(), Step{Code: "P = '/data'\n" + look})
			require.NoError(t, err)
			requireOK(t, ev.Result)
			require.Equal(t, want, ev.Result.Stdout)
		}
	}
}

// A job whose mounts cannot be attached (a path under one of the host's
// top-level links, which the namespace holds as a link) gets a
// SandboxSetupError and runs nothing; the namespace it was attached to
// is dropped (the mounter's stock comes back to its size, with no
// namespace more), and the next job runs in a whole namespace.
func TestHostileNSPrepFailedAttach(t *testing.T) {
	testenv.Slow(t)
	before := mounterPids(t)
	p, data, _ := nsPool(t)
	var link string
	for _, l := range []string{"/lib", "/bin", "/lib64", "/sbin"} {
		if fi, err := os.Lstat(l); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			link = l
			break
		}
	}
	if link == "" {
		t.Skip("the host has no top-level symbolic link")
	}
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `print(1)`}))
	pid := newMounter(t, before)
	nsSettle(t, pid, 1+p.nsStock())
	for range 3 {
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/ok"}, {HostPath: data, Path: link + "/pynox-x"}},
			Code: `print("ran")`})
		require.NotNil(t, res.Error, "stdout: %s", res.Stdout)
		t.Log(res.Error.Message)
		require.Equal(t, "SandboxSetupError", res.Error.Type)
		require.Contains(t, res.Error.Message, "no code ran")
		require.Empty(t, res.Stdout)
	}
	nsSettle(t, pid, 1+p.nsStock())
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `import os
print(open("/data/f.txt").read(), os.path.exists("/ok"))`})
	requireOK(t, res)
	require.Equal(t, "hello False\n", res.Stdout)
}

// A grant above paths of the pool's base (/etc, above the system files
// the base binds) is mounted over them in a prepared namespace: the job
// sees the host's /etc through its grant (a file no base bind shows
// too), as a whole build would show it, and its mount beside it.
func TestNSPrepGrantOverBase(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/etc/hostname"); err != nil {
		t.Skip("no /etc/hostname")
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("hello"), 0o644))
	p := newTestPool(t, Config{Workers: 1, Dir: dir, Limits: Limits{AllowRead: []string{"/etc", dir}}})
	requireNS(t, p)
	want, err := os.ReadFile("/etc/hostname")
	require.NoError(t, err)
	for range 3 {
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, AllowRead: []string{"/etc"},
			Code: `print(open("/etc/hostname").read() == ` + pyQuote(string(want)) + `, open("/data/f.txt").read())`})
		requireOK(t, res)
		require.Equal(t, "True hello\n", res.Stdout)
	}
}
