package pynox

// The fourth outside review: probes of what the merges of dump/restore,
// idle dumps, typed host errors, declared tools, private scratch and
// warm sessions added, from inside a job or session.

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// A session whose dump writes to its stderr descriptor (its own
// __reduce__ running in the dump) makes the pool keep none of it: a dump
// holds at most MaxDumpSize bytes of the pool's memory, whatever the
// session's code writes besides. Before the fix the pool kept up to
// MaxDumpSize bytes of that stderr too (the dump's turn capped each
// stream at the dump's size), only to drop them: a session limited to
// max_output 1 KiB held 64 MiB more of the pool's memory per dump.
//
// Not parallel: it reads the process's allocation counter.
func TestHostileReview4DumpStderrNotKept(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{MaxOutput: 1024, Timeout: 30 * time.Second})
	require.NoError(t, err)
	defer co.Finish(ctx)
	feedOK(t, co, `
import os
class Loud:
    def __reduce__(self):
        chunk = b"e" * (1 << 20)
        for _ in range(48):
            os.write(2, chunk)
        return (int, (7,))
x = Loud()
`)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	d, err := co.Dump(ctx)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Less(t, len(d.Data), 1<<10)
	grew := after.TotalAlloc - before.TotalAlloc
	require.Less(t, grew, uint64(16<<20), "the pool allocated %d bytes for a dump of %d bytes: it kept the session's stderr", grew, len(d.Data))
	// The dump restores, and the session lives on.
	res := feedOK(t, co, "print(type(x).__name__)")
	require.Equal(t, "Loud\n", res.Stdout)
	co2, err := p.Restore(ctx, Job{}, d.Data)
	require.NoError(t, err)
	defer co2.Finish(ctx)
	require.Equal(t, "7\n", feedOK(t, co2, "print(x)").Stdout)
	advServes(t, p)
}

// A restored dump runs with the restoring session's grants only: code a
// tampered dump carries (a __reduce__ calling exec) can neither list nor
// read nor plant files in the idle-dump directory, where another session
// of the same pool is kept, nor signal anything outside its process. The
// kept session restores intact afterwards.
func TestHostileReview4RestoredDumpCannotReachIdleDumps(t *testing.T) {
	t.Parallel()
	dumps := t.TempDir()
	p := newTestPool(t, Config{Workers: 1, SessionIdle: 300 * time.Millisecond, SessionIdleDump: dumps})
	ctx := context.Background()
	a, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer a.Finish(ctx)
	feedOK(t, a, "secret = 'kept-by-a'")
	var kept []string
	require.Eventually(t, func() bool {
		kept, _ = filepath.Glob(filepath.Join(dumps, "*.dump"))
		if len(kept) != 1 {
			return false
		}
		// The pool creates the file, then writes the dump into it: wait
		// for the dump, not the empty file.
		st, err := os.Stat(kept[0])
		return err == nil && st.Size() > 0
	}, 30*time.Second, 20*time.Millisecond, "session a was not kept in the idle-dump directory")
	before := advStat(t, kept[0])

	probe := `
import os, signal
out = []
def attempt(what, f):
    try:
        f()
        out.append(what + ":OK")
    except OSError as e:
        out.append(what + ":" + type(e).__name__)
D = ` + pyQuote(dumps) + `
K = ` + pyQuote(kept[0]) + `
attempt("list", lambda: os.listdir(D))
attempt("read", lambda: open(K, "rb").read())
attempt("plant", lambda: open(os.path.join(D, "pynox-session-" + "0" * 32 + ".dump"), "wb").write(b"x"))
attempt("replace", lambda: open(K, "r+b").write(b"x"))
attempt("unlink", lambda: os.unlink(K))
attempt("kill1", lambda: os.kill(1, 0))
attempt("killpp", lambda: os.kill(os.getppid(), 0))
print(" ".join(out))
`
	// The probe runs as the dump's unpickling: exec(probe) in a __reduce__.
	b, err := p.Restore(ctx, Job{}, reduceDump(t, "exec", probe))
	require.NoError(t, err)
	defer b.Finish(ctx)
	ev, err := b.Feed(ctx, Step{Code: "print('step ran')"})
	require.NoError(t, err)
	res := ev.Result
	requireOK(t, res)
	for _, w := range []string{"list", "read", "plant", "replace", "unlink", "kill1", "killpp"} {
		require.Contains(t, res.Stdout, w+":PermissionError", "a restored dump's code reached outside its session: %s", res.Stdout)
	}
	requireUnchanged(t, before, kept[0])
	planted, _ := filepath.Glob(filepath.Join(dumps, "*"))
	require.Len(t, planted, 1, "a file was planted in the idle-dump directory: %v", planted)

	// No request reaches the directory either: it lies outside the
	// ceiling, whatever field names it.
	for _, j := range []Job{
		{AllowRead: []string{dumps}},
		{AllowWrite: []string{dumps}},
		{PackageDirs: []string{dumps}},
		{Mounts: []MountSpec{{HostPath: dumps}}},
		{Mounts: []MountSpec{{HostPath: kept[0]}}},
	} {
		j.Code = "print(1)"
		requireErrorType(t, run(t, p, j), "RequestError")
	}

	// a comes back as it was.
	ev, err = a.Feed(ctx, Step{Code: "print(secret)"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "kept-by-a\n", ev.Result.Stdout)
	require.True(t, ev.Result.Restored)
	advServes(t, p)
}

// reduceDump builds, with the host's python3, a dump whose only global's
// unpickling calls fn (a builtin: exec, eval, ...) with arg and fresh
// globals.
func reduceDump(t *testing.T, fn, arg string) []byte {
	t.Helper()
	src := `
import builtins, pickle, sys
class R:
    def __reduce__(self):
        return (getattr(builtins, sys.argv[1]), (sys.argv[2], {}))
head = pickle.dumps(("pynox-dump", 1, "%d.%d" % sys.version_info[:2]))
sys.stdout.buffer.write(head + pickle.dumps({"r": R()}))
`
	out, err := exec.Command(testPython(), "-c", src, fn, arg).Output()
	require.NoError(t, err)
	return encodeDump(1, out)
}

// Two sessions forked from the same template share nothing through a
// dump: a dump holds its own session's globals only (not another
// session's, not the runner's), and a session cannot signal or even probe
// a sibling forked from the same template (its pid is in the same PID
// namespace): kill(pid, 0) finds no process but its own.
func TestHostileReview4WarmSiblingsIsolated(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	a, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer a.Finish(ctx)
	b, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer b.Finish(ctx)
	feedOK(t, a, "secret_of_a = 'zq' + 'xv-41'\nimport os\npid_a = os.getpid()")
	pidA := strings.TrimSpace(feedOK(t, a, "print(pid_a)").Stdout)
	res := feedOK(t, b, `
import os, errno
mine = os.getpid()
hits = []
for pid in range(1, 4096):
    if pid == mine:
        continue
    try:
        os.kill(pid, 0)
        hits.append(pid)
    except OSError as e:
        if e.errno not in (errno.ESRCH, errno.EPERM):
            hits.append(("odd", pid, e.errno))
# a's pid as a sees it. Both come from the one template, so share its PID
# namespace; should they not (a template replaced meanwhile), the number
# may be b's own, which b must not stop.
if `+pidA+` != mine:
    try:
        os.kill(`+pidA+`, 19)
        print("stopped a")
    except OSError as e:
        print("kill a:", type(e).__name__)
print("hits", hits)
`)
	t.Logf("b: %s", res.Stdout)
	require.Contains(t, res.Stdout, "hits []\n", "a session can probe other processes: %s", res.Stdout)
	require.NotContains(t, res.Stdout, "stopped a")
	require.Contains(t, res.Stdout, "kill a: PermissionError")
	d, err := b.Dump(ctx)
	require.NoError(t, err)
	require.NotContains(t, string(d.Data), "zqxv-41")
	require.NotContains(t, string(d.Data), "secret_of_a")
	// a was not stopped: it runs its next step.
	require.Equal(t, "zqxv-41\n", feedOK(t, a, "print(secret_of_a)").Stdout)
	// After Finish, a runs nothing more.
	require.NoError(t, a.Finish(ctx))
	_, err = a.Feed(ctx, Step{Code: "print(1)"})
	require.ErrorIs(t, err, ErrFinished)
	advServes(t, p)
}

// A session's step that keeps a copy of its stdout (a thread writing
// through a duplicated descriptor) cannot write into a later step's
// output, nor into its dump, nor into another session's output; the
// thread is stopped with the session between steps, and the later step
// and the dump come back whole.
func TestHostileReview4KeptStdoutDoesNotLeak(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	ctx := context.Background()
	a, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer a.Finish(ctx)
	feedOK(t, a, `
import os, threading
kept = os.dup(1)
def spam():
    while True:
        try:
            os.write(kept, bytes([76, 69, 65, 75, 10]))
        except OSError:
            pass
threading.Thread(target=spam, daemon=True).start()
x = 5
`)
	for i := 0; i < 3; i++ {
		res := feedOK(t, a, "import time\ntime.sleep(0.05)\nprint('step', x)")
		require.Equal(t, "step 5\n", res.Stdout, "a kept descriptor wrote into a later step's output")
	}
	d, err := a.Dump(ctx)
	require.NoError(t, err)
	require.NotContains(t, string(d.Data), "LEAK")
	r, err := p.Restore(ctx, Job{}, d.Data)
	require.NoError(t, err)
	defer r.Finish(ctx)
	require.Equal(t, "5\n", feedOK(t, r, "print(x)").Stdout)
	res := run(t, p, Job{Code: "import time\ntime.sleep(0.05)\nprint('other')"})
	requireOK(t, res)
	require.Equal(t, "other\n", res.Stdout)
}

// Declared tools' signatures are never run: a default or an annotation
// that is a call (setting a builtin, the probe's witness) shows as its
// text, the most deeply nested annotation the pool's parser accepts
// neither hangs the pool nor fails the job, and host errors typed as
// exceptions that would end or escape the job (SystemExit,
// KeyboardInterrupt, BaseException, GeneratorExit, a name that is no
// exception) reach the job as plain pynox_host.HostError.
func TestHostileReview4ToolSignaturesAndErrorTypes(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	nest := strings.Repeat("(", 2000) + "int" + strings.Repeat(")", 2000)
	tools := []Tool{
		{Name: "a", Signature: "(x = __import__('builtins').__setattr__('PWNED_DEFAULT', 1)) -> int"},
		{Name: "b", Signature: "(x: __import__('builtins').__setattr__('PWNED_ANN', 1) = 1)"},
		{Name: "c", Signature: "(x: " + nest + " = 0)"},
		{Name: "fail"},
	}
	host := func(_ context.Context, c *Call) (any, error) {
		if c.Function == "fail" {
			var args []string
			if err := json.Unmarshal(c.Args, &args); err != nil || len(args) != 1 {
				return nil, errors.New("one string expected")
			}
			return nil, RaiseAs(args[0], "boom")
		}
		return 1, nil
	}
	res := run(t, p, Job{Tools: tools, Host: host, Timeout: 30 * time.Second, Code: `
import builtins, inspect, pynox_host as h
print(inspect.signature(h.a))
print(hasattr(builtins, "PWNED_DEFAULT"), hasattr(builtins, "PWNED_ANN"))
print(h.a(), h.b(), h.c())
for typ in ("SystemExit", "KeyboardInterrupt", "BaseException", "GeneratorExit", "__class__", "HostError", "KeyError"):
    try:
        h.fail(typ)
    except h.HostError as e:
        print(typ, type(e).__name__, isinstance(e, KeyError))
print("alive")
`})
	requireOK(t, res)
	require.Contains(t, res.Stdout, "False False\n", "a signature's text ran in the job")
	require.Contains(t, res.Stdout, "1 1 1\n")
	for _, typ := range []string{"SystemExit", "KeyboardInterrupt", "BaseException", "GeneratorExit", "__class__", "HostError"} {
		require.Contains(t, res.Stdout, typ+" HostError False\n")
	}
	require.Contains(t, res.Stdout, "KeyError KeyError True\n")
	require.True(t, strings.HasSuffix(res.Stdout, "alive\n"), res.Stdout)
	advServes(t, p)
}

// A job's scratch directory comes to the next job empty and with mode
// 0700, whatever the job left in it: directories made with mode 0 or
// with the set-id and sticky bits, files made set-uid, names of 255
// bytes, many entries, a directory renamed over the scratch's own name
// inside it. Nothing outside is touched.
func TestHostileReview4ScratchReuse(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	victim := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(victim, "keep"), []byte("precious"), 0o644))
	before := advStat(t, filepath.Join(victim, "keep"))
	res := run(t, p, Job{Code: `
import os
d = os.environ["TMPDIR"]
os.chdir(d)
try:
    os.umask(0)
except PermissionError:  # a job's umask keeps 022 (TestReview22NoWorldWritableOutputs)
    pass
os.mkdir("zero", 0)
os.mkdir("ids", 0o7777)
os.mkdir("ids/inner", 0o7777)
try:
    fd = os.open("suid", os.O_CREAT | os.O_WRONLY, 0o6777)
except PermissionError:  # set-ID bits are refused (TestHostileReview10NoSetIDFiles)
    fd = os.open("suid", os.O_CREAT | os.O_WRONLY, 0o1777)
os.close(fd)
os.mkdir("n" * 255)
for i in range(500):
    open("f%d" % i, "w").close()
os.mkdir("x")
os.symlink(` + pyQuote(victim) + `, "x/v")
os.rename("x", "ids/inner/` + "y" + `")
print(oct(os.stat("suid").st_mode), oct(os.stat("ids").st_mode))
`})
	requireOK(t, res)
	requireScratchEmpty(t, p, "scratch left behind")
	res = run(t, p, Job{Code: `
import os
d = os.environ["TMPDIR"]
print(oct(os.stat(d).st_mode & 0o7777), os.listdir(d), os.listdir(os.environ["PYNOX_OUTPUTS"]))
`})
	requireOK(t, res)
	// Only the empty outputs directory the pool makes in each scratch.
	require.Equal(t, "0o700 ['outputs'] []\n", res.Stdout)
	requireUnchanged(t, before, filepath.Join(victim, "keep"))
}

// A session's dump cannot be taken while a host call waits, and a Dump
// racing the session's Finish answers once, with a dump or an error
// naming the end; the pool keeps serving.
func TestHostileReview4DumpRacesFinish(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		co, err := p.Checkout(ctx, Job{})
		require.NoError(t, err)
		feedOK(t, co, "x = list(range(100000))")
		done := make(chan error, 1)
		go func() {
			_, err := co.Dump(ctx)
			done <- err
		}()
		co.Finish(ctx)
		if err := <-done; err != nil {
			require.True(t, errors.Is(err, ErrFinished) || errors.Is(err, context.Canceled) || errors.Is(err, ErrCrashed), "%v", err)
		}
	}
	advServes(t, p)
}

// A job that calls a declared tool with a signature through a forged call
// frame carrying 100,000 keyword arguments (under 1 MiB of JSON, MaxCall) gets
// its TypeError at once. Before the fix the pool read the keywords'
// names by a quadratic scan (orderedObject looked each name up in a slice
// of those before it): most of a minute of the pool's CPU per call (34 s
// for 80,000 names on the review machine), on a goroutine the job's
// timeout does not stop, and a job may have 64 such calls in flight. The
// job here, with a 15 s timeout, timed out waiting for its answer.
func TestHostileReview4ToolKwargsFlood(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	var calls int
	host := func(context.Context, *Call) (any, error) { calls++; return "reached", nil }
	code := `import json, os, struct
def frame(o):
    b = json.dumps(o, separators=(",", ":")).encode()
    return struct.pack('<I', len(b)) + b
kw = {}
i = 0
while len(kw) < 100000:
    n, s = i, ""
    while True:
        s = "abcdefghijklmnopqrstuvwxyz"[n % 26] + s
        n //= 26
        if not n:
            break
    kw["k" + s] = 0
    i += 1
f = frame({'t': 'call', 'id': 1, 'step': 1, 'function': 'tool', 'args': [], 'kwargs': kw})
# As the runner sends a large frame: its header and a ring first, so
# that Go reads the rest as it comes.
os.write(3, f[:4])
os.write(4, b'!')
v = memoryview(f)[4:]
while v:
    v = v[os.write(3, v):]
os.write(4, b'!')
n = struct.unpack('<I', os.read(3, 4))[0]
r = b""
while len(r) < n:
    r += os.read(3, n - len(r))
r = json.loads(r)
print(r.get('error_type'), r.get('error', '')[:60])
`
	res, err := p.Run(context.Background(), Job{Tools: []Tool{{Name: "tool", Signature: "(a: int = 1)"}}, Host: host,
		Timeout: 15 * time.Second, Code: code})
	require.NoError(t, err)
	requireOK(t, res)
	require.Equal(t, "TypeError tool(): got an unexpected keyword argument 'ka'\n", res.Stdout)
	require.Zero(t, calls)

	// A JSON Schema of as many properties is refused as soon as it has
	// more than the limit, without reading on.
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := 0; i < 150000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"p` + strconv.Itoa(i) + `":{}`)
	}
	b.WriteString(`}}`)
	res, err = p.Run(context.Background(), Job{Tools: []Tool{{Name: "tool", Parameters: json.RawMessage(b.String())}}, Host: host, Code: "1"})
	require.NoError(t, err)
	requireErrorType(t, res, "RequestError")
	require.Contains(t, res.Err().Error(), `"properties": more than 64 keys`)
	advServes(t, p)
}

// An idle session's file that someone else replaced while the session was
// kept (a user who may write in a shared idle-dump directory: not a job,
// which can never reach it) is not loaded: the session comes back empty
// and not Restored. Before the fix the pool loaded whatever file stood
// under the name it had written, and the planted dump's code ran as the
// session's (here it set a global the session then saw).
func TestHostileReview4IdleDumpReplaced(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a file of another user")
	}
	dumps := t.TempDir()
	p := newTestPool(t, Config{Workers: 1, SessionIdle: 300 * time.Millisecond, SessionIdleDump: dumps})
	ctx := context.Background()
	a, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer a.Finish(ctx)
	feedOK(t, a, "secret = 1")
	var kept []string
	require.Eventually(t, func() bool {
		kept, _ = filepath.Glob(filepath.Join(dumps, "*.dump"))
		if len(kept) != 1 {
			return false
		}
		// The pool creates the file, then writes the dump into it: wait
		// for the dump, not the empty file.
		st, err := os.Stat(kept[0])
		return err == nil && st.Size() > 0
	}, 30*time.Second, 20*time.Millisecond, "session a was not kept in the idle-dump directory")
	planted := reduceDump(t, "exec", "import __main__\n__main__.planted = 1")
	require.NoError(t, os.Remove(kept[0]))
	require.NoError(t, os.WriteFile(kept[0], planted, 0o600))
	require.NoError(t, os.Chown(kept[0], 65534, 65534))
	ev, err := a.Feed(ctx, Step{Code: "print('planted' in globals(), 'secret' in globals())"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "False False\n", ev.Result.Stdout, "a replaced idle dump was loaded into the session")
	require.False(t, ev.Result.Restored)
	_, err = os.Stat(kept[0])
	require.True(t, os.IsNotExist(err), "the replaced file was left behind")
	advServes(t, p)
}

// A job that fills its scratch directory (a tmpfs by default) is held to
// its memory allowance where the pool has memory cgroups: the pages are
// charged to the job, it ends with an error well before it has written
// four times its allowance, and the next job finds its scratch empty.
func TestHostileReview4ScratchFill(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	if p.Cgroups() == "none" {
		t.Skip("no memory cgroups: tmpfs pages are not bounded per job (a known limit)")
	}
	res := run(t, p, Job{Memory: 64 << 20, Timeout: 30 * time.Second, Code: `
import os, sys
d = os.environ["TMPDIR"]
chunk = b"x" * (4 << 20)
n = 0
try:
    while n < (256 << 20):
        with open(os.path.join(d, "f%d" % n), "wb") as f:
            f.write(chunk)
        n += len(chunk)
        print(n, flush=True)
except BaseException as e:
    print("stopped", type(e).__name__, n, flush=True)
    raise
`})
	require.NotNil(t, res.Error, "the job wrote 256 MiB into its scratch under a 64 MiB allowance: %s", res.Stdout)
	lines := strings.Fields(res.Stdout)
	require.NotContains(t, lines, strconv.Itoa(256<<20))
	requireScratchEmpty(t, p, "the filled scratch was left behind")
	res = run(t, p, Job{Code: "import os\nprint(os.listdir(os.environ['TMPDIR']), os.listdir(os.environ['PYNOX_OUTPUTS']))"})
	requireOK(t, res)
	require.Equal(t, "['outputs'] []\n", res.Stdout)
}

// A session that replaces the runner's SIGINT handler with its own, which
// raises at once, and is interrupted while a host call waits for its
// reply: whatever that does to its own channel ends at most that session
// (the reply of the interrupted call never reaches a later step), and
// another session and the pool go on.
func TestHostileReview4OwnSigintHandlerDuringCall(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	inCall := make(chan struct{}, 16)
	release := make(chan struct{})
	host := func(ctx context.Context, c *Call) (any, error) {
		inCall <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return "reply-of-the-interrupted-call", nil
	}
	co, err := p.Checkout(ctx, Job{Functions: []string{"wait"}, Host: host})
	require.NoError(t, err)
	defer co.Finish(ctx)
	other, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer other.Finish(ctx)
	feedOK(t, other, "y = 2")
	feedOK(t, co, `
import signal
def h(*a):
    raise RuntimeError("own handler")
signal.signal(signal.SIGINT, h)
`)
	done := make(chan *Result, 1)
	go func() {
		ev, err := co.Feed(ctx, Step{Code: "import pynox_host\nr = pynox_host.wait()\nprint('got', r)"})
		if err != nil || ev.Result == nil {
			done <- nil
			return
		}
		done <- ev.Result
	}()
	<-inCall
	require.True(t, co.Interrupt())
	close(release)
	res := <-done
	require.NotNil(t, res)
	t.Logf("interrupted step: stdout %q, error %+v, session ended %v", res.Stdout, res.Error, res.SessionEnded)
	if !res.SessionEnded {
		// The session lives on: its next step sees no stale reply.
		ev, err := co.Feed(ctx, Step{Code: "print('next')"})
		require.NoError(t, err)
		require.NotContains(t, ev.Result.Stdout, "reply-of-the-interrupted-call")
	}
	require.Equal(t, "2\n", feedOK(t, other, "print(y)").Stdout)
	advServes(t, p)
}

// A session thread that writes a forged report for the step that follows
// (it is stopped between steps, so it writes it while that step runs)
// lies only about that step of its own session, as its code could: the
// runner's real report of that step then arrives in the next step, which
// ends as a protocol break (PoolWorkerError, session ended), never
// answered by the stale report; the step after runs in a new process.
// Another session and the pool go on.
func TestHostileReview4ForgedReportBetweenSteps(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	a, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer a.Finish(ctx)
	b, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer b.Finish(ctx)
	feedOK(t, b, "y = 3")
	feedOK(t, a, `
import json, os, struct, threading, time
def forge():
    time.sleep(0.2)
    b = json.dumps({"t": "done", "step": 2, "exit": 0, "error": None, "value": {"forged": True}}).encode()
    os.write(3, struct.pack("<I", len(b)) + b)
    os.write(4, b"!")
threading.Thread(target=forge, daemon=True).start()
`)
	ev, err := a.Feed(ctx, Step{Code: "import time\ntime.sleep(0.5)\n41 + 1"})
	require.NoError(t, err)
	t.Logf("step 2 (its own code lied about it): value %s, error %+v, ended %v", ev.Result.Value, ev.Result.Error, ev.Result.SessionEnded)
	ev, err = a.Feed(ctx, Step{Code: "print('three')"})
	require.NoError(t, err)
	res := ev.Result
	t.Logf("step 3: stdout %q, error %+v, ended %v, restarted %v", res.Stdout, res.Error, res.SessionEnded, res.Restarted)
	require.Empty(t, res.Value)
	if res.Error != nil {
		require.True(t, res.SessionEnded, "%+v", res)
	}
	ev, err = a.Feed(ctx, Step{Code: "print('four')"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "four\n", ev.Result.Stdout)
	require.Equal(t, "3\n", feedOK(t, b, "print(y)").Stdout)
	advServes(t, p)
}
