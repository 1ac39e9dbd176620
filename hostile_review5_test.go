package pynox

// The fifth outside review: probes of the code merged last (artifacts,
// rich outputs, usage read before the kill). Each probe ends by checking
// the pool keeps serving.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// review5StillServing checks the pool answers a plain job.
func review5StillServing(t *testing.T, p *Pool) {
	t.Helper()
	res := run(t, p, Job{Code: "print('still here')"})
	requireOK(t, res)
	require.Equal(t, "still here\n", res.Stdout)
}

// TestReview5ThreadAfterDoneIsKilled: after its final report the runner
// waits (up to 5 s) for the pool's kill; a thread the job left running
// must not use that window: the process is gone well before the runner
// would have left on its own, and the file the thread appends to stops
// growing.
func TestReview5ThreadAfterDoneIsKilled(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	res := run(t, p, Job{AllowWrite: []string{"."}, Code: `
import os, threading
def spin():
    n = 0
    with open("tick.txt", "w") as f:
        while True:
            n += 1
            f.write("%d\n" % n)
            f.flush()
t = threading.Thread(target=spin, daemon=True)
t.start()
import time
while not os.path.exists("tick.txt"):
    time.sleep(0.01)
print("started")
`})
	requireOK(t, res)
	require.NotNil(t, res.Usage, "the usage read before the kill")
	// The job runs in its own pid namespace: its process is watched
	// through the file its thread appends to, which must stop growing
	// long before the runner's own 5 s wait would end.
	tick := filepath.Join(p.cfg.Dir, "tick.txt")
	size := func() int64 {
		st, err := os.Stat(tick)
		require.NoError(t, err)
		return st.Size()
	}
	start := time.Now()
	require.Eventually(t, func() bool {
		a := size()
		time.Sleep(200 * time.Millisecond)
		return size() == a
	}, 3*time.Second, time.Millisecond, "the thread still writes after the job's final report")
	t.Logf("the thread stopped within %v of the result", time.Since(start))
	review5StillServing(t, p)
}

// TestReview5ForgedCommUsage: the job's command name is its own to set
// and /proc/<pid>/stat prints it unquoted; a name built to shift the
// fields must not change the figures the pool parses (it counts from the
// last ')'), nor break the result.
func TestReview5ForgedCommUsage(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	res := run(t, p, Job{Code: `
import ctypes
libc = ctypes.CDLL(None)
libc.prctl(15, b"x) Z 1 1 1 1 9", 0, 0, 0)  # PR_SET_NAME
buf = ctypes.create_string_buffer(16)
libc.prctl(16, buf, 0, 0, 0)  # PR_GET_NAME
print(buf.value.decode())
`})
	requireOK(t, res)
	require.Contains(t, res.Stdout, "x) Z")
	require.NotNil(t, res.Usage)
	require.Greater(t, res.Usage.MaxRSSBytes, int64(0))
	require.GreaterOrEqual(t, res.Usage.MinorFaults, int64(0))
	review5StillServing(t, p)
}

// TestReview5CollectSparseDeepAndSpecial: a sparse file of the job's
// whole size limit, files past it, a directory tree 40 levels deep walked
// by a 32-level pattern of wildcards, a symlink to /proc/self/root and a
// file that names /proc: none is read beyond the bounds, nothing outside
// the scratch directory is read, and the pool keeps serving.
func TestReview5CollectSparseDeepAndSpecial(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	deep := "$TMPDIR/" + strings.Repeat("*/", 31) + "*"
	res := run(t, p, Job{Collect: []string{deep, "$TMPDIR/*"}, Code: `
import os
d = os.environ["PYNOX_OUTPUTS"]
t = os.environ["TMPDIR"]
with open(os.path.join(d, "sparse"), "wb") as f:
    try:
        f.truncate(256 << 20)
    except OSError as e:
        print("truncate", e)
os.symlink("/proc/self/root", os.path.join(d, "root"))
os.symlink("/proc/1/environ", os.path.join(t, "environ"))
p = t
for i in range(40):
    p = os.path.join(p, "d")
    os.mkdir(p)
    open(os.path.join(p, "f"), "w").write("level %d" % i)
open(os.path.join(d, "small"), "w").write("ok")
`})
	requireOK(t, res)
	m := filesByName(res)
	require.Equal(t, "ok", string(m["small"].Data))
	require.Empty(t, m["sparse"].Data)
	require.Contains(t, m["sparse"].Skipped, "over the")
	require.Contains(t, m["root"].Skipped, "symbolic link")
	require.Contains(t, m["environ"].Skipped, "symbolic link")
	for _, f := range res.Files {
		require.NotContains(t, string(f.Data), "PATH=", f.Path)
		require.LessOrEqual(t, len(f.Data), MaxFilesBytes)
	}
	review5StillServing(t, p)
}

// review5TickStops waits for the file a job's thread appends to to stop
// growing: the thread's process is gone.
func review5TickStops(t *testing.T, path string) {
	t.Helper()
	size := func() int64 {
		st, err := os.Stat(path)
		require.NoError(t, err)
		return st.Size()
	}
	require.Eventually(t, func() bool {
		a := size()
		time.Sleep(200 * time.Millisecond)
		return size() == a
	}, 3*time.Second, time.Millisecond, "a thread of the job still writes to %s", path)
}

// review5Ticker starts a thread that appends to tick.txt forever.
const review5Ticker = `
import threading
def _spin():
    n = 0
    with open("tick.txt", "w") as f:
        while True:
            n += 1
            f.write("%d\n" % n)
            f.flush()
threading.Thread(target=_spin, daemon=True).start()
`

// TestReview5ForgedDoneKeepsNothingAlive: a job forges its own final
// report (a valid one, then one the pool refuses) while a thread of it
// keeps writing: either way the pool kills it at once, the thread stops,
// and the pool serves on.
func TestReview5ForgedDoneKeepsNothingAlive(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	tick := filepath.Join(p.cfg.Dir, "tick.txt")
	for _, tc := range []struct{ name, frame string }{
		{"valid", `b'{"t":"done","step":1,"exit":0,"error":null,"final":true}'`},
		{"refused value", `b'{"t":"done","step":1,"exit":0,"error":null,"value":1,"value_repr":"1"}'`},
		{"wrong step", `b'{"t":"done","step":9,"exit":0,"error":null}'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(tick)
			res := run(t, p, Job{AllowWrite: []string{"."}, Code: forgeReport + review5Ticker + `
while not os.path.exists("tick.txt"):
    time.sleep(0.01)
report(` + tc.frame + `)
time.sleep(30)
print("the job ran on")
`})
			require.NotContains(t, res.Stdout, "the job ran on")
			review5TickStops(t, tick)
			review5StillServing(t, p)
		})
	}
}

// TestReview5SessionFinalDoneForged: a session step forges a final
// report ("final": true, as if the session were finishing): the session's
// process is killed, its thread stops, and the next step runs in a new
// process (Result.Restarted).
func TestReview5SessionFinalDoneForged(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{AllowWrite: []string{"."}})
	require.NoError(t, err)
	defer co.Finish(ctx)
	ev, err := co.Feed(ctx, Step{Code: forgeReport + review5Ticker + `
while not os.path.exists("tick.txt"):
    time.sleep(0.01)
report(b'{"t":"done","step":1,"exit":0,"error":null,"final":true}')
time.sleep(30)
`})
	require.NoError(t, err)
	require.NotNil(t, ev.Result)
	review5TickStops(t, filepath.Join(p.cfg.Dir, "tick.txt"))
	ev, err = co.Feed(ctx, Step{Code: "print('after')"})
	// The next step runs in a new process (its globals empty), which
	// its result says.
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.True(t, ev.Result.Restarted, "the session's process lived on after its forged final report")
	review5StillServing(t, p)
}

// TestReview5SessionLeaseOnOutput: a session step takes a write lease on
// a file it leaves in $PYNOX_OUTPUTS and stays alive (stopped) while the
// pool collects it: opening a leased file blocks until the lease breaks
// (45 s by default) unless the open does not wait; the step's result
// comes at once, and the pool serves on.
func TestReview5SessionLeaseOnOutput(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(context.Background())
	ev, err := co.Feed(ctx, Step{Code: `
import fcntl, os
d = os.environ["PYNOX_OUTPUTS"]
f = open(os.path.join(d, "leased.txt"), "w")
f.write("held")
f.flush()
try:
    fcntl.fcntl(f.fileno(), fcntl.F_SETLEASE, fcntl.F_WRLCK)
    print("lease taken")
except OSError as e:
    print("lease refused", e)
`})
	require.NoError(t, err, "the step's result did not come")
	requireOK(t, ev.Result)
	t.Log(strings.TrimSpace(ev.Result.Stdout))
	for _, f := range ev.Result.Files {
		t.Logf("%s: %q skipped=%q", f.Path, f.Data, f.Skipped)
	}
	ev, err = co.Feed(ctx, Step{Code: "print('next')"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "next\n", ev.Result.Stdout)
	review5StillServing(t, p)
}

// TestReview5CollectUnreadableToJob: the job runs without the
// capabilities that override file permissions, so a file in its write
// grant that its mode or owner keeps from it (or that lies in a directory
// it may not search) is one it cannot read; the pool, often root, must
// not read it for the job through Collect. Before the fix the result
// carried zero.txt's contents (mode 000), which the job got EACCES for.
func TestReview5CollectUnreadableToJob(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the pool reads as root what a job may not")
	}
	p := newTestPool(t, Config{Workers: 1})
	out := filepath.Join(p.cfg.Dir, "out")
	require.NoError(t, os.Mkdir(out, 0o777))
	require.NoError(t, os.Chmod(out, 0o777))
	const secret = "REVIEW5-mode-000-secret"
	write := func(path string, mode os.FileMode, uid int) {
		require.NoError(t, os.WriteFile(path, []byte(secret), mode))
		require.NoError(t, os.Chmod(path, mode))
		require.NoError(t, os.Chown(path, uid, uid))
	}
	write(filepath.Join(out, "zero.txt"), 0, 0)
	write(filepath.Join(out, "owner.txt"), 0o600, 54321)
	private := filepath.Join(out, "private")
	require.NoError(t, os.Mkdir(private, 0o700))
	require.NoError(t, os.Chown(private, 54321, 54321))
	write(filepath.Join(private, "inner.txt"), 0o644, 54321)
	require.NoError(t, os.WriteFile(filepath.Join(out, "public.txt"), []byte("public"), 0o644))
	require.NoError(t, os.Chown(filepath.Join(out, "public.txt"), 54321, 54321))

	res := run(t, p, Job{AllowWrite: []string{"out"}, Collect: []string{"out/*", "out/private/inner.txt", "out/private/*"}, Code: `
for n in ("zero.txt", "owner.txt", "private/inner.txt", "public.txt"):
    try:
        open("out/" + n).read()
        print(n, "readable")
    except OSError as e:
        print(n, "unreadable", e.errno)
`})
	requireOK(t, res)
	require.Equal(t, "zero.txt unreadable 13\nowner.txt unreadable 13\nprivate/inner.txt unreadable 13\npublic.txt readable\n", res.Stdout)
	for _, f := range res.Files {
		require.NotContains(t, string(f.Data), secret, "the pool read %s, which the job itself could not", f.Path)
	}
	m := filesByName(res)
	require.Contains(t, m["zero.txt"].Skipped, "the job may not read the file")
	require.Contains(t, m["owner.txt"].Skipped, "the job may not read the file")
	require.Equal(t, "public", string(m["public.txt"].Data))
	review5StillServing(t, p)
}

// TestReview5SessionFinishKillsThreads: a session's thread that runs on
// between steps (stopped with its process) must not run on once the
// session is finished, when the runner sends its final report and waits
// for the kill.
func TestReview5SessionFinishKillsThreads(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{AllowWrite: []string{"."}})
	require.NoError(t, err)
	ev, err := co.Feed(ctx, Step{Code: "import os, time" + review5Ticker + `
while not os.path.exists("tick.txt"):
    time.sleep(0.01)
`})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	err = co.Finish(ctx)
	require.NoError(t, err)
	review5TickStops(t, filepath.Join(p.cfg.Dir, "tick.txt"))
	review5StillServing(t, p)
}
