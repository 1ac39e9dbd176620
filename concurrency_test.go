package pynox

// Regression tests for issue 17: the Go API under concurrency. Each test
// reproduces one defect deterministically; waits that only guard against
// a hang are generous and fail the test, they never measure.

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// hangGuard is how long a test waits for something that must happen
// promptly before it declares a hang.
const hangGuard = 20 * time.Second

// within runs f on its own goroutine and fails the test when it does not
// return within hangGuard.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(hangGuard):
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("%s did not return within %s; goroutines:\n%s", what, hangGuard, buf)
	}
}

// syncBuffer is a buffer the pool's writers and the test share.
type syncBuffer = testenv.SyncBuffer

// signalHost answers the host function "started" by closing started (once)
// and "block" by waiting for release or the call's ctx.
type signalHost struct {
	once    sync.Once
	started chan struct{}
	release chan struct{}
}

func newSignalHost() *signalHost {
	return &signalHost{started: make(chan struct{}), release: make(chan struct{})}
}

func (h *signalHost) host(ctx context.Context, c *Call) (any, error) {
	switch c.Function {
	case "started":
		h.once.Do(func() { close(h.started) })
		return nil, nil
	case "block":
		h.once.Do(func() { close(h.started) })
		select {
		case <-h.release:
		case <-ctx.Done():
		}
		return nil, nil
	}
	return nil, errors.New("unexpected function " + c.Function)
}

func (h *signalHost) wait(t *testing.T) {
	t.Helper()
	select {
	case <-h.started:
	case <-time.After(2 * time.Minute):
		t.Fatal("the step never started")
	}
}

var signalFunctions = []string{"started", "block"}

// Issue 17.1: a panicking HostFunc fails its call, not the program.
func TestHostFuncPanicRecovered(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	p := newTestPool(t, Config{Workers: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	boom := func(context.Context, *Call) (any, error) { panic("handler bug") }
	code := "from pynox_host import f, HostError\ntry:\n    f()\nexcept HostError as e:\n    print('HostError:', e)\nprint('carried on')"
	want := "HostError: " + hostPanicMessage + "\ncarried on\n"

	res := run(t, p, Job{Code: code, Functions: []string{"f"}, Host: boom})
	requireOK(t, res)
	require.Equal(t, want, res.Stdout)
	require.Contains(t, logs.String(), "handler bug")
	require.Contains(t, logs.String(), "concurrency_test.go", "the log carries the panic's stack")

	ctx := context.Background()
	co := checkout(t, p, Job{Functions: []string{"f"}, Host: boom})
	ev, err := co.Feed(ctx, Step{Code: code})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, want, ev.Result.Stdout)

	co2 := checkout(t, p, Job{Functions: []string{"f"}})
	ev, err = co2.Feed(ctx, Step{Code: code, Host: boom})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, want, ev.Result.Stdout)
	// The session lives on.
	ev, err = co2.Feed(ctx, Step{Code: "print('next')"})
	require.NoError(t, err)
	require.Equal(t, "next\n", ev.Result.Stdout)
}

// Issue 17.2: Finish kills a running step instead of waiting for it.
func TestFinishKillsRunningStep(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	h := newSignalHost()
	co := checkout(t, p, Job{Functions: signalFunctions, Host: h.host})
	type outcome struct {
		ev  TurnEvent
		err error
	}
	fed := make(chan outcome, 1)
	go func() {
		ev, err := co.Feed(context.Background(), Step{Code: "from pynox_host import started\nimport time\nstarted()\ntime.sleep(60)\nprint('done')"})
		fed <- outcome{ev, err}
	}()
	h.wait(t)
	within(t, "Finish of a checkout with a running step", func() {
		assert.NoError(t, co.Finish(context.Background()))
	})
	var o outcome
	within(t, "the killed step's Feed", func() { o = <-fed })
	require.ErrorIs(t, o.err, ErrFinished, "the step was killed, not run to completion: %+v", o.ev.Result)
	require.ErrorIs(t, co.Finish(context.Background()), ErrFinished)
}

// Issue 17.3: a Feed or Resume waiting for another turn gives up when its
// ctx ends, while that turn runs on.
func TestTurnWaitHonoursCtx(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	h := newSignalHost()
	co := checkout(t, p, Job{Functions: signalFunctions, Host: h.host})
	first := make(chan error, 1)
	go func() {
		_, err := co.Feed(context.Background(), Step{Code: "from pynox_host import block\nblock()\nprint('first')"})
		first <- err
	}()
	h.wait(t)
	ctx, cancel := context.WithCancel(context.Background())
	waiters := make(chan error, 2)
	go func() {
		_, err := co.Feed(ctx, Step{Code: "print('second')"})
		waiters <- err
	}()
	go func() {
		_, err := co.Resume(ctx, 1, Return(1))
		waiters <- err
	}()
	cancel()
	for i := 0; i < 2; i++ {
		select {
		case err := <-waiters:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(hangGuard):
			close(h.release)
			t.Fatal("a call waiting for another turn ignored its ctx")
		}
	}
	select {
	case err := <-first:
		t.Fatalf("the first step ended early: %v", err)
	default:
	}
	close(h.release)
	within(t, "the first step", func() { assert.NoError(t, <-first) })
}

// Issue 17.4: a checkout ended by Close answers ErrClosed, to the call in
// flight and to every later one; one finished by its caller or for being
// idle answers ErrFinished.
func TestCheckoutErrorsAfterClose(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Workers: 1, Dir: t.TempDir(), Python: testPython()})
	requireSandbox(t)
	require.NoError(t, err)
	defer p.Close()
	bg := context.Background()
	h := newSignalHost()
	running, err := p.Checkout(bg, Job{Functions: signalFunctions, Host: h.host})
	require.NoError(t, err)
	waiting, err := p.Checkout(bg, Job{Functions: []string{"ask"}})
	require.NoError(t, err)
	idle, err := p.Checkout(bg, Job{})
	require.NoError(t, err)
	ev, err := waiting.Feed(bg, Step{Code: "from pynox_host import ask\nask()"})
	require.NoError(t, err)
	require.NotNil(t, ev.Call)
	fed := make(chan error, 1)
	go func() {
		_, err := running.Feed(bg, Step{Code: "from pynox_host import started\nimport time\nstarted()\ntime.sleep(60)"})
		fed <- err
	}()
	h.wait(t)
	within(t, "Close", func() { assert.NoError(t, p.Close()) })
	within(t, "the running Feed", func() { assert.ErrorIs(t, <-fed, ErrClosed) })
	for _, co := range []*Checkout{running, waiting, idle} {
		_, err = co.Feed(bg, Step{Code: "1"})
		require.ErrorIs(t, err, ErrClosed)
		_, err = co.Resume(bg, ev.Call.ID, Return(1))
		require.ErrorIs(t, err, ErrClosed)
		require.ErrorIs(t, co.Finish(bg), ErrClosed)
	}

	p2 := newTestPool(t, Config{Workers: 1, SessionIdle: 200 * time.Millisecond})
	co, err := p2.Checkout(bg, Job{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return co.isFinished() != nil }, hangGuard, 20*time.Millisecond)
	_, err = co.Feed(bg, Step{Code: "1"})
	require.ErrorIs(t, err, ErrFinished)
	require.ErrorIs(t, co.Finish(bg), ErrFinished)
}

// Issue 17.5: of concurrent Finish calls exactly one returns nil.
func TestConcurrentFinishOnce(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, MaxSessions: 64})
	bg := context.Background()
	const rounds, callers = 30, 8
	for r := 0; r < rounds; r++ {
		co := checkout(t, p, Job{})
		var wg sync.WaitGroup
		gate := make(chan struct{})
		errs := make([]error, callers)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				errs[i] = co.Finish(bg)
			}()
		}
		close(gate)
		wg.Wait()
		nils := 0
		for _, err := range errs {
			if err == nil {
				nils++
			} else {
				require.ErrorIs(t, err, ErrFinished)
			}
		}
		require.Equal(t, 1, nils, "round %d: %d of %d Finish calls returned nil", r, nils, callers)
	}
}

// Issue 17.6: the zero Pool fails fast and never hangs or panics.
func TestZeroValuePool(t *testing.T) {
	t.Parallel()
	var p Pool
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	for i := 0; i < 2; i++ {
		within(t, "Run on the zero Pool", func() {
			res, err := p.Run(ctx, Job{Code: "1"})
			assert.Nil(t, res)
			assert.ErrorIs(t, err, ErrClosed)
			assert.Contains(t, err.Error(), "New")
		})
		within(t, "Checkout on the zero Pool", func() {
			_, err := p.Checkout(ctx, Job{AllowRead: []string{"data"}, Functions: []string{"f"}})
			assert.ErrorIs(t, err, ErrClosed)
		})
		within(t, "Close on the zero Pool", func() { assert.ErrorIs(t, p.Close(), ErrClosed) })
		within(t, "Stats on the zero Pool", func() { assert.Zero(t, p.Stats().Jobs) })
	}
}

// Issue 17.8: Close fails running jobs with ErrClosed at once.
func TestCloseFailsRunningJobs(t *testing.T) {
	t.Parallel()
	requireSandbox(t)
	p, err := New(Config{Workers: 2, Dir: t.TempDir(), Python: testPython()})
	require.NoError(t, err)
	defer p.Close()
	h := newSignalHost()
	type outcome struct {
		res *Result
		err error
	}
	ran := make(chan outcome, 2)
	go func() {
		res, err := p.Run(context.Background(), Job{Functions: signalFunctions, Host: h.host, Timeout: 25 * time.Second,
			Code: "from pynox_host import started\nimport time\nstarted()\ntime.sleep(60)"})
		ran <- outcome{res, err}
	}()
	h.wait(t)
	within(t, "Close with a job running", func() { assert.NoError(t, p.Close()) })
	var o outcome
	within(t, "the running job's Run", func() { o = <-ran })
	require.Nil(t, o.res)
	require.ErrorIs(t, o.err, ErrClosed)
}

// Issue 17.9: Resume answers the call it names; a late or duplicate
// answer is a protocol error and never reaches the next call.
func TestResumeTiedToCall(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	bg := context.Background()
	co := checkout(t, p, Job{Functions: []string{"ask"}})
	ev, err := co.Feed(bg, Step{Code: "from pynox_host import ask\nprint(ask('first'), ask('second'))"})
	require.NoError(t, err)
	first := ev.Call
	require.NotNil(t, first)
	_, err = co.Resume(bg, first.ID+1000, Return("wrong"))
	require.ErrorIs(t, err, ErrProtocol)
	require.Contains(t, err.Error(), "call")
	ev, err = co.Resume(bg, first.ID, Return("one"))
	require.NoError(t, err)
	second := ev.Call
	require.NotNil(t, second)
	require.JSONEq(t, `["second"]`, string(second.Args))
	// A duplicate answer to the first call does not answer the second.
	_, err = co.Resume(bg, first.ID, Return("late"))
	require.ErrorIs(t, err, ErrProtocol)
	ev, err = co.Resume(bg, second.ID, Return("two"))
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "one two\n", ev.Result.Stdout)
	_, err = co.Resume(bg, second.ID, Return("again"))
	require.ErrorIs(t, err, ErrProtocol)
}

// Issue 17.11: a caller that changes an error it got cannot change the
// sentinels.
func TestSentinelsCannotBeChanged(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	require.NoError(t, p.Close())
	_, err := p.Run(context.Background(), Job{Code: "1"})
	var pe *Error
	require.ErrorAs(t, err, &pe)
	pe.Message = "changed by a caller"
	pe.Kind = KindTimeout
	_, err = p.Run(context.Background(), Job{Code: "1"})
	require.ErrorIs(t, err, ErrClosed)
	require.NotErrorIs(t, err, ErrTimeout)
	require.Empty(t, ErrClosed.Message)
	require.Equal(t, KindClosed, ErrClosed.Kind)
}

// Shutdown stops accepting work, lets the jobs and steps under way finish,
// then closes the pool; a ctx that ends first kills what still runs.
func TestShutdown(t *testing.T) {
	t.Parallel()
	requireSandbox(t)
	bg := context.Background()
	p, err := New(Config{Workers: 2, Dir: t.TempDir(), Python: testPython()})
	require.NoError(t, err)
	defer p.Close()
	jobHost, stepHost := newSignalHost(), newSignalHost()
	ran := make(chan *Result, 1)
	go func() {
		res, err := p.Run(bg, Job{Functions: signalFunctions, Host: jobHost.host, Code: "from pynox_host import block\nblock()\nprint('job')"})
		if err != nil {
			t.Errorf("the job under way: %v", err)
			res = &Result{}
		}
		ran <- res
	}()
	co, err := p.Checkout(bg, Job{Functions: signalFunctions, Host: stepHost.host})
	require.NoError(t, err)
	idle, err := p.Checkout(bg, Job{})
	require.NoError(t, err)
	fed := make(chan TurnEvent, 1)
	go func() {
		ev, err := co.Feed(bg, Step{Code: "from pynox_host import block\nblock()\nprint('step')"})
		if err != nil {
			t.Errorf("the step under way: %v", err)
			ev.Result = &Result{}
		}
		fed <- ev
	}()
	jobHost.wait(t)
	stepHost.wait(t)
	shut := make(chan error, 1)
	go func() { shut <- p.Shutdown(bg) }()
	require.Eventually(t, func() bool {
		_, err := p.Run(bg, Job{Code: "1"})
		return errors.Is(err, ErrClosed)
	}, hangGuard, 10*time.Millisecond)
	_, err = p.Checkout(bg, Job{})
	require.ErrorIs(t, err, ErrClosed)
	_, err = idle.Feed(bg, Step{Code: "1"})
	require.ErrorIs(t, err, ErrClosed)
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned while work ran: %v", err)
	default:
	}
	close(jobHost.release)
	close(stepHost.release)
	within(t, "Shutdown", func() { assert.NoError(t, <-shut) })
	require.Equal(t, "job\n", (<-ran).Stdout)
	require.Equal(t, "step\n", (<-fed).Result.Stdout)
	_, err = idle.Feed(bg, Step{Code: "1"})
	require.ErrorIs(t, err, ErrClosed)

	// A ctx that ends first: what still runs is killed.
	p2, err := New(Config{Workers: 1, Dir: t.TempDir(), Python: testPython()})
	require.NoError(t, err)
	defer p2.Close()
	h := newSignalHost()
	errs := make(chan error, 1)
	go func() {
		_, err := p2.Run(bg, Job{Functions: signalFunctions, Host: h.host, Code: "from pynox_host import block\nblock()"})
		errs <- err
	}()
	h.wait(t)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	within(t, "Shutdown with an ended ctx", func() { assert.ErrorIs(t, p2.Shutdown(ctx), context.Canceled) })
	within(t, "the killed job's Run", func() { assert.ErrorIs(t, <-errs, ErrClosed) })
}
