package pynox

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// evilDump builds, with the host's python3 (pickling runs none of the
// object's code), a dump whose pickle opens a file when it is loaded.
func evilDump(t *testing.T, path string) []byte {
	t.Helper()
	src := `
import pickle, sys
class Evil:
    def __reduce__(self):
        return (open, (sys.argv[1],))
head = pickle.dumps(("pynox-dump", 1, "%d.%d" % sys.version_info[:2]))
sys.stdout.buffer.write(head + pickle.dumps({"x": Evil()}))
`
	out, err := exec.Command(testPython(), "-c", src, path).Output()
	require.NoError(t, err)
	return encodeDump(4, out)
}

// A tampered dump is loaded in the restoring session's sandbox: its
// __reduce__ that opens /etc/shadow gets PermissionError, the step's code
// does not run, the session goes on empty, and the pool keeps serving.
func TestHostileDumpReadsShadow(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Restore(ctx, Job{}, evilDump(t, "/etc/shadow"))
	require.NoError(t, err)
	defer co.Finish(ctx)
	ev, err := co.Feed(ctx, Step{Code: "print('ran')"})
	require.NoError(t, err)
	res := ev.Result
	requireErrorType(t, res, "PermissionError")
	require.Empty(t, res.Stdout, "the step's code ran after a failed restore")
	require.Contains(t, res.Stderr, "the session's dump could not be restored")
	require.False(t, res.SessionEnded)
	require.Equal(t, 5, res.Step)
	// The session goes on, with an empty __main__.
	res = feedOK(t, co, "print('x' in globals())")
	require.Equal(t, "False\n", res.Stdout)
	// And the pool serves other work.
	requireOK(t, run(t, p, Job{Code: "print(1)"}))

	// A file the session may read is read, as the session's code could.
	dir := p.Config().Dir
	co2, err := p.Restore(ctx, Job{AllowRead: []string{dir}}, evilDump(t, dir))
	require.NoError(t, err)
	defer co2.Finish(ctx)
	ev, err = co2.Feed(ctx, Step{Code: "print(1)"})
	require.NoError(t, err)
	// Opening a directory for reading: IsADirectoryError, not PermissionError.
	requireErrorType(t, ev.Result, "IsADirectoryError")
}

func TestDumpTooLarge(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(ctx)
	feedOK(t, co, "small = 1\nbig1 = bytes(40 << 20)\nbig2 = bytes(30 << 20)")
	_, err = co.Dump(ctx)
	require.ErrorIs(t, err, ErrRuntime)
	require.Contains(t, err.Error(), "ValueError: the session could not be dumped: the session's dump exceeds")
	// The session lives on.
	res := feedOK(t, co, "del big2\nprint(len(big1))")
	require.Equal(t, "41943040\n", res.Stdout)
	d, err := co.Dump(ctx)
	require.NoError(t, err)
	require.Greater(t, len(d.Data), 40<<20)

	// Restore refuses a dump over the cap, or one without a dump's header.
	_, err = p.Restore(ctx, Job{}, make([]byte, MaxDumpSize+1))
	require.ErrorIs(t, err, ErrRequest)
	require.Contains(t, err.Error(), "the limit is 67108864")
	_, err = p.Restore(ctx, Job{}, []byte("not a dump"))
	require.ErrorIs(t, err, ErrRequest)
	require.True(t, strings.Contains(err.Error(), "not a pynox session dump"), err.Error())
}

// A dump waits for no host call: with one waiting for Resume it is refused.
func TestDumpWhileCallWaits(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{Functions: []string{"f"}})
	require.NoError(t, err)
	defer co.Finish(ctx)
	ev, err := co.Feed(ctx, Step{Code: "import pynox_host\nv = pynox_host.f()"})
	require.NoError(t, err)
	require.NotNil(t, ev.Call)
	_, err = co.Dump(ctx)
	require.ErrorIs(t, err, ErrProtocol)
	ev, err = co.Resume(ctx, ev.Call.ID, Return(7))
	require.NoError(t, err)
	requireOK(t, ev.Result)
	d, err := co.Dump(ctx)
	require.NoError(t, err)
	// pynox_host is re-imported by name: a session that declares f gets it.
	co2, err := p.Restore(ctx, Job{Functions: []string{"f"}}, d.Data)
	require.NoError(t, err)
	defer co2.Finish(ctx)
	res := feedOK(t, co2, "print(v, pynox_host.f.__name__)")
	require.Equal(t, "7 f\n", res.Stdout)
}

// A session's own __reduce__ runs in its process during the dump: one that
// exits ends the process, not the pool.
func TestDumpReduceExits(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(ctx)
	feedOK(t, co, "import os\nclass X:\n    def __reduce__(self):\n        os._exit(3)\nx = [X()]\nkeep = 1")
	pid := co.Pid()
	_, err = co.Dump(ctx)
	require.ErrorIs(t, err, ErrCrashed)
	require.Zero(t, co.Pid())
	require.False(t, processAlive(pid))
	res := feedOK(t, co, "print('keep' in globals())")
	require.Equal(t, "False\n", res.Stdout)
}

// A __reduce__ that never returns is held to the session's timeout: the
// dump fails with KindTimeout, the process is killed, and the next step
// starts a new one.
func TestDumpReduceLoops(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{Timeout: time.Second})
	require.NoError(t, err)
	defer co.Finish(ctx)
	feedOK(t, co, "class X:\n    def __reduce__(self):\n        while True: pass\nx = X()")
	pid := co.Pid()
	_, err = co.Dump(ctx)
	require.ErrorIs(t, err, ErrTimeout)
	require.Zero(t, co.Pid())
	require.Eventually(t, func() bool { return !processAlive(pid) }, 5*time.Second, 10*time.Millisecond)
	res := feedOK(t, co, "print('x' in globals())")
	require.Equal(t, "False\n", res.Stdout)
	require.Equal(t, 1, res.Step)
}
