package mountns

import (
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// mounterBuilds asks the mounter how many stock namespaces it built
// inline and by builder children (op "builds"); with off, it turns
// inline builds off first.
func mounterBuilds(t *testing.T, m *Mounter, off bool) (inline, forked int, inlineOn, seed bool) {
	t.Helper()
	r := mounterBuildsReply(t, m, off)
	return r.Inline, r.Forked, r.InlineOn, r.Seed
}

// preempted is how many requests the mounter served inside a refill.
func preempted(t *testing.T, m *Mounter) int {
	t.Helper()
	return mounterBuildsReply(t, m, false).Preempted
}

type buildsReply struct {
	OK        bool `json:"ok"`
	Inline    int  `json:"inline"`
	Forked    int  `json:"forked"`
	Preempted int  `json:"preempted"`
	InlineOn  bool `json:"inline_on"`
	Seed      bool `json:"seed"`
}

func mounterBuildsReply(t *testing.T, m *Mounter, off bool) buildsReply {
	t.Helper()
	req := map[string]any{"op": "builds"}
	if off {
		req["inline"] = false
	}
	msg, err := json.Marshal(req)
	require.NoError(t, err)
	m.mu.Lock()
	defer m.mu.Unlock()
	// The host's end is non-blocking, in the runtime's poller (never
	// m.sock.Fd(): that would make it blocking).
	var ioErr error
	require.NoError(t, m.conn.Write(func(fd uintptr) bool {
		ioErr = unix.Sendmsg(int(fd), msg, nil, nil, 0)
		return ioErr != unix.EAGAIN
	}))
	require.NoError(t, ioErr)
	buf := make([]byte, 4096)
	var n int
	require.NoError(t, m.conn.Read(func(fd uintptr) bool {
		n, _, _, _, ioErr = unix.Recvmsg(int(fd), buf, nil, 0)
		return ioErr != unix.EAGAIN
	}))
	require.NoError(t, ioErr)
	var r buildsReply
	require.NoError(t, json.Unmarshal(buf[:n], &r), "%s", buf[:n])
	require.True(t, r.OK, "%s", buf[:n])
	return r
}

// lockScript enters the namespace (fds 3 and 4) holding every capability
// of its user namespace (it drops none) and tries to undo the base's
// mounts: unmount /usr, make it writable, remount the root writable.
const lockScript = `
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for fd, kind in ((3, 0x10000000), (4, 0x00020000)):
    if libc.setns(fd, kind) != 0:
        sys.exit("setns: %d" % ctypes.get_errno())
os.chdir("/")
out = {}
def t(name, r):
    out[name] = "ok" if r == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
# mount_setattr(AT_FDCWD, path, AT_RECURSIVE, {clr: MOUNT_ATTR_RDONLY}, 32)
attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0)
t("rw /usr", libc.syscall(442, -100, b"/usr", 0x8000, attr, 32))
t("remount /usr", libc.mount(None, b"/usr", None, 0x20 | 0x1000, None))  # MS_REMOUNT|MS_BIND, rw
t("umount /usr", libc.umount2(b"/usr", 2))
print(json.dumps(out))
`

// Stock namespaces are built by the mounter itself (no builder process
// forked per namespace, see INLINE in builder.py), and are what the
// builder children made: each job sees the base and exactly its own
// mount, its root read-only; the base's mounts are locked to the
// namespace (a process holding every capability of its user namespace
// can neither unmount /usr nor make it writable); no holder process
// stays; the mounter is back in its own mount namespace after each
// build. The same holds with inline builds turned off (the fork path,
// kept for C libraries without clone), where the stock is then built by
// children.
func TestPreparedBuildsInline(t *testing.T) {
	testenv.Slow(t)
	for _, forked := range []bool{false, true} {
		t.Run(map[bool]string{false: "inline", true: "forked"}[forked], func(t *testing.T) {
			m := preparedMounter(t, 2, 0, false)
			settle(t, m, 1+2)
			_, _, on, seed := mounterBuilds(t, m, forked)
			if !seed {
				t.Skip("the mounter has no seed namespace here (inline builds start from it): builds fork")
			}
			require.Equal(t, !forked, on, "inline builds on")
			settle(t, m, 1+2)
			inline0, forked0, _, _ := mounterBuilds(t, m, false)
			a := dataDir(t, "A")
			for i := range 6 {
				ns, err := m.Build(Plan{Binds: []Bind{{Source: openPath(t, a), Path: "/data", ReadOnly: true}}})
				require.NoError(t, err)
				got := look(t, ns, "/data/f.txt")
				require.Equal(t, "A", got["read /data/f.txt"], "job %d", i)
				require.ElementsMatch(t, []any{"/", "/usr", "/proc", "/data"}, got["mounts"], "job %d", i)
				require.Equal(t, "EROFS", got["mkdir root"], "job %d", i)
				cmd := exec.Command("/usr/bin/python3", "-I", "-S", "-c", lockScript)
				cmd.ExtraFiles = []*os.File{ns.User, ns.Mount}
				out, err := cmd.CombinedOutput()
				require.NoError(t, err, "%s", out)
				var lk map[string]string
				require.NoError(t, json.Unmarshal(out, &lk), "%s", out)
				require.NotEqual(t, "ok", lk["rw /usr"], "job %d: %v", i, lk)
				require.NotEqual(t, "ok", lk["remount /usr"], "job %d: %v", i, lk)
				require.NotEqual(t, "ok", lk["umount /usr"], "job %d: %v", i, lk)
				ns.Close()
				settle(t, m, 1+2)
			}
			inline1, forked1, _, _ := mounterBuilds(t, m, false)
			if forked {
				require.Equal(t, inline0, inline1, "no inline build once they are off")
				require.GreaterOrEqual(t, forked1-forked0, 6, "every stock build forked")
			} else {
				require.Equal(t, forked0, forked1, "no stock build forked")
				require.GreaterOrEqual(t, inline1-inline0, 6, "every stock build inline")
			}
			self, err := os.Readlink("/proc/self/ns/mnt")
			require.NoError(t, err)
			its, err := os.Readlink("/proc/" + strconv.Itoa(m.cmd.Process.Pid) + "/ns/mnt")
			require.NoError(t, err)
			require.Equal(t, self, its, "the mounter is back in its own mount namespace")
		})
	}
}

// A request that comes while the mounter refills its stock is served at
// the build's next preemption point (between two mounts of its tree),
// not after the whole build: with a base of 240 binds (a build of many
// milliseconds), a lease and an attach sent right after the lease that
// started the refill are served inside it (the mounter's count of
// preempted serves grows), and every namespace is whole and its own.
func TestPreparedRefillServesRequests(t *testing.T) {
	m := manyBindsMounter(t, 2)
	settle(t, m, 1+2)
	a := dataDir(t, "A")
	for i := range 8 {
		l1, err := m.Lease() // the stock is short: the refill starts
		require.NoError(t, err)
		l2, err := m.Lease() // comes while it runs
		require.NoError(t, err)
		require.NoError(t, m.Attach(l2.ID, Plan{Binds: []Bind{{Source: openPath(t, a), Path: "/data", ReadOnly: true}}}))
		got := look(t, l2.Namespace, "/data/f.txt", "/f/7")
		require.Equal(t, "A", got["read /data/f.txt"], "round %d", i)
		require.Equal(t, "7", got["read /f/7"], "round %d", i)
		require.Equal(t, "EROFS", got["mkdir root"], "round %d", i)
		require.NoError(t, m.Release(l1.ID))
		l1.Namespace.Close()
		l2.Namespace.Close()
		settle(t, m, 1+2)
	}
	_, _, _, _ = mounterBuilds(t, m, false)
	require.Positive(t, preempted(t, m), "no request was served inside a refill")
}
