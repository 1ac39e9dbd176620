package mountns

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A leased namespace is handed out before any job's mounts are in it: it
// shows the base only (no mountpoint of an earlier job's, its root still
// writable), the attach then shows the job's mount (read-only) and makes
// the root read-only, also to a process that entered the namespace
// before the attach (the spare's case); a lease is attached to once (a
// second attach, or one after a release, fails); and leases and their
// attaches leak neither descriptors nor builder processes.
func TestLeaseAttach(t *testing.T) {
	m := preparedMounter(t, 2, 0, false)
	settle(t, m, 1+2)
	a, b := dataDir(t, "A"), dataDir(t, "B")
	// An earlier job's namespace, attached the usual way.
	old, err := m.Build(Plan{Binds: []Bind{{Source: openPath(t, a), Path: "/secret", ReadOnly: true}}})
	require.NoError(t, err)
	defer old.Close()

	l, err := m.Lease()
	require.NoError(t, err)
	defer l.Namespace.Close()
	before := look(t, l.Namespace)
	require.ElementsMatch(t, []any{"/", "/usr", "/proc"}, before["mounts"])
	require.NotContains(t, before["root"], "secret", "a leased namespace shows another job's mountpoint")
	require.NotContains(t, before["root"], "data")
	// Its root is still writable (by a process holding capabilities in
	// it, as this one does): the attach makes it read-only, and the pool
	// runs no job before that.
	require.Nil(t, before["mkdir root"])

	// A process that entered before the attach (it waits for a line on
	// its stdin, then looks again).
	cmd := exec.Command("/usr/bin/python3", "-I", "-S", "-c", `
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for fd, kind in ((3, 0x10000000), (4, 0x00020000)):
    assert libc.setns(fd, kind) == 0
print("in", flush=True)
sys.stdin.readline()
print(json.dumps([open("/data/f.txt").read(), bool(os.statvfs("/").f_flag & os.ST_RDONLY)]))`)
	cmd.ExtraFiles = []*os.File{l.Namespace.User, l.Namespace.Mount}
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	outR, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	buf := make([]byte, 3)
	_, err = outR.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "in\n", string(buf))

	require.NoError(t, m.Attach(l.ID, Plan{Binds: []Bind{{Source: openPath(t, b), Path: "/data", ReadOnly: true}}}))
	_, err = in.Write([]byte("go\n"))
	require.NoError(t, err)
	rest := make([]byte, 100)
	n, _ := outR.Read(rest)
	require.NoError(t, cmd.Wait())
	require.Equal(t, "[\"B\", true]\n", string(rest[:n]), "the process inside does not see the attach")

	after := look(t, l.Namespace, "/data/f.txt")
	require.Equal(t, "B", after["read /data/f.txt"])
	require.ElementsMatch(t, []any{"/", "/usr", "/proc", "/data"}, after["mounts"])
	require.Equal(t, "EEXIST", after["mkdir root"]) // made before the attach
	require.Equal(t, "EROFS", after["write data"])

	// Once only.
	err = m.Attach(l.ID, Plan{Binds: []Bind{{Source: openPath(t, a), Path: "/again", ReadOnly: true}}})
	require.Error(t, err)
	require.Contains(t, err.Error(), "no namespace is leased")
	l2, err := m.Lease()
	if err == ErrNoneReady {
		settle(t, m, 1+2)
		l2, err = m.Lease()
	}
	require.NoError(t, err)
	l2.Namespace.Close()
	require.NoError(t, m.Release(l2.ID))
	require.Error(t, m.Attach(l2.ID, Plan{Binds: []Bind{{Source: openPath(t, a), Path: "/x", ReadOnly: true}}}))
	// The mounter holds its own namespace, its stock, and nothing of the
	// leases (the first one's namespace is held by this test alone).
	settle(t, m, 1+2)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(int(l.Namespace.Mount.Fd()), &st))
}

// A lease before Prepare fails, naming it; an attach to a lease number
// never handed out fails without taking a namespace from the stock.
func TestLeaseRefusals(t *testing.T) {
	requireMounter(t)
	m, err := Start("/usr/bin/python3")
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	_, err = m.Lease()
	require.ErrorContains(t, err, "not prepared")
	m = preparedMounter(t, 2, 0, false)
	settle(t, m, 1+2)
	require.ErrorContains(t, m.Attach(12345, Plan{}), "no namespace is leased")
	settle(t, m, 1+2)
}
