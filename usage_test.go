package pynox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// requireUsage checks that a result carries plausible kernel figures.
func requireUsage(t *testing.T, res *Result) *Usage {
	t.Helper()
	u := res.Usage
	require.NotNil(t, u, "no usage in the result: %+v", res)
	require.Positive(t, u.CPUMS)
	require.Positive(t, u.MinorFaults)
	require.Positive(t, u.MaxRSSBytes)
	require.Positive(t, u.WallMS)
	require.InDelta(t, float64(res.DurationUS)/1000, u.WallMS, 0.002)
	return u
}

// TestUsageOneShot: a one-shot job's usage is its process's rusage, which
// the template reads with wait4: a job that allocates 200 MiB shows a peak
// RSS above it, a CPU-bound loop of 0.3 s (thread CPU time, so that a busy
// machine cannot shorten it) at least 250 ms of CPU time; and a job that
// forges a report of its own changes none of it.
func TestUsageOneShot(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})

	res := run(t, p, Job{Code: "b = bytearray(200 << 20)\nb[::4096] = b'x' * len(b[::4096])\nprint(len(b))"})
	requireOK(t, res)
	u := requireUsage(t, res)
	require.Greater(t, u.MaxRSSBytes, int64(200<<20))
	require.Greater(t, u.MinorFaults, int64(200<<20/4096/2)) // touched pages, huge pages aside

	res = run(t, p, Job{Code: "import time\nt = time.thread_time()\nwhile time.thread_time() - t < 0.3:\n    pass"})
	requireOK(t, res)
	u = requireUsage(t, res)
	require.GreaterOrEqual(t, u.CPUMS, 250.0)

	// A small job uses little: the figures are its own, not the
	// template's or the previous job's.
	res = run(t, p, Job{Code: "1"})
	requireOK(t, res)
	u = requireUsage(t, res)
	require.Less(t, u.CPUMS, 250.0)
	require.Less(t, u.MaxRSSBytes, int64(200<<20))

	// Failures carry usage too; refusals have none.
	res = run(t, p, Job{Code: "raise ValueError('x')"})
	requireErrorType(t, res, "ValueError")
	requireUsage(t, res)
	res = run(t, p, Job{Code: "1", Timeout: -1})
	requireErrorType(t, res, "RequestError")
	require.Nil(t, res.Usage)
}

// TestUsageForged: the figures never come from the job. A job that burns
// CPU, then writes a report of its own on its control channel with a
// "usage" and the template's exit fields (tiny figures), and exits
// without the runner's report, gets the kernel's figures; so does a job
// whose forged template frame breaks its protocol.
func TestUsageForged(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	forge := `import os, json, struct, time
t = time.thread_time()
while time.thread_time() - t < 0.3:
    pass
msg = json.dumps(FRAME).encode()
os.write(3, struct.pack("<I", len(msg)) + msg)
os.write(4, b"x")  # the bell
os._exit(0)
`
	tiny := map[string]any{"cpu_ms": 1, "max_rss_bytes": 1, "minor_faults": 1, "wall_ms": 1}
	for name, frame := range map[string]map[string]any{
		"done": {"t": "done", "step": 1, "exit": 0, "error": nil, "final": true, "usage": tiny, "cpu_us": 1, "maxrss_kb": 1, "minflt": 1},
		"exit": {"t": "exit", "pid": 1, "code": 0, "cpu_us": 1, "maxrss_kb": 1, "minflt": 1, "usage": tiny},
	} {
		res := run(t, p, Job{Code: forge, Inputs: map[string]any{"FRAME": frame}})
		u := res.Usage
		require.NotNil(t, u, "%s: %+v", name, res)
		require.GreaterOrEqual(t, u.CPUMS, 250.0, name)
		require.Greater(t, u.MaxRSSBytes, int64(1<<20), name)
		require.Greater(t, u.MinorFaults, int64(1), name)
	}
	res := run(t, p, Job{Code: "print(1)"})
	requireOK(t, res)
	requireUsage(t, res)
}

// TestUsageSessionSteps: a session step's usage is its own — what the
// process's counters grew by during the step — and its peak RSS the
// step's own peak (the pool resets it before each step).
func TestUsageSessionSteps(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(ctx)
	step := func(code string) *Usage {
		t.Helper()
		ev, err := co.Feed(ctx, Step{Code: code})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		return requireUsage(t, ev.Result)
	}
	busy := step("import time\nt = time.thread_time()\nwhile time.thread_time() - t < 0.3:\n    pass\nb = bytearray(200 << 20)\nb[::4096] = b'x' * len(b[::4096])\ndel b")
	require.GreaterOrEqual(t, busy.CPUMS, 250.0)
	require.Greater(t, busy.MaxRSSBytes, int64(200<<20))
	require.Greater(t, busy.MinorFaults, int64(200<<20/4096/2))

	// The next step does little: its CPU time and faults are its own, not
	// the process's totals, and its peak is its own, below the last
	// step's (whose buffer is freed).
	small := step("x = 1")
	require.Less(t, small.CPUMS, 250.0)
	require.Less(t, small.MinorFaults, busy.MinorFaults/2)
	require.Less(t, small.MaxRSSBytes, int64(200<<20))

	// A step that ends its process takes its figures from the template's
	// wait4, less what the process had used before the step.
	ev, err := co.Feed(ctx, Step{Code: "import time, os\nt = time.thread_time()\nwhile time.thread_time() - t < 0.1:\n    pass\nos._exit(3)"})
	require.NoError(t, err)
	require.Equal(t, 3, ev.Result.Exit)
	require.True(t, ev.Result.SessionEnded)
	end := requireUsage(t, ev.Result)
	require.GreaterOrEqual(t, end.CPUMS, 80.0)
	require.Less(t, end.CPUMS, busy.CPUMS) // not the process's total (more than busy's)
}

// TestUsageStats: the stats add the results' CPU time up.
func TestUsageStats(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	var sum float64
	for range 2 {
		res := run(t, p, Job{Code: "sum(range(10000))"})
		requireOK(t, res)
		sum += requireUsage(t, res).CPUMS
	}
	require.InDelta(t, sum, p.Stats().CPUMSTotal, 0.01)
}
