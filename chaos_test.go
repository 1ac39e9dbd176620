package pynox

// The chaos test of issue 17: many goroutines drive one pool through the
// Go API at once — jobs of every failure kind, host functions that
// return, fail, panic, block or return what JSON cannot encode, sessions
// whose calls race one another, cancellations mid-flight, templates
// SIGKILLed periodically, and Close while work is in flight — and every
// call's answer is checked as it comes:
//
//   - every result belongs to its job: its output holds its own unique
//     token and no other, and no token is delivered twice;
//   - host call ids are unique pool-wide and increase within a job;
//   - every error is a ctx error (of a ctx that ended) or a *pynox.Error
//     of an expected kind that errors.Is matches to its sentinel;
//   - Stats adds up, mid-run and at the end, to the results the callers
//     received, and every panicking host function was logged once;
//   - after Close, goroutines and descendant processes are back to the
//     baseline, and no zombie is left to the test process, a subreaper.
//
// The cancellation latency of Run, Checkout, Feed and Resume is reported
// with t.Log. How long it runs: PYNOX_CHAOS=short (about 45 s, CI's
// line), long or -chaos.long (10 minutes), or a duration ("3m"); unset,
// a smoke run of a few seconds that runs only with PYNOX_LONG=1 and
// without -short.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var chaosLong = flag.Bool("chaos.long", false, "run TestChaos for 10 minutes (as PYNOX_CHAOS=long)")

// chaosDuration returns how long TestChaos drives the pool.
func chaosDuration(t *testing.T) time.Duration {
	mode := os.Getenv("PYNOX_CHAOS")
	if *chaosLong {
		mode = "long"
	}
	switch mode {
	case "":
		if testing.Short() {
			t.Skip("-short: the chaos smoke run is skipped (PYNOX_CHAOS=short runs it for longer)")
		}
		requireLong(t, "the chaos smoke run (PYNOX_CHAOS=short runs it for longer)")
		return 6 * time.Second
	case "short":
		return 45 * time.Second
	case "long":
		return 10 * time.Minute
	}
	d, err := time.ParseDuration(mode)
	if err != nil || d <= 0 {
		t.Fatalf("PYNOX_CHAOS=%q: want short, long or a duration such as 3m", mode)
	}
	return d
}

// chaosPanicLogs counts the pool's "a host function panicked" records.
type chaosPanicLogs struct{ n atomic.Int64 }

func (h *chaosPanicLogs) Enabled(context.Context, slog.Level) bool { return true }
func (h *chaosPanicLogs) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "a host function panicked" {
		h.n.Add(1)
	}
	return nil
}
func (h *chaosPanicLogs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *chaosPanicLogs) WithGroup(string) slog.Handler      { return h }

type chaos struct {
	t       *testing.T
	p       *Pool
	seq     atomic.Int64
	tokens  sync.Map // token → the job or step that printed it
	callIDs sync.Map // call id → true
	lastIDs sync.Map // job id → its last call id
	closing atomic.Bool
	panics  atomic.Int64 // host functions that panicked
	kills   atomic.Int64

	mu    sync.Mutex
	tally Stats // what the callers received, counted as Stats counts
	ops   map[string]int
	lat   map[string][]time.Duration // cancellation latencies by call
}

var chaosTokenRE = regexp.MustCompile(`tok[0-9]{7}`)

func (c *chaos) token() string { return fmt.Sprintf("tok%07d", c.seq.Add(1)) }

func (c *chaos) count(op string) {
	c.mu.Lock()
	c.ops[op]++
	c.mu.Unlock()
}

// cancelAfter returns a ctx canceled after d, and when it was.
func cancelAfter(d time.Duration) (context.Context, func() time.Time, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var at atomic.Int64
	timer := time.AfterFunc(d, func() {
		at.Store(time.Now().UnixNano())
		cancel()
	})
	return ctx, func() time.Time { return time.Unix(0, at.Load()) }, func() { timer.Stop(); cancel() }
}

// checkErr checks an error of call op: a ctx error of a ctx that ended
// (its latency recorded when canceledAt is known), or a *Error of one of
// the allowed kinds (KindClosed too once Close began) matching its
// sentinel.
func (c *chaos) checkErr(op string, ctx context.Context, canceledAt func() time.Time, err error, allowed ...Kind) {
	c.t.Helper()
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if ctx.Err() == nil {
			c.t.Errorf("%s: %v, but its ctx did not end", op, err)
			return
		}
		if canceledAt != nil && !canceledAt().IsZero() {
			c.mu.Lock()
			c.lat[op] = append(c.lat[op], time.Since(canceledAt()))
			c.mu.Unlock()
		}
		return
	}
	var pe *Error
	if !errors.As(err, &pe) {
		c.t.Errorf("%s: %T %v is neither a ctx error nor a *pynox.Error", op, err, err)
		return
	}
	sentinel := map[Kind]*Error{KindRuntime: ErrRuntime, KindRequest: ErrRequest, KindTimeout: ErrTimeout, KindSignal: ErrSignal,
		KindSandboxSetup: ErrSandboxSetup, KindCrashed: ErrCrashed, KindSpawn: ErrSpawn, KindClosed: ErrClosed,
		KindExhausted: ErrExhausted, KindFinished: ErrFinished, KindProtocol: ErrProtocol}[pe.Kind]
	if sentinel == nil || !errors.Is(err, sentinel) {
		c.t.Errorf("%s: %v does not match the sentinel of its kind %v", op, err, pe.Kind)
	}
	if slices.Contains(allowed, pe.Kind) || (pe.Kind == KindClosed && c.closing.Load()) {
		return
	}
	c.t.Errorf("%s: unexpected error %v", op, err)
}

// result checks a result that the caller of op received for the job or
// step id with token tok (its output may also show the tokens in also,
// printed by earlier steps), and counts it. It reports whether the result
// is the job's own outcome rather than a kill by the chaos (a dead
// template: PoolWorkerError, or SIGKILL).
func (c *chaos) result(op string, id any, tok string, res *Result, also ...string) bool {
	c.t.Helper()
	if res == nil {
		c.t.Errorf("%s %v: nil result without an error", op, id)
		return false
	}
	if res.ID != id {
		c.t.Errorf("%s: result for %v delivered to %v", op, res.ID, id)
	}
	for _, s := range []string{res.Stdout, res.Stderr} {
		for _, found := range chaosTokenRE.FindAllString(s, -1) {
			if found != tok && !slices.Contains(also, found) {
				c.t.Errorf("%s %v: output holds another job's token %s: %q", op, id, found, s)
			} else if found != tok {
				continue
			} else if prev, dup := c.tokens.LoadOrStore(found, id); dup && s == res.Stdout {
				c.t.Errorf("%s %v: token %s delivered twice (first to %v)", op, id, found, prev)
			}
		}
	}
	c.mu.Lock()
	c.tally.Jobs++
	switch err := res.Err(); {
	case err == nil:
		c.tally.OK++
	case errors.Is(err, ErrRuntime):
		c.tally.Failed++
	case errors.Is(err, ErrTimeout):
		c.tally.Timeouts++
	case errors.Is(err, ErrSignal):
		c.tally.Signals++
	case errors.Is(err, ErrRequest):
		c.tally.RequestErrors++
	default:
		c.tally.WorkerErrors++
	}
	c.mu.Unlock()
	killed := res.Error != nil && (res.Error.Type == "PoolWorkerError" ||
		(res.Error.Type == "SignalError" && strings.Contains(res.Error.Message, "SIGKILL")))
	return !killed
}

// host is the chaos's HostFunc.
func (c *chaos) host(ctx context.Context, call *Call) (any, error) {
	c.seeCall(call)
	switch call.Function {
	case "ret", "ask":
		var args []any
		if err := json.Unmarshal(call.Args, &args); err != nil || len(args) != 1 {
			return nil, fmt.Errorf("bad args %s", call.Args)
		}
		return args[0], nil
	case "fail":
		return nil, errors.New("the host said no")
	case "panic":
		c.panics.Add(1)
		panic("a chaos host function panicked")
	case "bad":
		return func() {}, nil
	case "block":
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("unexpected function %s", call.Function)
}

// seeCall checks a call's id: unique, and above its job's last one.
func (c *chaos) seeCall(call *Call) {
	c.t.Helper()
	if _, dup := c.callIDs.LoadOrStore(call.ID, true); dup {
		c.t.Errorf("call id %d seen twice", call.ID)
	}
	if prev, ok := c.lastIDs.Swap(fmt.Sprint(call.JobID), call.ID); ok && prev.(int64) >= call.ID {
		c.t.Errorf("job %v: call %d after call %d", call.JobID, call.ID, prev)
	}
}

var chaosFunctions = []string{"ret", "fail", "panic", "bad", "block", "ask"}

// chaosJob is one kind of one-shot job and what its result must be.
type chaosJob struct {
	name  string
	job   func(tok string) Job
	check func(res *Result, tok string) bool
}

func chaosJobs(c *chaos) []chaosJob {
	code := func(tok, s string) Job { return Job{Code: strings.ReplaceAll(s, "TOK", tok)} }
	errIs := func(typ string) func(*Result, string) bool {
		return func(r *Result, _ string) bool { return r.Error != nil && r.Error.Type == typ }
	}
	printed := func(r *Result, tok string) bool { return r.Error == nil && r.Exit == 0 && r.Stdout == tok+"\n" }
	return []chaosJob{
		{"ok", func(tok string) Job { return code(tok, "print('TOK')") }, printed},
		{"exception", func(tok string) Job { return code(tok, "raise ValueError('TOK')") },
			func(r *Result, tok string) bool {
				return errIs("ValueError")(r, tok) && r.Error.Message == tok && r.Exit == 1
			}},
		{"timeout", func(tok string) Job {
			j := code(tok, "print('TOK', flush=True)\nwhile True:\n    pass")
			j.Timeout = 200 * time.Millisecond
			return j
		}, errIs("TimeoutError")},
		{"segfault", func(tok string) Job { return code(tok, "import ctypes\nctypes.string_at(0)") },
			func(r *Result, tok string) bool {
				return errIs("SignalError")(r, tok) && strings.Contains(r.Error.Message, "SIGSEGV")
			}},
		{"exit", func(tok string) Job { return code(tok, "import sys\nprint('TOK')\nsys.exit(3)") },
			func(r *Result, tok string) bool { return r.Error == nil && r.Exit == 3 && r.Stdout == tok+"\n" }},
		{"request", func(tok string) Job {
			j := code(tok, "print('TOK')")
			j.Timeout = time.Hour
			return j
		}, errIs("RequestError")},
		{"memory", func(tok string) Job {
			j := code(tok, "x = bytearray(256 << 20)")
			j.Memory = 32 << 20
			return j
		}, errIs("MemoryError")},
		{"host", func(tok string) Job {
			j := code(tok, "from pynox_host import ret, fail, panic, bad, HostError\nprint(ret('TOK'))\n"+
				"for f in (fail, panic, bad):\n    try:\n        f()\n    except HostError as e:\n        print(f.__name__, str(e).split(':')[0])")
			j.Functions, j.Host = chaosFunctions, c.host
			return j
		}, func(r *Result, tok string) bool {
			return r.Error == nil && r.Stdout == tok+"\nfail the host said no\npanic "+hostPanicMessage+
				"\nbad the host's result could not be passed on\n"
		}},
		{"host block", func(tok string) Job {
			j := code(tok, "from pynox_host import block\nblock()")
			j.Functions, j.Host, j.Timeout = chaosFunctions, c.host, 200*time.Millisecond
			return j
		}, errIs("TimeoutError")},
	}
}

// runJob runs one job, canceled mid-flight one time in four.
func (c *chaos) runJob(rng *rand.Rand, kinds []chaosJob) {
	k := kinds[rng.Intn(len(kinds))]
	tok := c.token()
	job := k.job(tok)
	job.ID = tok
	ctx, canceledAt, stop := cancelAfter(time.Hour)
	if rng.Intn(4) == 0 {
		stop()
		ctx, canceledAt, stop = cancelAfter(time.Duration(rng.Intn(300)) * time.Millisecond)
	}
	defer stop()
	c.count("run " + k.name)
	res, err := c.p.Run(ctx, job)
	if err != nil {
		c.checkErr("Run", ctx, canceledAt, err)
		return
	}
	if c.result("Run "+k.name, tok, tok, res) && !k.check(res, tok) {
		c.t.Errorf("Run %s %s: unexpected result %+v exit %d, stdout %q, stderr %q", k.name, tok, res.Error, res.Exit, res.Stdout, res.Stderr)
	}
}

// session opens a checkout, runs a few steps of random kinds through it,
// and ends it one way or another.
func (c *chaos) session(rng *rand.Rand) {
	job := Job{Functions: chaosFunctions, Timeout: 3 * time.Second}
	surfaced := rng.Intn(2) == 0 // calls come back as TurnEvents
	if !surfaced {
		job.Host = c.host
	}
	ctx, canceledAt, stop := cancelAfter(time.Hour)
	if rng.Intn(6) == 0 {
		stop()
		ctx, canceledAt, stop = cancelAfter(time.Duration(rng.Intn(40)) * time.Millisecond)
	}
	c.count("checkout")
	co, err := c.p.Checkout(ctx, job)
	if err != nil {
		c.checkErr("Checkout", ctx, canceledAt, err, KindExhausted)
		stop()
		if errors.Is(err, ErrExhausted) {
			time.Sleep(50 * time.Millisecond) // sessions left to the idle timer hold the slots
		}
		return
	}
	stop()
	bg := context.Background()
	// ended reports whether a Feed or Resume error means the checkout
	// ended (Close, or idle under a slow machine); other errors are checked.
	steps := 2 + rng.Intn(6)
	lastTok := ""
	for i := 0; i < steps; i++ {
		tok := c.token()
		switch kind := rng.Intn(8); kind {
		case 0, 1: // state kept between steps
			code := fmt.Sprintf("v = '%s'\nprint(v)", tok)
			want := tok + "\n"
			if lastTok != "" && kind == 1 {
				code = "print(v)"
				want = lastTok + "\n"
			}
			c.count("step")
			ev, err := co.Feed(bg, Step{ID: tok, Code: code})
			if err != nil {
				c.checkErr("Feed", bg, nil, err, KindFinished)
				return
			}
			res := ev.Result
			if c.result("step", tok, tok, res, lastTok) {
				switch {
				case res.Step == 1 && code == "print(v)": // a new process
					if res.Error == nil || res.Error.Type != "NameError" {
						c.t.Errorf("step %s in a new process: %+v %q", tok, res.Error, res.Stdout)
					}
				case res.Error != nil || res.Stdout != want:
					c.t.Errorf("step %s: %+v %q, want %q", tok, res.Error, res.Stdout, want)
				}
			}
			if res.Error == nil && code != "print(v)" {
				lastTok = tok
			} else if res.SessionEnded {
				lastTok = ""
			}
		case 2: // a host call, surfaced or answered by the Host
			code := fmt.Sprintf("from pynox_host import ask\nprint(ask('%s'))", tok)
			c.count("call step")
			ev, err := co.Feed(bg, Step{ID: tok, Code: code})
			for err == nil && ev.Call != nil {
				c.seeCall(ev.Call)
				if !surfaced {
					c.t.Errorf("a call surfaced although the session has a Host: %+v", ev.Call)
				}
				// A wrong id is refused and leaves the call waiting.
				if _, err := co.Resume(bg, ev.Call.ID+1, Return("wrong")); !errors.Is(err, ErrProtocol) {
					c.checkErr("Resume (wrong id)", bg, nil, err, KindFinished)
				}
				var args []any
				_ = json.Unmarshal(ev.Call.Args, &args)
				ev, err = co.Resume(bg, ev.Call.ID, Return(args[0]))
			}
			if err != nil {
				c.checkErr("Feed/Resume", bg, nil, err, KindFinished)
				return
			}
			if c.result("call step", tok, tok, ev.Result) && (ev.Result.Error != nil || ev.Result.Stdout != tok+"\n") {
				c.t.Errorf("call step %s: %+v %q", tok, ev.Result.Error, ev.Result.Stdout)
			}
			lastTok = ""
		case 3: // canceled mid-step, or mid-Resume
			code := fmt.Sprintf("import time\nprint('%s', flush=True)\ntime.sleep(2)", tok)
			op := "Feed"
			if surfaced {
				code = fmt.Sprintf("from pynox_host import ask\nimport time\nprint(ask('%s'))\ntime.sleep(2)", tok)
			}
			fctx, fAt, fstop := cancelAfter(time.Duration(50+rng.Intn(200)) * time.Millisecond)
			c.count("canceled step")
			ev, err := co.Feed(fctx, Step{ID: tok, Code: code})
			if err == nil && ev.Call != nil {
				c.seeCall(ev.Call)
				op = "Resume"
				ev, err = co.Resume(fctx, ev.Call.ID, Return(tok))
			}
			fstop()
			if err != nil {
				c.checkErr(op, fctx, fAt, err, KindFinished)
			} else {
				c.result("canceled step", tok, tok, ev.Result)
			}
			lastTok = ""
		case 4: // two Feeds race for the checkout
			var wg sync.WaitGroup
			for j := 0; j < 2; j++ {
				tok := c.token()
				wg.Add(1)
				go func() {
					defer wg.Done()
					c.count("racing step")
					ev, err := co.Feed(bg, Step{ID: tok, Code: fmt.Sprintf("print('%s')", tok)})
					if err != nil {
						c.checkErr("Feed (racing)", bg, nil, err, KindFinished)
						return
					}
					if c.result("racing step", tok, tok, ev.Result) && ev.Result.Stdout != tok+"\n" {
						c.t.Errorf("racing step %s: %+v %q", tok, ev.Result.Error, ev.Result.Stdout)
					}
				}()
			}
			wg.Wait()
			lastTok = ""
		case 5: // a step that ends the process
			code := []string{"import sys\nsys.exit(1)", "while True:\n    pass", "import ctypes\nctypes.string_at(0)"}[rng.Intn(3)]
			c.count("ending step")
			ev, err := co.Feed(bg, Step{ID: tok, Code: code, Timeout: 200 * time.Millisecond})
			if err != nil {
				c.checkErr("Feed", bg, nil, err, KindFinished)
				return
			}
			if c.result("ending step", tok, tok, ev.Result) && !ev.Result.SessionEnded {
				c.t.Errorf("ending step %s: the process lives on: %+v", tok, ev.Result.Error)
			}
			lastTok = ""
		case 6: // host functions that fail, panic or return garbage
			c.count("host step")
			ev, err := co.Feed(bg, Step{ID: tok, Host: c.host, Code: fmt.Sprintf("from pynox_host import ret, fail, panic, bad, HostError\nprint(ret('%s'))\n"+
				"for f in (fail, panic, bad):\n    try:\n        f()\n    except HostError as e:\n        print(f.__name__)", tok)})
			if err != nil {
				c.checkErr("Feed", bg, nil, err, KindFinished)
				return
			}
			if c.result("host step", tok, tok, ev.Result) && ev.Result.Stdout != tok+"\nfail\npanic\nbad\n" {
				c.t.Errorf("host step %s: %+v %q", tok, ev.Result.Error, ev.Result.Stdout)
			}
		case 7: // Finish while a step runs: the step is killed
			fed := make(chan error, 1)
			c.count("finish mid-step")
			go func() {
				ev, err := co.Feed(bg, Step{ID: tok, Code: fmt.Sprintf("import time\nprint('%s')\ntime.sleep(2)", tok)})
				if err == nil {
					c.result("finished step", tok, tok, ev.Result)
				}
				fed <- err
			}()
			time.Sleep(time.Duration(rng.Intn(100)) * time.Millisecond)
			if err := co.Finish(bg); err != nil {
				c.checkErr("Finish", bg, nil, err, KindFinished)
			}
			if err := <-fed; err != nil {
				c.checkErr("Feed (finished)", bg, nil, err, KindFinished)
			}
			return
		}
	}
	switch rng.Intn(3) {
	case 0: // left to the idle timer
		return
	default: // racing Finish calls: at most one succeeds
		var wg sync.WaitGroup
		var nils atomic.Int64
		for j := 0; j < 3; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.count("finish")
				if err := co.Finish(bg); err == nil {
					nils.Add(1)
				} else {
					c.checkErr("Finish", bg, nil, err, KindFinished)
				}
			}()
		}
		wg.Wait()
		if nils.Load() > 1 {
			c.t.Errorf("%d concurrent Finish calls returned nil", nils.Load())
		}
	}
}

// killTemplate SIGKILLs one live template, the pool's or a session's.
func (c *chaos) killTemplate(rng *rand.Rand) {
	pids := c.p.templatePIDs()
	c.p.coMu.Lock()
	for co := range c.p.checkouts {
		co.mu.Lock()
		if co.tpl != nil {
			pids = append(pids, co.tpl.Pid())
		}
		co.mu.Unlock()
	}
	c.p.coMu.Unlock()
	if len(pids) > 0 {
		syscall.Kill(pids[rng.Intn(len(pids))], syscall.SIGKILL)
		c.kills.Add(1)
	}
}

// checkStats checks that Stats' outcome counters add up.
func (c *chaos) checkStats() Stats {
	c.t.Helper()
	s := c.p.Stats()
	if sum := s.OK + s.Failed + s.Timeouts + s.Signals + s.RequestErrors + s.WorkerErrors + s.Cancelled; sum != s.Jobs {
		c.t.Errorf("stats: outcomes add up to %d, jobs %d: %+v", sum, s.Jobs, s)
	}
	var errs int64
	for _, n := range s.Errors {
		errs += n
	}
	if errs > s.Jobs {
		c.t.Errorf("stats: %d errors by type, %d jobs", errs, s.Jobs)
	}
	return s
}

func TestChaos(t *testing.T) {
	dur := chaosDuration(t)
	requireSandbox(t)
	// As a Go program that is PID 1 of a container is: every orphan below
	// the test becomes its child, and must not be left a zombie.
	becomeSubreaper(t)
	procs0 := loadDescendants(t)
	goroutines0 := runtime.NumGoroutine()
	logs := &chaosPanicLogs{}
	p, err := New(Config{Workers: 2, Dir: t.TempDir(), Python: testPython(), MaxSessions: 6,
		SessionIdle: 2 * time.Second, Logger: slog.New(logs)})
	require.NoError(t, err)
	defer p.Close()
	c := &chaos{t: t, p: p, ops: map[string]int{}, lat: map[string][]time.Duration{}}
	kinds := chaosJobs(c)
	jobWorkers, sessionWorkers := 6, 4
	if dur >= 5*time.Minute {
		jobWorkers, sessionWorkers = 12, 8
	}
	t.Logf("chaos for %s: %d job goroutines, %d session goroutines", dur, jobWorkers, sessionWorkers)
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for i := 0; i < jobWorkers+sessionWorkers; i++ {
		rng := rand.New(rand.NewSource(int64(i) + time.Now().UnixNano()))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && !t.Failed() {
				if i < jobWorkers {
					c.runJob(rng, kinds)
				} else {
					c.session(rng)
				}
			}
		}()
	}
	stopBg := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(1)
	go func() { // the killer, and Stats read mid-run
		defer bg.Done()
		rng := rand.New(rand.NewSource(time.Now().UnixNano()))
		kill := time.NewTicker(min(max(dur/8, 500*time.Millisecond), 30*time.Second))
		defer kill.Stop()
		stats := time.NewTicker(100 * time.Millisecond)
		defer stats.Stop()
		for {
			select {
			case <-stopBg:
				return
			case <-kill.C:
				c.killTemplate(rng)
			case <-stats.C:
				c.checkStats()
			}
		}
	}()

	// Close while the last calls are in flight: they fail with ErrClosed.
	time.Sleep(time.Until(deadline))
	close(stopBg)
	bg.Wait()
	c.closing.Store(true)
	closeStart := time.Now()
	require.NoError(t, p.Close())
	closeTook := time.Since(closeStart)
	within(t, "the chaos goroutines after Close", wg.Wait)

	s := c.checkStats()
	c.mu.Lock()
	tally := c.tally
	c.mu.Unlock()
	require.Equal(t, tally.Jobs, s.Jobs, "results received vs Stats.Jobs")
	require.Equal(t, [6]int64{tally.OK, tally.Failed, tally.Timeouts, tally.Signals, tally.RequestErrors, tally.WorkerErrors},
		[6]int64{s.OK, s.Failed, s.Timeouts, s.Signals, s.RequestErrors, s.WorkerErrors},
		"outcomes received (ok, failed, timeouts, signals, request errors, worker errors) vs Stats")
	require.Equal(t, c.panics.Load(), logs.n.Load(), "every host-function panic is logged once")

	require.Eventually(t, func() bool { return len(loadDescendants(t)) == len(procs0) }, 10*time.Second, 20*time.Millisecond,
		"descendants after Close: %v, baseline %v", loadDescendants(t), procs0)
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= goroutines0+2 }, 10*time.Second, 20*time.Millisecond,
		"goroutines after Close: %d, baseline %d", runtime.NumGoroutine(), goroutines0)
	requireNoZombies(t, "chaos and Close")

	c.mu.Lock()
	defer c.mu.Unlock()
	var ops []string
	total := 0
	for op, n := range c.ops {
		ops = append(ops, fmt.Sprintf("%s %d", op, n))
		total += n
	}
	slices.Sort(ops)
	t.Logf("%d calls: %s", total, strings.Join(ops, ", "))
	t.Logf("results %d (ok %d, failed %d, timeouts %d, signals %d, request errors %d, worker errors %d); %d host panics logged; %d templates killed; Close took %s",
		s.Jobs, s.OK, s.Failed, s.Timeouts, s.Signals, s.RequestErrors, s.WorkerErrors, logs.n.Load(), c.kills.Load(), closeTook.Round(time.Millisecond))
	for _, op := range []string{"Run", "Checkout", "Feed", "Resume"} {
		l := c.lat[op]
		if len(l) == 0 {
			t.Logf("cancellation latency of %s: no canceled call", op)
			continue
		}
		slices.Sort(l)
		q := func(f float64) time.Duration { return l[int(f*float64(len(l)-1))].Round(10 * time.Microsecond) }
		t.Logf("cancellation latency of %s (%d canceled calls): median %s, p90 %s, p99 %s, max %s", op, len(l), q(0.5), q(0.9), q(0.99), l[len(l)-1].Round(10*time.Microsecond))
	}
}
