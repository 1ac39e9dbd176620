package pynox

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSessionsEndWithPool(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1}) // closed below; the cleanup's second Close does nothing
	co, err := p.Checkout(context.Background(), Job{})
	require.NoError(t, err)
	ev, err := co.Feed(context.Background(), Step{Code: "import os\nprint(os.readlink('/proc/self'))"}) // its pid in the pool's namespace
	require.NoError(t, err)
	requireOK(t, ev.Result)
	pid := co.Pid()
	require.NotZero(t, pid)
	require.Equal(t, fmt.Sprintf("%d\n", pid), ev.Result.Stdout)
	tplPid := co.tpl.Pid()
	require.NoError(t, p.Close())
	require.Eventually(t, func() bool { return !processAlive(pid) && !processAlive(tplPid) }, 5*time.Second, 20*time.Millisecond)
	_, err = co.Feed(context.Background(), Step{Code: "1"})
	require.ErrorIs(t, err, ErrClosed)
	_, err = p.Checkout(context.Background(), Job{})
	require.ErrorIs(t, err, ErrClosed)
}

func TestCheckoutAPI(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, MaxSessions: 1})
	ctx := context.Background()
	_, err := p.Checkout(ctx, Job{Code: "1"})
	require.ErrorIs(t, err, ErrRequest)
	_, err = p.Checkout(ctx, Job{Script: "x.py"})
	require.ErrorIs(t, err, ErrRequest)
	co, err := p.Checkout(ctx, Job{Functions: []string{"add"}})
	require.NoError(t, err)
	_, err = p.Checkout(ctx, Job{})
	require.ErrorIs(t, err, ErrExhausted)

	// Without a Host, calls surface as turn events.
	ev, err := co.Feed(ctx, Step{ID: "s1", Code: "from pynox_host import add\ntotal = add(2, b=3)\nprint(total)"})
	require.NoError(t, err)
	require.NotNil(t, ev.Call)
	require.Equal(t, "add", ev.Call.Function)
	require.Equal(t, "s1", ev.Call.JobID)
	require.JSONEq(t, `[2]`, string(ev.Call.Args))
	require.JSONEq(t, `{"b": 3}`, string(ev.Call.Kwargs))
	_, err = co.Feed(ctx, Step{Code: "1"})
	require.ErrorIs(t, err, ErrProtocol)
	ev, err = co.Resume(ctx, ev.Call.ID, Return(5))
	require.NoError(t, err)
	require.NotNil(t, ev.Result)
	requireOK(t, ev.Result)
	require.Equal(t, "5\n", ev.Result.Stdout)
	require.Equal(t, 1, ev.Result.Step)
	require.Equal(t, 1, ev.Result.Calls)
	_, err = co.Resume(ctx, 1, Return(1))
	require.ErrorIs(t, err, ErrProtocol)

	ev, err = co.Feed(ctx, Step{Code: "from pynox_host import add, HostError\ntry:\n    add(1)\nexcept HostError as e:\n    print('host said', e)"})
	require.NoError(t, err)
	require.NotNil(t, ev.Call)
	ev, err = co.Resume(ctx, ev.Call.ID, Raise("no adding today"))
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "host said no adding today\n", ev.Result.Stdout)
	require.Equal(t, 2, ev.Result.Step)

	// A canceled step is interrupted; the session lives on.
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = co.Feed(cctx, Step{Code: "import time\ntime.sleep(30)"})
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	ev, err = co.Feed(ctx, Step{Code: "print('total' in globals())"})
	require.NoError(t, err)
	require.Equal(t, "True\n", ev.Result.Stdout)
	require.Equal(t, 4, ev.Result.Step)

	// Steps are bounded by the ceiling.
	_, err = co.Feed(ctx, Step{Code: "1", Timeout: time.Hour})
	require.ErrorIs(t, err, ErrRequest)
	_, err = co.Feed(ctx, Step{})
	require.ErrorIs(t, err, ErrRequest)

	pid := co.Pid()
	require.NoError(t, co.Finish(ctx))
	require.ErrorIs(t, co.Finish(ctx), ErrFinished)
	_, err = co.Feed(ctx, Step{Code: "1"})
	require.ErrorIs(t, err, ErrFinished)
	require.Eventually(t, func() bool { return !processAlive(pid) }, 5*time.Second, 20*time.Millisecond)
	co2, err := p.Checkout(ctx, Job{})
	require.NoError(t, err, "finishing frees the session's slot")
	require.NoError(t, co2.Finish(ctx))
}

func TestSessionOutputBetweenSteps(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	// A thread that keeps writing between steps writes to /dev/null then;
	// during a step its output is that step's.
	requireOK(t, feed(t, co, "import threading, time, os, sys\n"+
		"def spam():\n    while True:\n        os.write(1, b'.')\n        time.sleep(0.001)\n"+
		"threading.Thread(target=spam, daemon=True).start()\nprint('started')"))
	time.Sleep(100 * time.Millisecond)
	r := feed(t, co, "import time\ntime.sleep(0.05)\nprint('two')")
	requireOK(t, r)
	require.Contains(t, r.Stdout, "two\n")
	dots := strings.Count(r.Stdout, ".")
	require.Less(t, dots, 200, "only the step's own 50ms of dots")
	require.Greater(t, dots, 0, "the thread's writes during the step are the step's output")
	r = feed(t, co, "print(sum(range(10)))")
	requireOK(t, r)
	require.Equal(t, 3, r.Step)
}

// TestSessionTemplateDeath: a session's process dies with the pool
// template it was forked from (PID 1 of its namespace). The pool replaces
// the template, and the session's next step runs in a replacement process
// whose result says so (Restarted, step 1, empty globals).
func TestSessionTemplateDeath(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	fds0 := advSteadyFDs(t)
	for i := 0; i < 3; i++ {
		r := feed(t, co, "x = 1")
		requireOK(t, r)
		require.Equal(t, i > 0, r.Restarted, "only a replacement process's first step says Restarted")
		r = feed(t, co, "print(x)")
		requireOK(t, r)
		require.False(t, r.Restarted)
		co.mu.Lock()
		tpl := co.tpl
		co.mu.Unlock()
		require.NoError(t, syscall.Kill(tpl.Pid(), syscall.SIGKILL))
		<-tpl.Done()
		r = feed(t, co, "print('x' in globals())")
		requireOK(t, r)
		require.Equal(t, "False\n", r.Stdout)
		require.Equal(t, 1, r.Step)
		require.True(t, r.Restarted, "the step after the loss says it runs in a new process")
		require.False(t, r.SessionEnded)
		r = feed(t, co, "raise SystemExit")
		require.True(t, r.SessionEnded)
		require.False(t, r.Restarted)
	}
	require.Equal(t, fds0, advSteadyFDs(t), "no descriptor of a lost process is left behind")
}

// TestCloseWaitsForStartingCheckout: a checkout whose template is still
// starting when the pool closes leaves no process behind Close.
func TestCloseWaitsForStartingCheckout(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1}) // closed below; the cleanup's second Close does nothing
	errc := make(chan error, 1)
	go func() {
		_, err := p.Checkout(context.Background(), Job{})
		errc <- err
	}()
	time.Sleep(3 * time.Millisecond)
	require.NoError(t, p.Close())
	// Close has waited for every template (the session's, still starting,
	// included); their children die of their parent-death signal a moment
	// later.
	var templates []int
	for _, pid := range loadPoolProcesses(t, p) {
		if state, ppid, ok := procStat(pid); ok && ppid == os.Getpid() && state != "Z" {
			templates = append(templates, pid)
		}
	}
	require.Empty(t, templates, "no template survives Close")
	require.Eventually(t, func() bool { return len(loadPoolProcesses(t, p)) == 0 }, 5*time.Second, 10*time.Millisecond,
		"no process survives the pool: %v", loadPoolProcesses(t, p))
	if err := <-errc; err != nil {
		require.ErrorIs(t, err, ErrClosed)
	}
}
