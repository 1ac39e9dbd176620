package pynox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Adversarial probes for sessions and host functions: a session's process
// is as confined as a one-shot job's, whatever it writes on its control
// channel (between steps too) hurts only itself, and the pool keeps
// serving every other session and job.

// feed runs one step and returns its result, failing on a Feed error.
func feed(t *testing.T, co *Checkout, code string) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ev, err := co.Feed(ctx, Step{Code: code})
	require.NoError(t, err)
	require.NotNil(t, ev.Result, "got a call event: %+v", ev.Call)
	return ev.Result
}

func checkout(t testing.TB, p *Pool, job Job) *Checkout {
	t.Helper()
	co, err := p.Checkout(context.Background(), job)
	require.NoError(t, err)
	t.Cleanup(func() { co.Finish(context.Background()) })
	return co
}

func TestHostileSessionConfined(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	requireOK(t, feed(t, co, "x = 1"))
	// Later steps run under the same confinement as the first.
	r := feed(t, co, advCode(`R = {}
R["seccomp"] = str(_libc.prctl(21, 0, 0, 0, 0))  # PR_GET_SECCOMP: 2 = filter
R["nnp"] = str(_libc.prctl(39, 0, 0, 0, 0))  # PR_GET_NO_NEW_PRIVS
R["capbnd"] = str(_libc.prctl(23, 21, 0, 0, 0))  # PR_CAPBSET_READ CAP_SYS_ADMIN
for name, f in [("fork", os.fork), ("passwd", lambda: open("/etc/passwd").read()),
                ("socket", lambda: __import__("socket").socket()),
                ("exec", lambda: os.execv("/bin/true", ["true"]))]:
    try:
        f()
        R[name] = "ok"
    except OSError as e:
        R[name] = _errno.errorcode[e.errno]
`))
	require.Empty(t, r.Stderr)
	advExpect(t, advProbes(t, r), map[string][]string{
		"seccomp": {"2"}, "nnp": {"1"}, "capbnd": {"0"},
		"fork": {"EPERM"}, "passwd": {"EACCES"}, "socket": {"EPERM", "EACCES"}, "exec": {"EPERM", "EACCES"},
	})
	r = feed(t, co, "print(x)")
	requireOK(t, r)
	require.Equal(t, 3, r.Step)
	advServes(t, p)
}

// forgeSend is Python defining send(s): it writes the string s as a frame
// on the control channel (descriptor 3) and rings the bell (4), as the
// runner would.
const forgeSend = "import os, struct\ndef send(s):\n    b = s.encode()\n    os.write(3, struct.pack('<I', len(b)) + b)\n    os.write(4, b'!')\n"

func TestHostileSessionForgedFrames(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	frame := func(obj string) string { return forgeSend + "send(" + obj + ")\n" }
	cases := []struct {
		name string
		code string
		// want is the forging step's error type ("" for a lie the pool
		// cannot tell from the truth); the session ends either then or at
		// its next step.
		want string
	}{
		{"garbage", "import os\nos.write(3, b'\\xff\\xff\\xff\\x7f garbage')\nos.write(4, b'!')\nimport time\ntime.sleep(1)", "PoolWorkerError"},
		{"malformed json", frame(`'{"t": "done", '`) + "import time\ntime.sleep(1)", "PoolWorkerError"},
		{"done for another step", frame(`'{"t": "done", "step": 7, "exit": 0, "error": None}'.replace("None", "null")`) + "import time\ntime.sleep(1)", "PoolWorkerError"},
		{"unknown frame", frame(`'{"t": "reply", "result": 1}'`) + "import time\ntime.sleep(1)", "PoolWorkerError"},
		{"call without functions", frame(`'{"t": "call", "step": 2, "function": "f", "args": [], "kwargs": {}}'`) +
			"n = struct.unpack('<I', os.read(3, 4))[0]\nprint(os.read(3, n).decode())", ""},
		{"forged done, then the real one", frame(`'{"t": "done", "step": 2, "exit": 0, "error": None}'.replace("None", "null")`) + "print('after')", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			co := checkout(t, p, Job{Timeout: 5 * time.Second})
			requireOK(t, feed(t, co, "secret = 'kept'"))
			r := feed(t, co, tc.code)
			if tc.want != "" {
				requireErrorType(t, r, tc.want)
				require.True(t, r.SessionEnded, "a broken protocol ends the session")
			} else if tc.name == "call without functions" {
				requireOK(t, r)
				require.Contains(t, r.Stdout, `"error":"no host function named \"f\""`)
			}
			// Whatever happened, the next step gets a sound answer: the
			// session lives on, or a new process says it ended.
			r = feed(t, co, "print(secret)")
			if r.Error == nil {
				require.Equal(t, "kept\n", r.Stdout)
			} else {
				require.Contains(t, []string{"NameError", "PoolWorkerError"}, r.Error.Type, "%+v", r.Error)
			}
			r = feed(t, co, "print('serving')")
			if r.Error != nil { // the stray real report of a forged step ends it here
				requireErrorType(t, r, "PoolWorkerError")
				r = feed(t, co, "print('serving')")
			}
			requireOK(t, r)
			require.Equal(t, "serving\n", r.Stdout)
			advServes(t, p)
		})
	}
}

func TestHostileSessionStealsItsNextStep(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{Timeout: time.Second})
	// Threads that read the control channel between steps take the next
	// step's frame: that step never runs, times out, and the session ends.
	// (Which reader the kernel wakes is not fixed: the runner may win a
	// few times, and then a later step is the one taken.)
	requireOK(t, feed(t, co, "import os, threading, time\nfor _ in range(4):\n    threading.Thread(target=lambda: os.read(3, 1 << 20), daemon=True).start()\ntime.sleep(0.2)"))
	var r *Result
	for i := 0; i < 30; i++ {
		r = feed(t, co, "print('ran')")
		if r.Error != nil {
			break
		}
		require.Equal(t, "ran\n", r.Stdout)
	}
	if r.Error == nil {
		// The runner waits in poll and reads as soon as the pool resumes
		// the process; on a loaded machine it can win every time.
		t.Skip("the runner took all 30 steps before the stealing threads: nothing to check")
	}
	// Usually a TimeoutError; a frame split between a thread and the
	// runner may end the process otherwise. Either way only this session
	// suffers, and it starts afresh.
	require.True(t, r.SessionEnded, "%+v", r.Error)
	r = feed(t, co, "print('fresh')")
	requireOK(t, r)
	require.Equal(t, 1, r.Step)
	advServes(t, p)
}

func TestHostileSessionCPUBetweenSteps(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{Timeout: time.Second})
	// A thread that would burn CPU between steps (ignoring SIGXCPU, so no
	// rlimit could stop it) does not run at all: the pool stops the
	// session's process between steps and resumes it for the next.
	requireOK(t, feed(t, co, "import signal, threading\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"+
		"n = 0\ndef spin():\n    global n\n    while True:\n        n += 1\nthreading.Thread(target=spin, daemon=True).start()"))
	pid := co.Pid()
	// SIGSTOP takes effect when the process is next scheduled.
	require.Eventually(t, func() bool { s, _ := procStateCPU(t, pid); return s == "T" }, 5*time.Second, 5*time.Millisecond,
		"stopped between steps")
	_, cpu0 := procStateCPU(t, pid)
	time.Sleep(time.Second)
	state, cpu1 := procStateCPU(t, pid)
	require.Equal(t, "T", state, "still stopped")
	require.LessOrEqual(t, cpu1-cpu0, uint64(2), "clock ticks of CPU used while stopped")
	r := feed(t, co, "import time\nbefore = n\ntime.sleep(0.05)\nprint(n > before)")
	requireOK(t, r)
	require.Equal(t, "True\n", r.Stdout, "the thread runs again during a step")
	require.Equal(t, 2, r.Step)
	advServes(t, p)
}

// procStateCPU returns a process's state letter and its user+system CPU
// time in clock ticks.
func procStateCPU(t *testing.T, pid int) (string, uint64) {
	t.Helper()
	f := procStatFields(pid)
	require.Greater(t, len(f), 12, "process %d is gone", pid)
	utime, err := strconv.ParseUint(f[11], 10, 64)
	require.NoError(t, err)
	stime, err := strconv.ParseUint(f[12], 10, 64)
	require.NoError(t, err)
	return f[0], utime + stime
}

func TestHostileSessionsIsolated(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	a := checkout(t, p, Job{})
	b := checkout(t, p, Job{})
	// B's pid as the pool knows it (in a PID namespace of its own, os.getpid()
	// is B's pid there).
	rb := feed(t, b, "import os\nvictim = 'alive'\nprint(os.readlink('/proc/self'))")
	requireOK(t, rb)
	pidB, err := strconv.Atoi(strings.TrimSpace(rb.Stdout))
	require.NoError(t, err)
	ra := feed(t, a, advCode(fmt.Sprintf(`R = {}
import signal
for name, f in [("kill", lambda: os.kill(%d, signal.SIGKILL)),
                ("environ", lambda: open("/proc/%d/environ").read()),
                ("mem", lambda: open("/proc/%d/mem", "rb").read(1)),
                ("fd", lambda: os.listdir("/proc/%d/fd"))]:
    try:
        f()
        R[name] = "ok"
    except OSError as e:
        R[name] = _errno.errorcode[e.errno]
`, pidB, pidB, pidB, pidB)))
	advExpect(t, advProbes(t, ra), map[string][]string{
		// ESRCH: B is not even visible from A's PID namespace.
		"kill": {"EPERM", "ESRCH"}, "environ": {"EACCES"}, "mem": {"EACCES"}, "fd": {"EACCES"},
	})
	r := feed(t, b, "print(victim)")
	requireOK(t, r)
	require.Equal(t, "alive\n", r.Stdout)
}

func TestHostileHostCalls(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	var seen []string
	host := func(ctx context.Context, c *Call) (any, error) {
		seen = append(seen, c.Function)
		return "ok", nil
	}
	raw := forgeSend
	cases := []struct{ name, code string }{
		// Two calls without waiting for the first answer.
		{"two calls at once", raw + "send('{\"t\":\"call\",\"step\":1,\"function\":\"g\",\"args\":[],\"kwargs\":{}}')\nsend('{\"t\":\"call\",\"step\":1,\"function\":\"f\",\"args\":[],\"kwargs\":{}}')\nimport time\ntime.sleep(2)"},
		{"args not an array", raw + "send('{\"t\":\"call\",\"step\":1,\"function\":\"f\",\"args\":{\"a\":1},\"kwargs\":{}}')\nimport time\ntime.sleep(2)"},
		{"kwargs not an object", raw + "send('{\"t\":\"call\",\"step\":1,\"function\":\"f\",\"args\":[],\"kwargs\":[1]}')\nimport time\ntime.sleep(2)"},
		{"done while a call waits", raw + "send('{\"t\":\"call\",\"step\":1,\"function\":\"g\",\"args\":[],\"kwargs\":{}}')\nsend('{\"t\":\"done\",\"step\":1,\"exit\":0,\"error\":null}')\nimport time\ntime.sleep(2)"},
	}
	slow := func(ctx context.Context, c *Call) (any, error) {
		if c.Function == "g" {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return host(ctx, c)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, p, Job{Functions: []string{"f", "g"}, Host: slow, Timeout: 10 * time.Second, Code: tc.code})
			requireErrorType(t, r, "PoolWorkerError")
			advServes(t, p)
		})
	}
	// A call forged for a step that is not running is refused as a
	// protocol break too.
	r := run(t, p, Job{Functions: []string{"f"}, Host: host, Code: raw + "send('{\"t\":\"call\",\"step\":9,\"function\":\"f\",\"args\":[],\"kwargs\":{}}')\nimport time\ntime.sleep(2)"})
	requireErrorType(t, r, "PoolWorkerError")

	// JSON that is valid for Python but not for Go never reaches the host.
	before := len(seen)
	r = run(t, p, Job{Functions: []string{"f"}, Host: host, Code: raw + "send('{\"t\":\"call\",\"step\":1,\"function\":\"f\",\"args\":[NaN],\"kwargs\":{}}')\nimport time\ntime.sleep(2)"})
	requireErrorType(t, r, "PoolWorkerError")
	require.Equal(t, before, len(seen))
	advServes(t, p)
}

func TestHostCallsFromThreadsBetweenSteps(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	var steps []any
	host := func(ctx context.Context, c *Call) (any, error) {
		steps = append(steps, c.JobID)
		return json.RawMessage(`"answer"`), nil
	}
	co := checkout(t, p, Job{Functions: []string{"f"}, Host: host})
	// A thread that calls the host after its step ended waits for the next
	// step, and its call is that step's.
	requireOK(t, feed(t, co, "import threading, time\nfrom pynox_host import f\nout = []\n"+
		"def later():\n    time.sleep(0.2)\n    out.append(f())\nthreading.Thread(target=later).start()"))
	time.Sleep(500 * time.Millisecond)
	ctx := context.Background()
	ev, err := co.Feed(ctx, Step{ID: "second", Code: "import time\nfor _ in range(100):\n    if out:\n        break\n    time.sleep(0.01)\nprint(out)"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "['answer']\n", ev.Result.Stdout)
	require.Equal(t, []any{"second"}, steps)
}
