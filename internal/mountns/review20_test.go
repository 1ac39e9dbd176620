package mountns

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// manyBindsMounter prepares a mounter whose base has 240 binds (a build of many
// milliseconds, so that requests come during a refill) and a stock of n.
func manyBindsMounter(t *testing.T, n int) *Mounter {
	t.Helper()
	requireMounter(t)
	dir := t.TempDir()
	var binds []Bind
	for i := range 240 {
		f := filepath.Join(dir, "f"+strconv.Itoa(i))
		require.NoError(t, os.WriteFile(f, []byte(strconv.Itoa(i)), 0o644))
		binds = append(binds, Bind{Source: openPath(t, f), Path: "/f/" + strconv.Itoa(i), ReadOnly: true})
	}
	m, err := Start("/usr/bin/python3")
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	require.NoError(t, m.Prepare(Plan{Binds: append(binds, Bind{Source: openPath(t, "/usr"), Path: "/usr", ReadOnly: true},
		Bind{Source: openPath(t, "/proc"), Path: "/proc", ReadOnly: true}), Links: HostLinks()}, n))
	if _, _, on, seed := mounterBuilds(t, m, false); !on || !seed {
		t.Skip("no inline builds here (no seed namespace or no clone): builds fork")
	}
	return m
}

// r20HolderOf returns the pid of a live child of the mounter that is in
// the mount namespace mnt (a holder not reaped yet), or 0.
func r20HolderOf(t *testing.T, m *Mounter, mnt *os.File) int {
	t.Helper()
	want, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(mnt.Fd())))
	require.NoError(t, err)
	pid := strconv.Itoa(m.cmd.Process.Pid)
	kids, _ := os.ReadFile("/proc/" + pid + "/task/" + pid + "/children")
	for _, k := range strings.Fields(string(kids)) {
		if l, err := os.Readlink("/proc/" + k + "/ns/mnt"); err == nil && l == want {
			n, _ := strconv.Atoi(k)
			return n
		}
	}
	return 0
}

// A request served inside a refill (at a preemption point) that must
// build a namespace of its own (a lease with the stock empty: a stock of
// one, taken by the lease that started the refill) gets a whole
// namespace of its own; no descriptor stays behind; neither it nor the refill's namespace is handed
// out while its holder lives; the mounter is home (its own mount
// namespace, root and cwd /) after each round.
func TestReview20NestedBuildDuringRefill(t *testing.T) {
	testenv.Slow(t)
	m := manyBindsMounter(t, 1)
	settle(t, m, 1+1)
	a := dataDir(t, "A")
	before := preempted(t, m)
	fds := r18FDs(t, m)
	for i := range 8 {
		l1, err := m.Lease() // the stock is empty now: the refill starts
		require.NoError(t, err)
		require.Zero(t, r20HolderOf(t, m, l1.Namespace.Mount), "round %d: lease 1 handed out while its holder lives", i)
		l2, err := m.Lease() // comes while it runs: builds inside it, or waits
		if err == ErrNoneReady {
			require.NoError(t, m.Release(l1.ID))
			l1.Namespace.Close()
			settle(t, m, 1+1)
			continue
		}
		require.NoError(t, err)
		require.Zero(t, r20HolderOf(t, m, l2.Namespace.Mount), "round %d: lease 2 handed out while its holder lives", i)
		s1, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(l1.Namespace.Mount.Fd())))
		s2, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(l2.Namespace.Mount.Fd())))
		require.NotEqual(t, s1, s2, "round %d: two leases share a namespace", i)
		require.NoError(t, m.Attach(l2.ID, Plan{Binds: []Bind{{Source: openPath(t, a), Path: "/data", ReadOnly: true}}}))
		got := look(t, l2.Namespace, "/data/f.txt", "/f/239")
		require.Equal(t, "A", got["read /data/f.txt"], "round %d", i)
		require.Equal(t, "239", got["read /f/239"], "round %d", i)
		require.Equal(t, "EROFS", got["mkdir root"], "round %d", i)
		require.NoError(t, m.Release(l1.ID))
		l1.Namespace.Close()
		l2.Namespace.Close()
		settle(t, m, 1+1)
		r18Home(t, m, "round "+strconv.Itoa(i))
	}
	t.Logf("served inside a refill: %d", preempted(t, m)-before)
	require.Equal(t, fds, r18FDs(t, m), "the mounter's descriptors after the rounds")
}

// The build namespaces kept for a later drop (DROP) stay bounded while
// requests keep coming back to back: the mounter closed them only while
// no request waited, so a host whose next request was always sent
// before the mounter looked piled them up without bound (each a copy of
// a whole tree: here 240 binds), one per inline build. Here 12 leases
// (a stock of one: each one after the first builds inline) and a
// "builds" are sent at once, before any reply is read: that last one
// reports how many the mounter keeps.
func TestReview20DropBoundedUnderLoad(t *testing.T) {
	m := manyBindsMounter(t, 1)
	settle(t, m, 1+1)
	const k = 12
	lease, err := json.Marshal(map[string]any{"op": "lease"})
	require.NoError(t, err)
	builds, err := json.Marshal(map[string]any{"op": "builds"})
	require.NoError(t, err)
	m.mu.Lock()
	send := func(msg []byte) {
		var ioErr error
		require.NoError(t, m.conn.Write(func(fd uintptr) bool {
			ioErr = unix.Sendmsg(int(fd), msg, nil, nil, 0)
			return ioErr != unix.EAGAIN
		}))
		require.NoError(t, ioErr)
	}
	recv := func() []byte {
		buf := make([]byte, 4096)
		oob := make([]byte, unix.CmsgSpace(8*4))
		var n, oobn int
		var ioErr error
		require.NoError(t, m.conn.Read(func(fd uintptr) bool {
			n, oobn, _, _, ioErr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
			return ioErr != unix.EAGAIN
		}))
		require.NoError(t, ioErr)
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, c := range msgs {
				if fds, err := unix.ParseUnixRights(&c); err == nil {
					for _, f := range fds {
						unix.Close(f)
					}
				}
			}
		}
		return buf[:n]
	}
	for range k {
		send(lease)
	}
	send(builds)
	var ids []int64
	for range k {
		var r struct {
			OK    bool  `json:"ok"`
			Lease int64 `json:"lease"`
		}
		msg := recv()
		require.NoError(t, json.Unmarshal(msg, &r), "%s", msg)
		require.True(t, r.OK, "%s", msg)
		ids = append(ids, r.Lease)
	}
	var b struct {
		Dropping *int `json:"dropping"`
	}
	msg := recv()
	m.mu.Unlock()
	require.NoError(t, json.Unmarshal(msg, &b), "%s", msg)
	for _, id := range ids {
		require.NoError(t, m.Release(id))
	}
	require.NotNil(t, b.Dropping, "%s", msg)
	t.Logf("build namespaces kept to drop later after %d back-to-back leases: %d", k, *b.Dropping)
	require.LessOrEqual(t, *b.Dropping, 2, "build namespaces piled up while requests kept coming")
	settle(t, m, 1+1)
	r18Home(t, m, "after the leases")
}

const r20SeedScript = `
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for fd, kind in ((3, 0x10000000), (4, 0x00020000)):
    if libc.setns(fd, kind) != 0:
        sys.exit("setns: %d" % ctypes.get_errno())
os.chdir("/")
out = {}
def t(name, r):
    out[name] = "ok" if r == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
out["mountinfo"] = open("/proc/self/mountinfo").read()
out["root is its parent"] = os.stat("/").st_ino == os.stat("/..").st_ino and os.stat("/").st_dev == os.stat("/..").st_dev
out["t under root"] = os.path.exists("/t")
t("umount /", libc.umount2(b"/", 2))
out["after umount: t"] = os.path.exists("/t")
out["after umount: usr"] = os.path.isdir("/usr/bin")
print(json.dumps(out))
`

// The seed's copy beneath the tree of each stock namespace (the tree is
// attached on top of it instead of pivoted into) is out of reach even of
// a process holding every capability of the namespace's user namespace
// (more than any job holds): it is not in its mountinfo (the only mount
// at / there is the tree's), / is its own parent, and the tree cannot
// be unmounted to reveal it (locked).
func TestReview20SeedCopyOutOfReach(t *testing.T) {
	m := manyBindsMounter(t, 1)
	settle(t, m, 1+1)
	l, err := m.Lease()
	require.NoError(t, err)
	defer l.Namespace.Close()
	cmd := exec.Command("/usr/bin/python3", "-I", "-S", "-c", r20SeedScript)
	cmd.ExtraFiles = []*os.File{l.Namespace.User, l.Namespace.Mount}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var got map[string]any
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	info, _ := got["mountinfo"].(string)
	roots := 0
	for _, line := range strings.Split(strings.TrimSpace(info), "\n") {
		f := strings.Fields(line)
		require.GreaterOrEqual(t, len(f), 5, "%q", line)
		if f[4] == "/" {
			roots++
		}
		require.NotContains(t, line, "size=4k", "the seed's copy is in the job's mountinfo")
	}
	t.Logf("umount /: %v; mounts in the job's mountinfo: %d", got["umount /"], strings.Count(info, "\n"))
	require.Equal(t, 1, roots, "mounts at / in the job's mountinfo:\n%s", info)
	require.Equal(t, true, got["root is its parent"])
	require.Equal(t, false, got["t under root"], "the seed's /t is seen at the root")
	require.NotEqual(t, "ok", got["umount /"], "the tree could be unmounted: %s", out)
	require.Equal(t, true, got["after umount: usr"])
	require.NoError(t, m.Release(l.ID))
}

// Requests served inside a refill that fail (an attach to a lease that
// does not exist, a second prepare, an unknown op) each get exactly one
// error reply, in order, and the refill they interrupted goes on: the
// stock is whole again afterwards and the mounter is home.
func TestReview20NestedErrorsKeepRefill(t *testing.T) {
	m := manyBindsMounter(t, 1)
	settle(t, m, 1+1)
	before := preempted(t, m)
	for i := range 6 {
		l, err := m.Lease() // the refill starts
		require.NoError(t, err)
		require.ErrorContains(t, m.Attach(1<<40, Plan{}), "no namespace is leased", "round %d", i)
		require.Error(t, m.Prepare(Plan{}, 1), "round %d", i)
		require.NoError(t, m.Release(l.ID))
		l.Namespace.Close()
		settle(t, m, 1+1)
		r18Home(t, m, "round "+strconv.Itoa(i))
	}
	t.Logf("served inside a refill: %d", preempted(t, m)-before)
	l, err := m.Lease()
	require.NoError(t, err)
	defer l.Namespace.Close()
	got := look(t, l.Namespace, "/f/100")
	require.Equal(t, "100", got["read /f/100"])
}

// An attach that takes a namespace out of the stock (no lease) and comes
// while a refill builds the only namespace a slot is free for (a shared
// root with two slots: one is the lease's, the other the refill's) is
// served once that build is done, with its namespace, as before builds
// yielded to requests: served inside the build, it found the stock empty
// and waited SLOT_WAIT (5 s) for a slot the build it interrupted held,
// then failed the job ("no free namespace slot").
func TestReview20NestedAttachNeedsRefillSlot(t *testing.T) {
	requireMounter(t)
	dir := t.TempDir()
	var binds []Bind
	for i := range 240 {
		f := filepath.Join(dir, "f"+strconv.Itoa(i))
		require.NoError(t, os.WriteFile(f, []byte(strconv.Itoa(i)), 0o644))
		binds = append(binds, Bind{Source: openPath(t, f), Path: "/f/" + strconv.Itoa(i), ReadOnly: true})
	}
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.FsconfigCreate(fsfd))
	base, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	unix.Close(fsfd)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(base) })
	_, err = MakeSlots(base, 2)
	require.NoError(t, err)
	m, err := Start("/usr/bin/python3")
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	require.NoError(t, m.Prepare(Plan{
		Binds: append(binds, Bind{Source: openPath(t, "/usr"), Path: "/usr", ReadOnly: true},
			Bind{Source: openPath(t, "/proc"), Path: "/proc", ReadOnly: true}),
		Links: HostLinks(), Root: base, RootSet: true, Slots: 2,
	}, 1))
	if _, _, on, seed := mounterBuilds(t, m, false); !on || !seed {
		t.Skip("no inline builds here (no seed namespace or no clone): builds fork")
	}
	src := openPath(t, dataDir(t, "A"))
	for i := range 3 {
		settle(t, m, 1+1)
		l, err := m.Lease() // slot 0's namespace; the refill takes slot 1
		require.NoError(t, err)
		ns, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
		require.NoError(t, err, "round %d: an attach during the refill", i)
		got := look(t, ns, "/data/f.txt", "/f/3")
		require.Equal(t, "A", got["read /data/f.txt"], "round %d", i)
		require.Equal(t, "3", got["read /f/3"], "round %d", i)
		ns.Close()
		require.NoError(t, m.Release(l.ID))
		l.Namespace.Close()
	}
}

// A host that goes away while a refill runs (its end of the socket
// closed right after the lease that started it) ends the mounter
// cleanly: the end of the socket seen at a preemption point exits it
// (status 0), with no process of its left behind (a holder shares its
// memory).
func TestReview20HostGoneMidRefill(t *testing.T) {
	testenv.Slow(t)
	for i := range 3 {
		m := manyBindsMounter(t, 1)
		settle(t, m, 1+1)
		l, err := m.Lease() // the refill starts
		require.NoError(t, err)
		l.Namespace.Close()
		pid := m.cmd.Process.Pid
		kids, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
		require.NoError(t, m.Close())
		require.Equal(t, 0, m.cmd.ProcessState.ExitCode(), "round %d: %v", i, m.cmd.ProcessState)
		for _, k := range strings.Fields(string(kids)) {
			n, _ := strconv.Atoi(k)
			for range 200 {
				if !r18Alive(n) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			require.False(t, r18Alive(n), "round %d: the mounter's child %d lives on", i, n)
		}
	}
}
