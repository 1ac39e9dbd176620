package pynox

import (
	"context"
	"fmt"
	"github.com/pynox/pynox/internal/probes"
	"github.com/pynox/pynox/internal/testenv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/worker"
)

// Adversarial probes of the job's side of the control protocol as the
// worker reads it: forged host calls whose arguments no client could read,
// a flood of the bell, and a session's CPU-time limit.

// TestHostileCallArguments forges host calls whose arguments are valid
// JSON to Go but not to every client, and checks that the call is refused
// in the job, before any host function sees it.
func TestHostileCallArguments(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	var called atomic.Int64
	host := func(ctx context.Context, c *Call) (any, error) {
		called.Add(1)
		return "reached the host", nil
	}
	for _, tc := range probes.BadCallArgs {
		t.Run(tc.Name, func(t *testing.T) {
			r := run(t, p, Job{Functions: []string{"f"}, Host: host, Timeout: 10 * time.Second,
				Code: probes.ForgeCall + "call(" + tc.Frame + ")\nprint('still running')"})
			requireOK(t, r)
			require.Contains(t, r.Stdout, `"error":"the arguments to f cannot be passed on: `)
			require.Contains(t, r.Stdout, "still running")
			require.Zero(t, called.Load(), "the host function was called")
		})
	}
	// Honest calls near the limits still reach the host.
	r := run(t, p, Job{Functions: []string{"f"}, Host: host, Code: "import sys\nfrom pynox_host import f\n" +
		"deep = []\nfor _ in range(254):\n    deep = [deep]\n" +
		"print(f('naïve \\U0001f40d', deep, n=int('9' * 4299), x=-1.5e300))"})
	requireOK(t, r)
	require.Equal(t, "reached the host\n", r.Stdout)
	require.EqualValues(t, 1, called.Load())
	advServes(t, p)
}

// TestHostileBellFlood floods the bell (descriptor 4) with no frames on
// the control channel: the job is ended as a protocol break at once, not
// after its timeout, and the pool serves on.
func TestHostileBellFlood(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Timeout: 20 * time.Second, Code: "import os, time\n" +
		"block = b'!' * 65536\n" +
		"end = time.monotonic() + 5\n" +
		"while time.monotonic() < end:\n" +
		"    os.write(4, block)\n" +
		"print('flooded for 5 s')"})
	requireErrorType(t, r, "PoolWorkerError")
	require.Contains(t, r.Error.Message, "rang its bell")
	require.NotContains(t, r.Stdout, "flooded")
	advServes(t, p)
}

// TestBellHonestPatterns runs what rings the bell legitimately and often:
// hundreds of host calls, and calls too large for the socket's buffer,
// whose header rings before the rest is written, in a job and across a
// session's steps.
func TestBellHonestPatterns(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	host := func(ctx context.Context, c *Call) (any, error) { return len(c.Args), nil }
	code := "from pynox_host import f\n" +
		"n = sum(1 for i in range(900) if f(i) > 0)\n" +
		"big = sum(f('x' * 300000) for _ in range(20))\n" +
		"print(n, big)"
	r := run(t, p, Job{Functions: []string{"f"}, Host: host, Code: code})
	requireOK(t, r)
	require.Equal(t, "900 6000080\n", r.Stdout)

	co := checkout(t, p, Job{Functions: []string{"f"}, Host: host})
	for i := 0; i < 2; i++ { // a later step as well as the first
		r := feed(t, co, code)
		requireOK(t, r)
		require.Equal(t, "900 6000080\n", r.Stdout)
	}
}

// TestHostileSessionCPULimit checks that a session's code cannot lift its
// CPU-time limit, at its first step or a later one: the hard limit is
// finite (the session's whole life's CPU time) and stays so. That each
// step is held to its own allowance below it is
// internal/worker.TestSessionStepCPULimit.
func TestHostileSessionCPULimit(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{Timeout: 5 * time.Second})
	probe := "import resource\n" +
		"soft, hard = resource.getrlimit(resource.RLIMIT_CPU)\n" +
		"print('hard', hard)\n" +
		"for lim in ((resource.RLIM_INFINITY, resource.RLIM_INFINITY), (hard + 100, hard + 100)):\n" +
		"    try:\n" +
		"        resource.setrlimit(resource.RLIMIT_CPU, lim)\n" +
		"    except ValueError:\n" +
		"        print('refused')\n" +
		"    else:\n" +
		"        print('RAISED')\n" +
		"import ctypes\n" +
		"libc = ctypes.CDLL(None, use_errno=True)\n" +
		"class R(ctypes.Structure):\n" +
		"    _fields_ = [('cur', ctypes.c_ulong), ('max', ctypes.c_ulong)]\n" +
		"new = R(2**64 - 1, 2**64 - 1)\n" +
		"print('prlimit', libc.prlimit(0, resource.RLIMIT_CPU, ctypes.byref(new), None), ctypes.get_errno())\n"
	for step := 1; step <= 2; step++ { // the first step and a later one
		r := feed(t, co, probe+"x = 0\nfor i in range(3000000):\n    x += i\n")
		requireOK(t, r)
		require.Equal(t, fmt.Sprintf("hard %d\nrefused\nrefused\nprlimit -1 1\n", worker.SessionCPU), r.Stdout, "step %d", step)
	}
}
