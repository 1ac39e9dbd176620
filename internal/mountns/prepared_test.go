package mountns

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// lookScript enters the namespace (user namespace on fd 3, mount
// namespace on fd 4) and prints one JSON object: the root's entries, the
// mountpoints, and what reading or writing some paths gives.
const lookScript = `
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for fd, kind in ((3, 0x10000000), (4, 0x00020000)):
    if libc.setns(fd, kind) != 0:
        sys.exit("setns: %d" % ctypes.get_errno())
os.chdir("/")
out = {"root": sorted(os.listdir("/"))}
out["mounts"] = sorted(l.split()[4] for l in open("/proc/self/mountinfo"))
def t(name, f):
    try:
        out[name] = f()
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
for p in sys.argv[1:]:
    t("read " + p, lambda: open(p).read())
t("mkdir root", lambda: os.mkdir("/newdir"))
t("write data", lambda: open("/data/new", "w").write("x"))
print(json.dumps(out))
`

// look runs lookScript in ns.
func look(t *testing.T, ns *Namespace, read ...string) map[string]any {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", append([]string{"-I", "-S", "-c", lookScript}, read...)...)
	cmd.ExtraFiles = []*os.File{ns.User, ns.Mount}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var got map[string]any
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	return got
}

// requireMounter skips where the mounter cannot run.
func requireMounter(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the mounter needs root (CAP_SYS_ADMIN in the initial user namespace)")
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("user namespaces are disabled (user.max_user_namespaces = 0)")
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
}

// openPath opens path with O_PATH for the test's lifetime.
func openPath(t testing.TB, path string) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// dataDir makes a directory holding f.txt with text.
func dataDir(t testing.TB, text string) string {
	t.Helper()
	d := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(d, "f.txt"), []byte(text), 0o644))
	return d
}

// mounterState is what the mounter holds: its live children (builders)
// and how many mount namespace descriptors it has open (its prepared
// stock; its own namespace is opened once too; its seed namespace, at
// SeedFD, is not counted).
func mounterState(t testing.TB, m *Mounter) (children, mntFDs int) {
	t.Helper()
	pid := m.cmd.Process.Pid
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	require.NoError(t, err)
	for _, e := range ents {
		if l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "mnt:[") &&
			e.Name() != strconv.Itoa(SeedFD) {
			mntFDs++
		}
	}
	kids, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
	return len(strings.Fields(string(kids))), mntFDs
}

// settle waits until the mounter has no builder child and holds want
// mount namespace descriptors (its stock refilled), and fails after a
// generous while: this is a wait for background work, not a timing
// assertion.
func settle(t testing.TB, m *Mounter, want int) {
	t.Helper()
	var kids, fds int
	for range 400 {
		if kids, fds = mounterState(t, m); kids == 0 && fds == want {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("the mounter holds %d children and %d mount namespaces; expected none and %d", kids, fds, want)
}

// preparedMounter starts a mounter prepared with /usr and /proc
// read-only, the host's links and /srv/app, and a stock of n.
func preparedMounter(t testing.TB, n int, root int, rootSet bool) *Mounter {
	t.Helper()
	requireMounter(t)
	m, err := Start("/usr/bin/python3")
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	require.NoError(t, m.Prepare(Plan{
		Binds: []Bind{{Source: openPath(t, "/usr"), Path: "/usr", ReadOnly: true},
			{Source: openPath(t, "/proc"), Path: "/proc", ReadOnly: true}},
		Links: HostLinks(), Dirs: []string{"/srv/app"}, Root: root, RootSet: rootSet,
	}, n))
	require.True(t, m.Prepared())
	return m
}

// A prepared namespace shows the base and exactly the job's mounts: two
// jobs in a row with different directories at the same path each see
// their own, a third with a mount at another path sees no mountpoint of
// the others, all three alive at once; the root and read-only mounts
// are read-only; no namespace is handed out twice; the stock is refilled
// to n and no builder process stays.
func TestPreparedJobsSeeOwnMounts(t *testing.T) {
	m := preparedMounter(t, 2, 0, false)
	settle(t, m, 1+2)
	a, b := dataDir(t, "A"), dataDir(t, "B")
	build := func(src, path string, ro bool) *Namespace {
		ns, err := m.Build(Plan{Binds: []Bind{{Source: openPath(t, src), Path: path, ReadOnly: ro}}})
		require.NoError(t, err)
		t.Cleanup(func() { ns.Close() })
		return ns
	}
	var inodes []uint64
	for i, c := range []struct {
		src, path, want string
		absent          string
	}{{a, "/data", "A", "/other"}, {b, "/data", "B", "/other"}, {b, "/other", "B", "/data"}, {a, "/data", "A", "/other"}} {
		ns := build(c.src, c.path, true)
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(int(ns.Mount.Fd()), &st))
		require.NotContains(t, inodes, st.Ino, "a namespace handed out twice")
		inodes = append(inodes, st.Ino)
		got := look(t, ns, c.path+"/f.txt")
		t.Logf("job %d: %v", i, got)
		require.Equal(t, c.want, got["read "+c.path+"/f.txt"], "job %d", i)
		require.ElementsMatch(t, []any{"/", "/usr", "/proc", c.path}, got["mounts"], "job %d", i)
		require.NotContains(t, got["root"], strings.TrimPrefix(c.absent, "/"), "job %d sees another job's mountpoint", i)
		require.Contains(t, got["root"], "srv", "job %d", i)
		require.Equal(t, "EROFS", got["mkdir root"], "job %d", i)
		if c.path == "/data" {
			require.Equal(t, "EROFS", got["write data"], "job %d", i)
		}
	}
	settle(t, m, 1+2)
}

// A failed attach drops the namespace it was attaching to (never handed
// out) and leaks nothing: the mounter's descriptors and children come
// back to what they were, and the next job gets a whole, fresh namespace.
// A mount path beneath a base bind (/usr/x: its mountpoint would be made
// in the host's /usr) is refused without making anything there.
func TestPreparedAttachFailure(t *testing.T) {
	m := preparedMounter(t, 2, 0, false)
	settle(t, m, 1+2)
	pid := strconv.Itoa(m.cmd.Process.Pid)
	countFDs := func() int {
		ents, err := os.ReadDir("/proc/" + pid + "/fd")
		require.NoError(t, err)
		return len(ents)
	}
	fds := countFDs()
	a := dataDir(t, "A")
	src := openPath(t, a)
	for _, bad := range [][]Bind{
		{{Source: src, Path: "/fine", ReadOnly: true}, {Source: src, Path: "/usr/pynox-x", ReadOnly: true}},
		{{Source: src, Path: "/x/../etc", ReadOnly: true}},
		{{Source: src, Path: "/lib/x", ReadOnly: true}},
	} {
		_, err := m.Build(Plan{Binds: bad})
		require.Error(t, err)
		t.Log(err)
	}
	_, err := os.Stat("/usr/pynox-x")
	require.True(t, os.IsNotExist(err), "a mountpoint was made on the host")
	settle(t, m, 1+2)
	require.Equal(t, fds, countFDs(), "the mounter's descriptors leak")
	ns, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
	require.NoError(t, err)
	defer ns.Close()
	got := look(t, ns, "/data/f.txt")
	require.Equal(t, "A", got["read /data/f.txt"])
	require.ElementsMatch(t, []any{"/", "/usr", "/proc", "/data"}, got["mounts"])
	require.NotContains(t, got["root"], "fine", "a failed attach's mount is in another namespace")
}

// In a shared root (a clone of one tmpfs for every namespace), the
// mountpoints a job's attach made are removed once its namespace is
// gone, those of a failed attach at the next request, and those of a
// live namespace or of the prepared stock's base never.
func TestPreparedSharedRootCollect(t *testing.T) {
	requireMounter(t)
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.FsconfigCreate(fsfd))
	base, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	unix.Close(fsfd)
	require.NoError(t, err)
	defer unix.Close(base)
	exists := func(rel string) bool {
		var st unix.Stat_t
		return unix.Fstatat(base, rel, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	}
	m := preparedMounter(t, 2, base, true)
	src := openPath(t, dataDir(t, "A"))
	keep, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/keep/x", ReadOnly: true}}})
	require.NoError(t, err)
	gone, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/gone/x", ReadOnly: true}}})
	require.NoError(t, err)
	require.True(t, exists("gone/x"))
	gone.Close()
	_, err = m.Build(Plan{Binds: []Bind{{Source: src, Path: "/failed/x", ReadOnly: true}, {Source: src, Path: "/usr/y", ReadOnly: true}}})
	require.Error(t, err)
	other, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/other", ReadOnly: true}}})
	require.NoError(t, err)
	defer other.Close()
	got := look(t, other, "/other/f.txt")
	require.Equal(t, "A", got["read /other/f.txt"])
	for _, p := range []string{"keep/x", "usr", "proc", "srv/app", "other"} {
		require.True(t, exists(p), "%s was removed", p)
	}
	require.False(t, exists("gone"), "a gone namespace's mountpoint stayed")
	require.False(t, exists("failed"), "a failed attach's mountpoint stayed")
	// In the kept namespace, /keep/x is still its mount.
	got = look(t, keep, "/keep/x/f.txt")
	require.Equal(t, "A", got["read /keep/x/f.txt"])
	keep.Close()
}

// Prepare's input is checked, and a second Prepare is refused.
func TestPrepareRefusals(t *testing.T) {
	m := preparedMounter(t, 1, 0, false)
	require.ErrorContains(t, m.Prepare(Plan{}, 1), "prepared already")
	m2, err := Start("/usr/bin/python3")
	require.NoError(t, err)
	defer m2.Close()
	require.ErrorContains(t, m2.Prepare(Plan{}, 0), "expected 1 to")
	require.ErrorContains(t, m2.Prepare(Plan{Overlays: []Overlay{{Lower: 0, Path: "/x", Limit: 1}}}, 1), "no overlays")
	require.ErrorContains(t, m2.Prepare(Plan{Dirs: []string{"/a/../b"}}, 1), "/a/../b")
	_, err = m.Build(Plan{Links: HostLinks()})
	require.ErrorContains(t, err, "job's part only")
}

// buildLatency builds namespaces like a job with one read-only virtual
// mount (/data) on top of a pool's base, with m prepared or not, and
// reports the median and the spread of the round trips.
func buildLatency(b *testing.B, prepared bool) {
	requireMounter(b)
	m, err := Start("/usr/bin/python3")
	require.NoError(b, err)
	defer m.Close()
	data := openPath(b, dataDir(b, "A"))
	// Like a pool's base: the runtime, /proc, the devices and the system
	// files a job may read.
	base := Plan{Links: HostLinks(), Dirs: []string{"/srv/app"}}
	for _, p := range []string{"/usr", "/proc", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/etc/hosts",
		"/etc/resolv.conf", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/gai.conf", "/etc/services", "/etc/protocols",
		"/etc/ld.so.cache", "/etc/ssl/certs"} {
		if _, err := os.Stat(p); err == nil {
			base.Binds = append(base.Binds, Bind{Source: openPath(b, p), Path: p, ReadOnly: !strings.HasPrefix(p, "/dev/")})
		}
	}
	job := Plan{Binds: []Bind{{Source: data, Path: "/data", ReadOnly: true}}}
	if prepared {
		require.NoError(b, m.Prepare(base, 2))
	} else {
		job.Binds = append(slices.Clone(base.Binds), job.Binds...)
		job.Links, job.Dirs = base.Links, base.Dirs
	}
	var ds []time.Duration
	if prepared {
		settle(b, m, 1+2)
	}
	cpu0 := mounterCPU(b, m)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		ns, err := m.Build(job)
		ds = append(ds, time.Since(t0))
		require.NoError(b, err)
		ns.Close()
		if prepared {
			// A job runs between two builds: the mounter refills its stock
			// meanwhile (measured apart: the refill is off the path).
			b.StopTimer()
			for range 200 {
				if _, n := mounterState(b, m); n == 3 {
					break
				}
				time.Sleep(time.Millisecond)
			}
			b.StartTimer()
		}
	}
	if prepared {
		b.StopTimer()
		settle(b, m, 1+2)
	}
	// The mounter's CPU per namespace (its builder children's, reaped,
	// included): the build in the background and the attach.
	b.ReportMetric(float64((mounterCPU(b, m)-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/ns")
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(ds[len(ds)/10].Microseconds())/1000, "p10-ms")
	b.ReportMetric(float64(ds[len(ds)*9/10].Microseconds())/1000, "p90-ms")
}

// BenchmarkBuildWhole and BenchmarkBuildPrepared measure the round trip
// of Build for a job with one read-only virtual mount, built whole (a
// builder process forked for it) or attached to a prepared namespace.
func BenchmarkBuildWhole(b *testing.B)    { buildLatency(b, false) }
func BenchmarkBuildPrepared(b *testing.B) { buildLatency(b, true) }

// In a shared root, the mounter's collection of unused mountpoints (at
// each request) never removes the base's, which a prepared namespace
// being built in the background needs even while no live namespace
// uses them (the stock taken, every job's namespace gone): jobs one
// right after another, each closing its namespace at once, all get one
// with the base's mounts.
func TestPreparedSharedRootBaseKept(t *testing.T) {
	requireMounter(t)
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.FsconfigCreate(fsfd))
	base, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	unix.Close(fsfd)
	require.NoError(t, err)
	defer unix.Close(base)
	m := preparedMounter(t, 1, base, true)
	src := openPath(t, dataDir(t, "A"))
	job := Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}}
	for i := range 12 {
		settle(t, m, 1+1)
		// The first takes the stock and the mounter starts building the
		// next; once the first is gone, the second's request comes while
		// that build runs (a while after it started: i/4 ms).
		ns, err := m.Build(job)
		require.NoError(t, err, "job %d", i)
		ns.Close()
		time.Sleep(time.Duration(i) * time.Millisecond / 4)
		ns, err = m.Build(job)
		require.NoError(t, err, "job %d", i)
		got := look(t, ns, "/data/f.txt")
		ns.Close()
		require.Equal(t, "A", got["read /data/f.txt"], "job %d", i)
		require.ElementsMatch(t, []any{"/", "/usr", "/proc", "/data"}, got["mounts"], "job %d", i)
		require.Contains(t, got["root"], "srv", "job %d", i)
	}
}
