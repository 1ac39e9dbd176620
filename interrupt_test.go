package pynox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// startedMark is code that creates the file path once the step runs, so
// that a test interrupts only a step that is under way.
func startedMark(path string) string {
	return "open(" + strconv.Quote(path) + ", 'w').close()\n"
}

// awaitFile waits until path exists, failing when the step's event comes
// first.
func awaitFile(t *testing.T, path string, ch <-chan TurnEvent) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case ev := <-ch:
			t.Fatalf("the step ended before it started: %+v %+v", ev.Result, ev.Call)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("%s was never created", path)
}

// feedAsync runs a step on its own goroutine.
func feedAsync(ctx context.Context, co *Checkout, step Step) <-chan TurnEvent {
	ch := make(chan TurnEvent, 1)
	go func() {
		ev, err := co.Feed(ctx, step)
		if err != nil && ev.Result == nil {
			ev.Result = &Result{Error: &ErrorInfo{Type: "feed error", Message: err.Error()}}
		}
		ch <- ev
	}()
	return ch
}

func TestInterruptKeepsSession(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{AllowWrite: []string{p.Config().Dir}, Timeout: 30 * time.Second})
	require.NoError(t, err)
	require.False(t, co.Interrupt(), "no step is running")
	ev, err := co.Feed(ctx, Step{Code: "x = 41"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	pid := co.Pid()
	require.False(t, co.Interrupt(), "no step is running between steps")

	mark := filepath.Join(p.Config().Dir, "started")
	ch := feedAsync(ctx, co, Step{Code: startedMark(mark) + "while True: pass"})
	awaitFile(t, mark, ch)
	require.True(t, co.Interrupt())
	ev = <-ch
	requireErrorType(t, ev.Result, "KeyboardInterrupt")
	require.False(t, ev.Result.SessionEnded, "the session lives on: %+v", ev.Result.Error)
	require.Equal(t, 2, ev.Result.Step)

	ev, err = co.Feed(ctx, Step{Code: "print(x + 1)"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "42\n", ev.Result.Stdout)
	require.Equal(t, 3, ev.Result.Step)
	require.Equal(t, pid, co.Pid(), "the same process")
}

func TestInterruptSleepAndHostCall(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	release := make(chan struct{})
	host := func(ctx context.Context, call *Call) (any, error) {
		<-release
		return 7, nil
	}
	co, err := p.Checkout(ctx, Job{AllowWrite: []string{p.Config().Dir}, Timeout: 30 * time.Second, Functions: []string{"slow"}, Host: host})
	require.NoError(t, err)
	dir := p.Config().Dir

	// A sleep is cut short.
	mark := filepath.Join(dir, "sleeping")
	ch := feedAsync(ctx, co, Step{Code: "import time\ny = 1\n" + startedMark(mark) + "time.sleep(300)"})
	awaitFile(t, mark, ch)
	require.True(t, co.Interrupt())
	ev := <-ch
	requireErrorType(t, ev.Result, "KeyboardInterrupt")
	require.False(t, ev.Result.SessionEnded)

	// An interrupt during a host call waits for its answer: the channel
	// stays in step, and the session lives on.
	mark = filepath.Join(dir, "calling")
	ch = feedAsync(ctx, co, Step{Code: "from pynox_host import slow\n" + startedMark(mark) + "r = slow()\nprint('after', r)"})
	awaitFile(t, mark, ch)
	time.Sleep(50 * time.Millisecond) // into the call (either way the outcome is the same)
	require.True(t, co.Interrupt())
	close(release)
	ev = <-ch
	requireErrorType(t, ev.Result, "KeyboardInterrupt")
	require.False(t, ev.Result.SessionEnded)
	require.NotContains(t, ev.Result.Stdout, "after")

	ev, err = co.Feed(ctx, Step{Code: "print(y, slow())"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "1 7\n", ev.Result.Stdout)
}

func TestInterruptSwallowedIsKilledAfterGrace(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{AllowWrite: []string{p.Config().Dir}, Timeout: 30 * time.Second})
	require.NoError(t, err)
	mark := filepath.Join(p.Config().Dir, "started")
	ch := feedAsync(ctx, co, Step{Code: "x = 1\nwhile True:\n    try:\n        " + startedMark(mark) + "        while True: pass\n    except KeyboardInterrupt:\n        pass\n"})
	awaitFile(t, mark, ch)
	if !co.Interrupt() {
		ev := <-ch
		t.Fatalf("no step was running: %+v %s", ev.Result.Error, ev.Result.Stderr)
	}
	ev := <-ch
	requireErrorType(t, ev.Result, "KeyboardInterrupt")
	require.True(t, ev.Result.SessionEnded)
	require.Contains(t, ev.Result.Error.Message, "killed")
	require.Zero(t, co.Pid())

	ev, err = co.Feed(ctx, Step{Code: "print('x' in globals())"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "False\n", ev.Result.Stdout, "a new process")
	require.Equal(t, 1, ev.Result.Step)
}

func TestFeedCtxCancelInterrupts(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	bg := context.Background()
	co, err := p.Checkout(bg, Job{AllowWrite: []string{p.Config().Dir}, Timeout: 30 * time.Second})
	require.NoError(t, err)
	_, err = co.Feed(bg, Step{Code: "x = 'kept'"})
	require.NoError(t, err)
	mark := filepath.Join(p.Config().Dir, "started")
	ctx, cancel := context.WithCancel(bg)
	ch := make(chan TurnEvent, 1)
	errc := make(chan error, 1)
	go func() {
		ev, err := co.Feed(ctx, Step{Code: startedMark(mark) + "while True: pass"})
		errc <- err
		ch <- ev
	}()
	awaitFile(t, mark, ch)
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	ev := <-ch
	require.NotNil(t, ev.Result)
	requireErrorType(t, ev.Result, "KeyboardInterrupt")
	require.False(t, ev.Result.SessionEnded)

	ev, err = co.Feed(bg, Step{Code: "print(x)"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "kept\n", ev.Result.Stdout)
	require.Equal(t, 3, ev.Result.Step)
}

type hostCtxKey struct{}

// TestHostFuncCallerContext: a HostFunc's ctx carries the caller's values
// and ends at the job's deadline or with the caller's ctx.
func TestHostFuncCallerContext(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	type seen struct {
		value    any
		deadline time.Time
		ok       bool
	}
	seenCh := make(chan seen, 4)
	host := func(ctx context.Context, call *Call) (any, error) {
		d, ok := ctx.Deadline()
		seenCh <- seen{ctx.Value(hostCtxKey{}), d, ok}
		if call.Function == "wait" {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return "ok", nil
	}
	ctx := context.WithValue(context.Background(), hostCtxKey{}, "trace-1")

	// Pool.Run: the value, and the job's deadline (its timeout of 20 s).
	before := time.Now()
	res, err := p.Run(ctx, Job{Code: "from pynox_host import f\nprint(f())", Functions: []string{"f"}, Host: host, Timeout: 20 * time.Second})
	require.NoError(t, err)
	requireOK(t, res)
	s := <-seenCh
	require.Equal(t, "trace-1", s.value)
	require.True(t, s.ok, "the call's ctx has the job's deadline")
	require.True(t, s.deadline.After(before) && !s.deadline.After(time.Now().Add(20*time.Second)), "deadline %v", s.deadline)

	// A session step: the value, the step's deadline, and the end of the
	// caller's ctx (the step is interrupted once the call returns).
	co, err := p.Checkout(context.Background(), Job{Functions: []string{"f", "wait"}, Host: host, Timeout: 30 * time.Second})
	require.NoError(t, err)
	ev, err := co.Feed(ctx, Step{Code: "from pynox_host import f, wait\nprint(f())", Timeout: 10 * time.Second})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	s = <-seenCh
	require.Equal(t, "trace-1", s.value)
	require.True(t, s.ok)
	require.False(t, s.deadline.After(time.Now().Add(10*time.Second)), "the step's own timeout: deadline %v", s.deadline)

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := co.Feed(cctx, Step{Code: "kept = 1\nwait()"})
		done <- err
	}()
	<-seenCh // the call is in the host
	cancel()
	require.ErrorIs(t, <-done, context.Canceled, "the call ended with the caller's ctx")
	ev, err = co.Feed(context.Background(), Step{Code: "print(kept)"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "1\n", ev.Result.Stdout)
}

func TestCheckoutWaitsForSlot(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, MaxSessions: 1, CheckoutTimeout: time.Hour})
	ctx := context.Background()
	first, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)

	type got struct {
		co  *Checkout
		err error
	}
	wait := func(ctx context.Context) <-chan got {
		ch := make(chan got, 1)
		go func() {
			co, err := p.Checkout(ctx, Job{})
			ch <- got{co, err}
		}()
		return ch
	}
	waiting := func() int {
		p.coMu.Lock()
		defer p.coMu.Unlock()
		return len(p.coWait.waiters)
	}
	a := wait(ctx)
	require.Eventually(t, func() bool { return waiting() == 1 }, time.Minute, 5*time.Millisecond)
	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	b := wait(bctx)
	require.Eventually(t, func() bool { return waiting() == 2 }, time.Minute, 5*time.Millisecond)

	require.NoError(t, first.Finish(ctx))
	ga := <-a // the first waiter, and only it
	require.NoError(t, ga.err)
	ev, err := ga.co.Feed(ctx, Step{Code: "print(1)"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, 1, waiting())
	select {
	case gb := <-b:
		t.Fatalf("the second waiter was woken too: %+v", gb)
	default:
	}
	bcancel()
	require.ErrorIs(t, (<-b).err, context.Canceled)
	require.Equal(t, 0, waiting())

	// The slot is not lost: finishing the checkout frees it.
	require.NoError(t, ga.co.Finish(ctx))
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	require.NoError(t, co.Finish(ctx))
}

func TestCheckoutTimeoutExhausted(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, MaxSessions: 1, CheckoutTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	start := time.Now()
	_, err = p.Checkout(ctx, Job{})
	require.ErrorIs(t, err, ErrExhausted)
	require.Contains(t, err.Error(), "checkout timeout")
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "it waited")
	var pe *Error
	require.True(t, errors.As(err, &pe))
	require.Equal(t, KindExhausted, pe.Kind)
	require.NoError(t, co.Finish(ctx))

	_, err = New(Config{CheckoutTimeout: -time.Second})
	var ce *ConfigError
	require.True(t, errors.As(err, &ce), "%v", err)
	require.Equal(t, "CheckoutTimeout", ce.Key)
}

// TestHostFuncDeadlineIsATimeout: a HostFunc that returns because its ctx
// reached the job's deadline does not turn the timeout into a HostError.
func TestHostFuncDeadlineIsATimeout(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	host := func(ctx context.Context, call *Call) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	for range 3 {
		res := run(t, p, Job{Code: "from pynox_host import block\nblock()", Functions: []string{"block"}, Host: host, Timeout: 200 * time.Millisecond})
		requireErrorType(t, res, "TimeoutError")
	}
}

// TestInterruptWhileCallAwaitsResume: an interrupt that reaches a step
// whose call waits for Resume takes effect once the call is answered.
func TestInterruptWhileCallAwaitsResume(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{Functions: []string{"ask"}, Timeout: 30 * time.Second})
	require.NoError(t, err)
	ev, err := co.Feed(ctx, Step{Code: "z = 3\nfrom pynox_host import ask\nr = ask()\nprint('after', r)"})
	require.NoError(t, err)
	require.NotNil(t, ev.Call)
	require.True(t, co.Interrupt())
	ev, err = co.Resume(ctx, ev.Call.ID, Return(1))
	require.NoError(t, err)
	require.NotNil(t, ev.Result)
	requireErrorType(t, ev.Result, "KeyboardInterrupt")
	require.False(t, ev.Result.SessionEnded)
	require.Empty(t, ev.Result.Stdout)
	ev, err = co.Feed(ctx, Step{Code: "print(z)"})
	require.NoError(t, err)
	require.Equal(t, "3\n", ev.Result.Stdout)
}
