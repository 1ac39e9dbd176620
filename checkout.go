package pynox

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pynox/pynox/internal/worker"
)

// Checkout is a session: one confined CPython process whose __main__
// survives between steps, for agents that define a variable in one call
// and use it in the next. It is what monty-pool calls a checkout.
//
// A Checkout's process is forked from one of the pool's warm templates
// at the first [Checkout.Feed], like a job's (see [Pool.Checkout]).
// The job given to Pool.Checkout fixes the session's permissions, limits,
// environment and host functions; each step brings only code, name, args
// and optionally its own timeout and output cap.
//
// A Python exception leaves the session alive, like a notebook cell. A
// timeout, a crash or an exit ends its process: that step's result has
// SessionEnded set, and the next Feed starts a new process (with empty
// globals) under the same permissions; so does a Feed that finds the
// process gone between steps (its template died). The first step of such
// a replacement process has Result.Restarted set.
//
// A Checkout is safe for concurrent use, but its turns are sequential:
// Feed and Resume wait for one another (as long as their ctx allows).
// Finish ends it, killing a step that is running; so do [Pool.Close] and,
// after Config.SessionIdle without a turn, the pool. Every call on an
// ended checkout, and a call in flight when it ends, returns why it
// ended: ErrFinished when its caller finished it or it was idle,
// ErrClosed when the pool was closed.
type Checkout struct {
	pool  *Pool
	name  string // the session's name in the pool protocol
	onEnd func() // called once when the checkout has ended

	// token is the turn: Feed and Resume hold it (a send on a channel of
	// one) from start to return, and the cleanup takes it for good. A
	// select waits for it, so a caller's ctx bounds the wait.
	token chan struct{}

	// Owned by the holder of token.
	job   Job   // the creating request; Code, Script and Args are unused
	pl    *plan // grants stay open for the checkout's life
	steps int   // steps run by the current process
	turn  *activeTurn

	// procs counts the processes started for the session; replacement is
	// set while the current one is not the first (its first step's
	// result says Restarted). Owned by the holder of token.
	procs       int
	replacement bool
	// prevChild is the session's last process once it has ended (its
	// exit, crash or timeout, a failed dump, an idle session kept in a
	// file): its scratch directory is emptied, once it is reaped, before
	// the next process starts (resetScratch). Owned by the holder of
	// token.
	prevChild *worker.Child

	// A restored checkout's dump (dump.go), pending until its next
	// process takes it, and the step count it carries; base is the step
	// count the current process started from. Owned by the turn's holder.
	restore      []byte
	restoreSteps int
	base         int
	idleFile     string // the dump an idle session was kept in (idle.go)
	restoredIdle bool   // the next result says Restored

	mu      sync.Mutex // guards the fields below; never held across a wait
	tpl     *worker.Template
	child   *worker.Child // the live session process, or nil
	why     *Error        // why the checkout ended, once it has
	idle    *time.Timer
	lastUse time.Time   // when the idle timer was last armed
	running *activeTurn // the turn whose step runs, for Interrupt

	life  context.Context    // canceled when the checkout starts to end
	kill  context.CancelFunc // cancels life
	ended chan struct{}      // closed once its processes are gone and its slot is free

	remote remoteCheckout // set for a remote pool's checkout (remote.go)
}

// Step is one piece of code for a [Checkout].
type Step struct {
	// ID is echoed in the step's result.
	ID any
	// Code is the step's Python source, run in the session's __main__.
	Code string
	// Name is the file name of tracebacks; DefaultName when empty.
	Name string
	// Args become sys.argv[1:] during the step.
	Args []string
	// Timeout and MaxOutput apply to this step only; zero means the
	// session's. The ceiling bounds both.
	Timeout   time.Duration
	MaxOutput int
	// Host answers this step's host calls instead of the session job's
	// Host. With neither, calls surface as TurnEvents.
	Host HostFunc
	// OnOutput, when set, receives the step's output while it runs,
	// instead of the session job's OnOutput; see [OutputFunc]. Its calls
	// all return before the step's Result (or Feed's or Resume's error)
	// is returned.
	OnOutput OutputFunc
	// OnDisplay, when set, receives the step's rich outputs while it
	// runs, instead of the session job's OnDisplay; see [DisplayFunc].
	OnDisplay DisplayFunc
	// Inputs become globals of the session's __main__ before the step's
	// code runs, and stay for later steps like any assignment; the rules
	// of Job.Inputs apply.
	Inputs map[string]any
	// Collect names files to attach to the step's result, as
	// Job.Collect does; the files the step wrote to $PYNOX_OUTPUTS are
	// attached too, and removed from there once attached.
	Collect []string
}

// TurnEvent is how a turn of a [Checkout] ended: the step called a host
// function (Call is set: answer it with [Checkout.Resume]), or it
// completed (Result is set).
//
// A step whose code awaits several calls at once (pynox_host.aio with
// asyncio.gather) has several calls waiting together: Calls lists every
// call waiting for an answer, oldest first, Call among them. Answer them
// with Resume by Call.ID, in any order; [Checkout.Wait] waits for the
// next call (or the result) without answering. A Resume that leaves
// calls unanswered returns at once, with Call the oldest of them: a
// driver that answers each event's Call in turn answers them all.
type TurnEvent struct {
	Call   *Call
	Calls  []*Call
	Result *Result
}

// activeTurn is a step that runs on its own goroutine while its caller
// answers host calls.
type activeTurn struct {
	events  chan turnMsg
	cancel  chan struct{} // kills the step
	kill    sync.Once
	pending []*Call                     // the calls waiting for Resume, oldest first
	answers map[int64]chan worker.Reply // where each one's answer goes, by Call.ID
	ended   *turnMsg                    // the step's end, taken from events while calls waited
	done    func()                      // called once when the turn ends: Shutdown waits for it

	interrupt chan struct{} // closed to interrupt the step (SIGINT)
	intOnce   sync.Once

	// ranHere: the step ran on Feed's goroutine and its result is on
	// events (see Feed); await reads it once.
	ranHere bool
	span    trace.Span // the step's span (trace.go), ended with the step
}

func (t *activeTurn) stop() { t.kill.Do(func() { close(t.cancel) }) }

// interruptStep sends the step its interrupt, once.
func (t *activeTurn) interruptStep() { t.intOnce.Do(func() { close(t.interrupt) }) }

// Interrupt interrupts the step running in the session, as Ctrl-C does
// in a terminal: the step's code gets KeyboardInterrupt (the error type
// of its result, which its Feed or Resume returns as usual), and the
// session lives on with its globals. A step that catches it and goes on,
// or that is blocked in C code, is killed worker.InterruptGrace (2 s)
// later: its result has SessionEnded set. An interrupt that reaches a
// step while it waits for a host call's answer takes effect when the
// answer is in. Interrupt reports whether a step was running (a step that
// was interrupted already counts); with none it does nothing and returns
// false. It does not wait.
func (c *Checkout) Interrupt() bool {
	if c.remote != nil {
		return c.remote.Interrupt()
	}
	c.mu.Lock()
	t := c.running
	c.mu.Unlock()
	if t == nil {
		return false
	}
	t.interruptStep()
	return true
}

// endTurn forgets the turn, which has ended; the caller holds the turn.
func (c *Checkout) endTurn() {
	if t := c.turn; t != nil {
		c.turn = nil
		t.done()
	}
}

type turnMsg struct {
	call     *Call
	answer   chan worker.Reply // the call's answer goes here
	result   *Result
	alive    bool // the session's process lives on
	canceled bool
}

// Checkout starts a session with job's permissions, limits, environment
// and host functions (job.Code, Script and Args must be empty: steps bring
// the code). It starts no process: the first Feed takes one from the
// pool's warm templates, as a job does, without taking a worker, and
// confines it with the session's grants before
// the step's code runs; the preloads are already imported.
//
// It fails with a KindRequest error for a job outside the ceiling, with
// ErrExhausted when Config.MaxSessions sessions are open (after waiting
// up to Config.CheckoutTimeout, in order of arrival, for a Finish to free
// a slot), with ErrClosed after Close, and with ctx.Err() when ctx has
// ended.
func (p *Pool) Checkout(ctx context.Context, job Job) (*Checkout, error) {
	if p.remote != nil {
		return p.remoteCheckoutOf(p.remote.Checkout(ctx, job, nil))
	}
	co, err := p.checkout(ctx, job, "", nil)
	if err != nil && p.cfg.CheckoutTimeout > 0 && errors.Is(err, ErrExhausted) {
		return p.checkoutWaiting(ctx, job)
	}
	return co, err
}

// checkout is Checkout for a named session of the pool protocol; onEnd
// runs once when the checkout ends, whatever ends it.
func (p *Pool) checkout(ctx context.Context, job Job, name string, onEnd func(*Checkout)) (*Checkout, error) {
	if err := p.usable(); err != nil {
		return nil, err
	}
	if job.Code != "" || len(job.Args) > 0 || job.Name != "" || job.Inputs != nil {
		return nil, requestErrorf("a checkout's job takes no code, name, args or inputs: each Step brings its own")
	}
	if len(job.Collect) > 0 {
		return nil, requestErrorf("collect: a checkout's job takes none; each Step names the files it collects")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	pl, rerr := p.plan(&job, true)
	if rerr != nil {
		return nil, rerr
	}
	if p.cfg.EvictIdle {
		p.evictIdle(ctx)
	}
	c := &Checkout{pool: p, job: job, pl: pl, name: name, token: make(chan struct{}, 1), ended: make(chan struct{})}
	c.life, c.kill = context.WithCancel(context.Background())
	if onEnd != nil {
		c.onEnd = func() { onEnd(c) }
	}
	// Registered under the pool's lock too, so that Close either sees this
	// checkout or this sees Close.
	p.mu.Lock()
	closed := p.closed
	p.coMu.Lock()
	switch {
	case closed:
		p.coMu.Unlock()
		p.mu.Unlock()
		pl.close()
		return nil, errClosed()
	case !p.coWait.claim(ctx) && len(p.checkouts)+p.coWait.reserved >= p.cfg.MaxSessions:
		p.coMu.Unlock()
		p.mu.Unlock()
		pl.close()
		return nil, newError(KindExhausted, "max_sessions sessions are open; finish one first")
	}
	p.checkouts[c] = struct{}{}
	p.coMu.Unlock()
	p.mu.Unlock()
	c.mu.Lock()
	c.armIdle()
	c.mu.Unlock()
	return c, nil
}

// isFinished returns why the checkout ended, or nil while it is open.
func (c *Checkout) isFinished() error { return c.endErr() }

// endErr returns a copy of why the checkout ended, or nil while it is
// open.
func (c *Checkout) endErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.why == nil {
		return nil
	}
	e := *c.why
	return &e
}

// acquire waits for the checkout's turn, as long as ctx allows; it fails
// with why the checkout ended once it has.
func (c *Checkout) acquire(ctx context.Context) error {
	if err := c.endErr(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err // not a race between a free turn and an ended ctx
	}
	select {
	case c.token <- struct{}{}:
	case <-c.life.Done():
		return c.endErr()
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := c.endErr(); err != nil {
		c.release() // to the cleanup that waits for it
		return err
	}
	return nil
}

// release ends the caller's turn.
func (c *Checkout) release() { <-c.token }

// armIdle (re)starts the idle timer; c.mu is held.
func (c *Checkout) armIdle() {
	if c.why != nil {
		return
	}
	// lastUse is set before the timer starts: set after, a goroutine
	// descheduled between the two (a loaded machine) left lastUse later
	// than the timer's start, the timer found the session not stale yet,
	// and nothing armed it again: the session was never closed.
	c.lastUse = time.Now()
	if c.idle == nil {
		c.idle = time.AfterFunc(c.pool.cfg.SessionIdle, func() {
			c.mu.Lock()
			// A turn that began as the timer fired keeps the session.
			stale := time.Since(c.lastUse) >= c.pool.cfg.SessionIdle
			c.mu.Unlock()
			if stale && !c.hibernate() {
				c.end(newError(KindFinished, "the session was idle for %s and was closed", c.pool.cfg.SessionIdle))
			}
		})
	} else {
		c.idle.Reset(c.pool.cfg.SessionIdle)
	}
}

// Pid returns the process id of the session's live process, or 0 when it
// has none (before the first Feed, after it ended). Diagnostics and tests.
func (c *Checkout) Pid() int {
	if c.remote != nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.child == nil {
		return 0
	}
	return c.child.Pid()
}

// Feed runs one step in the session and returns how its turn ended: a
// completed step's Result (Result.SessionEnded tells whether the process
// lives on), or — when the session's job has no Host — a host-function
// Call to answer with Resume. Every outcome of the step itself, a Python
// exception or a timeout included, is a Result; Feed returns an error
// only for a step the ceiling refuses (KindRequest, the session
// unchanged), a call still waiting for Resume (ErrProtocol), an ended
// checkout (ErrFinished, or ErrClosed when the pool was closed; a step
// running when the checkout ends is killed), or ctx ending (ctx.Err()).
// A ctx that ends while Feed waits for another turn to finish leaves the
// session as it was; one that ends while the step runs interrupts the step
// (see [Checkout.Interrupt]) and waits for it to end, for at most
// worker.InterruptGrace (2 s) before it is killed: Feed then returns
// ctx.Err() together with the step's Result (which, like a Run whose ctx
// ended, is neither counted in Stats nor logged), and a step that took
// the KeyboardInterrupt leaves the session's process and globals alive.
//
// A HostFunc answering the step's calls gets a ctx that carries ctx's
// values and ends when ctx does or at the step's deadline (its timeout).
func (c *Checkout) Feed(ctx context.Context, step Step) (ev TurnEvent, err error) {
	if c.remote != nil {
		return c.remote.Feed(ctx, step)
	}
	accepted := time.Now()
	if err := c.acquire(ctx); err != nil {
		return TurnEvent{}, err
	}
	defer c.release()
	ctx, span := c.startStep(ctx, step.ID)
	t := &activeTurn{events: make(chan turnMsg, 1), answers: map[int64]chan worker.Reply{}, span: span}
	// A step that did not become the checkout's turn ends here; a turn's
	// step ends when its result comes (await) or the checkout ends.
	defer func() {
		if c.turn != t {
			endSpan(span, ev.Result, err)
		}
	}()
	if c.turn != nil {
		return TurnEvent{}, newError(KindProtocol, "host call %d is waiting for Resume", c.turn.pending[0].ID)
	}
	ws, rerr := c.stepPlan(&step)
	if rerr != nil {
		return TurnEvent{}, rerr
	}
	stepDone, err := c.pool.beginStep()
	if err != nil {
		return TurnEvent{}, err
	}
	// Until the turn owns it, this Feed reports the step's end itself.
	defer func() {
		if stepDone != nil {
			stepDone()
		}
	}()
	c.mu.Lock()
	c.idle.Stop()
	c.lastUse = time.Now()
	c.mu.Unlock()
	// The turn's waits end with ctx or with the checkout.
	tctx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	defer context.AfterFunc(c.life, stopWait)()
	h := step.Host
	if h == nil {
		h = c.job.Host
	}
	host := c.pool.hostAdapter(step.ID, c.name, h)
	// No call can wait for Resume when a HostFunc answers them, or when
	// the session declares no function (the pool refuses a call to an
	// undeclared name).
	surfaces := host == nil && len(c.pl.job.Functions) > 0
	if host == nil {
		host = t.host(c.pool, step.ID, c.name)
	} else {
		// A HostFunc's ctx carries Feed's values and ends with it.
		ws.Ctx = ctx
	}
	ws.Host = c.pool.traceHost(span, step.ID, c.name, checkedHost(c.pl.sigs, host))
	onOut := step.OnOutput
	if onOut == nil {
		onOut = c.job.OnOutput
	}
	ws.Output = c.pool.outputAdapter(step.ID, c.name, onOut)
	onDisp := step.OnDisplay
	if onDisp == nil {
		onDisp = c.job.OnDisplay
	}
	ws.Display = c.pool.displayAdapter(step.ID, c.name, onDisp)
	child := c.child
	if child != nil && child.Gone() {
		// The process died between steps (its template died or was
		// replaced, taking its PID namespace with it): this step runs in
		// a replacement, and its result says so (Restarted).
		c.endProcess()
		child = nil
	}
	var restore []byte
	if child == nil {
		if err := c.resetScratch(); err != nil {
			return c.failStep(step.ID, span.SpanContext(), "the session's scratch directory could not be emptied for its next process: "+err.Error(), accepted), nil
		}
		var err error
		if c.pl.needsNS() {
			child, err = c.pool.sessionNSChild(c.pl, tctx.Done())
		} else {
			child, err = c.pool.sessionChild(c.pl.network, tctx.Done())
		}
		if err != nil {
			if err := c.endErr(); err != nil {
				return TurnEvent{}, err
			}
			if ctx.Err() != nil {
				c.mu.Lock()
				c.armIdle()
				c.mu.Unlock()
				return TurnEvent{}, ctx.Err()
			}
			var serr *Error
			if errors.As(err, &serr) && serr.Kind == KindSandboxSetup {
				// The session's mount namespace could not be built (its
				// mounter is gone, say): the step fails as a job does,
				// with the setup error, not as if a worker had failed.
				return c.failStepKind(step.ID, span.SpanContext(), KindSandboxSetup, serr.Message, accepted), nil
			}
			return c.failStep(step.ID, span.SpanContext(), "no process could be forked for the session: "+err.Error(), accepted), nil
		}
		c.mu.Lock()
		c.child = child
		c.tpl = child.Template()
		c.mu.Unlock()
		c.steps = 0
		restore = c.takeRestore()
		// A replacement starts empty, and its first result says so
		// (Restarted), unless it restores a dump.
		c.replacement = c.procs > 0 && restore == nil
		c.procs++
	}
	first := c.steps == 0
	c.steps++
	stepAttr(span, c.steps+c.base)
	c.turn = t
	t.done, stepDone = stepDone, nil
	t.cancel = make(chan struct{})
	cancel := t.cancel
	t.interrupt = make(chan struct{})
	ws.Interrupt = t.interrupt
	stepPl := *c.pl
	stepPl.job.Timeout = ws.Timeout
	c.mu.Lock()
	c.running = t
	c.mu.Unlock()
	body := func() {
		var out *worker.Outcome
		if first {
			j := c.pl.job
			j.Code, j.Name, j.Argv = ws.Code, ws.Name, ws.Argv
			j.Timeout, j.MaxOutput, j.Host = ws.Timeout, ws.MaxOutput, ws.Host
			j.Output = ws.Output
			j.Display = ws.Display
			j.Restore = restore
			j.Limits.CPUSecs = ws.CPUSecs
			j.Inputs = ws.Inputs
			j.Ctx, j.Interrupt = ws.Ctx, ws.Interrupt
			out = child.Run(&j, cancel)
		} else {
			out = child.RunStep(ws, cancel)
		}
		c.mu.Lock()
		if c.running == t {
			c.running = nil
		}
		c.mu.Unlock()
		res := c.pool.result(&Job{ID: step.ID}, &stepPl, out, accepted)
		if pats, err := c.pool.collectPatterns(c.pl, "collect", step.Collect); err == nil && out.Started {
			res.Files, res.FilesTruncated = c.pool.collectFiles(c.pl, pats, true)
		}
		t.events <- turnMsg{result: res, alive: out.Alive, canceled: out.Canceled}
		if first {
			// A template spare the session took is replaced now that
			// its first step has answered (see worker.TakeSession).
			child.RefillNow()
		}
	}
	if first || surfaces {
		go body()
		return c.await(ctx, t)
	}
	// A later step whose calls cannot surface runs on this goroutine:
	// handing its result from a goroutine of its own to this one cost a
	// wake-up of another thread per step (the runtime wakes an idle one
	// whenever a goroutine is readied). What await does on its own while
	// it waits, these callbacks do: the end of ctx interrupts the step,
	// the end of the checkout kills it. The result is then on events,
	// and await handles it as it would have.
	stopLife := context.AfterFunc(c.life, t.stop)
	stopCtx := context.AfterFunc(ctx, t.interruptStep)
	body()
	stopLife()
	stopCtx()
	t.ranHere = true
	return c.await(ctx, t)
}

// stepPlan checks a step against the session and the ceiling.
func (c *Checkout) stepPlan(s *Step) (*worker.Step, *Error) {
	if s.Code == "" {
		return nil, requestErrorf("a step needs code")
	}
	if len(s.Code) > MaxCodeSize {
		return nil, requestErrorf("code is %d bytes; the limit is %d", len(s.Code), MaxCodeSize)
	}
	if err := checkID(s.ID); err != nil {
		return nil, err
	}
	l := c.pool.cfg.Limits
	timeout := c.pl.job.Timeout
	if s.Timeout != 0 {
		v, err := limit("timeout", int64(s.Timeout), int64(l.Timeout), formatDuration)
		if err != nil {
			return nil, err
		}
		timeout = time.Duration(v)
	}
	maxOut := c.pl.job.MaxOutput
	if s.MaxOutput != 0 {
		v, err := limit("max_output", int64(s.MaxOutput), int64(l.MaxOutput), formatSize)
		if err != nil {
			return nil, err
		}
		maxOut = int(v)
	}
	name := s.Name
	if name == "" {
		name = DefaultName
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	inputs, err := encodeInputs(s.Inputs)
	if err != nil {
		return nil, err
	}
	if _, err := c.pool.collectPatterns(c.pl, "collect", s.Collect); err != nil {
		return nil, err
	}
	return &worker.Step{
		Inputs:    inputs,
		Code:      s.Code,
		Name:      name,
		Argv:      nonNilStrings(s.Args),
		Timeout:   timeout,
		MaxOutput: maxOut,
		CPUSecs:   cpuBackstop(timeout),
		MaxCalls:  MaxCalls,
	}, nil
}

// host surfaces a turn's calls to the caller of Feed and Resume.
func (t *activeTurn) host(p *Pool, jobID any, session string) worker.HostFunc {
	return func(ctx context.Context, wc worker.Call) worker.Reply {
		call := p.newCall(jobID, session, wc)
		start := time.Now()
		defer func() { p.hostCallTime.observe(time.Since(start)) }()
		answer := make(chan worker.Reply, 1)
		select {
		case t.events <- turnMsg{call: call, answer: answer}:
		case <-ctx.Done():
			return worker.Reply{}
		}
		select {
		case r := <-answer:
			return r
		case <-ctx.Done():
			return worker.Reply{}
		}
	}
}

// Resume answers the host call named by callID — the [Call.ID] of the
// Call the last turn returned — with v, and waits for the turn's next
// event. An answer is tied to its call: a callID that is not the waiting
// call's (a duplicate or late answer, or one meant for another checkout)
// fails with ErrProtocol and leaves the waiting call unanswered, as does
// a Resume with no call waiting. Resume fails with ErrFinished (ErrClosed
// when the pool was closed) for an ended checkout, and with ctx.Err()
// when ctx ends: while waiting for another turn, with the session as it
// was; after the answer, with the step interrupted as by a ctx ending
// during Feed (the step's Result comes with ctx.Err()).
func (c *Checkout) Resume(ctx context.Context, callID int64, v ResumeValue) (TurnEvent, error) {
	if c.remote != nil {
		return c.remoteResume(ctx, callID, v)
	}
	reply := v.reply() // encoding the value is the caller's own work
	if err := c.acquire(ctx); err != nil {
		return TurnEvent{}, err
	}
	defer c.release()
	t := c.turn
	if t == nil || len(t.pending) == 0 {
		return TurnEvent{}, newError(KindProtocol, "no host call is waiting for Resume (call %d was answered already, or its step ended)", callID)
	}
	answer := t.answers[callID]
	if answer == nil {
		ids := make([]string, len(t.pending))
		for i, p := range t.pending {
			ids[i] = strconv.FormatInt(p.ID, 10)
		}
		return TurnEvent{}, newError(KindProtocol, "call %d is not waiting for an answer; calls %s are", callID, strings.Join(ids, ", "))
	}
	delete(t.answers, callID)
	t.pending = slices.DeleteFunc(t.pending, func(p *Call) bool { return p.ID == callID })
	c.mu.Lock()
	c.idle.Stop()
	c.lastUse = time.Now()
	c.mu.Unlock()
	answer <- reply
	if len(t.pending) > 0 {
		// The step may be waiting for the others: take the calls it has
		// made meanwhile, without waiting for more.
		for {
			select {
			case m := <-t.events:
				if m.call == nil {
					// The step ended (killed) with calls unanswered:
					// the next Resume or Wait reports it.
					t.ended = &m
					break
				}
				t.add(m)
				continue
			default:
			}
			break
		}
		c.mu.Lock()
		c.armIdle()
		c.mu.Unlock()
		return c.waiting(t), nil
	}
	return c.await(ctx, t)
}

// Wait waits for the next event of a turn that has calls waiting for
// answers, without answering any: another call (the event's Calls then
// hold it too) or, once none waits, the step's result. Code that awaits
// several calls at once makes them one after another; a driver that wants
// them all before it answers (to answer them in its own order) calls Wait
// until it has them. It fails with ErrProtocol when no call waits, and
// otherwise as Resume does.
func (c *Checkout) Wait(ctx context.Context) (TurnEvent, error) {
	if c.remote != nil {
		return c.remote.Wait(ctx)
	}
	if err := c.acquire(ctx); err != nil {
		return TurnEvent{}, err
	}
	defer c.release()
	t := c.turn
	if t == nil || len(t.pending) == 0 {
		return TurnEvent{}, newError(KindProtocol, "no host call is waiting, so there is no turn to wait for")
	}
	return c.await(ctx, t)
}

// add records a call the turn surfaced; the caller holds the turn.
func (t *activeTurn) add(m turnMsg) {
	t.pending = append(t.pending, m.call)
	t.answers[m.call.ID] = m.answer
}

// waiting is the event of a turn whose calls wait for answers.
func (c *Checkout) waiting(t *activeTurn) TurnEvent {
	return TurnEvent{Call: t.pending[0], Calls: slices.Clone(t.pending)}
}

// await waits for the turn's next event; the caller holds the turn.
func (c *Checkout) await(ctx context.Context, t *activeTurn) (ev TurnEvent, err error) {
	defer func() {
		if ev.Call == nil {
			endSpan(t.span, ev.Result, err)
		}
	}()
	var m turnMsg
	events := t.events
	if t.ended != nil {
		// Reported first, before anything else on events.
		ch := make(chan turnMsg, 1)
		ch <- *t.ended
		t.ended = nil
		events = ch
	}
	// A turn that ran on the caller's goroutine (see Feed) has its result
	// on events already: the end of the checkout or of ctx while it ran
	// is taken first, as a wait would have seen it first.
	lifeDone, ctxDone := false, false
	if t.ranHere {
		t.ranHere = false
		lifeDone = c.life.Err() != nil
		ctxDone = !lifeDone && ctx.Err() != nil
	}
	if !lifeDone && !ctxDone {
		select {
		case m = <-events:
			if m.call != nil {
				t.add(m)
				// A caller that never resumes nor finishes loses the session
				// after Config.SessionIdle, like an idle one.
				c.mu.Lock()
				c.armIdle()
				c.mu.Unlock()
				return TurnEvent{Call: m.call, Calls: slices.Clone(t.pending)}, nil
			}
		case <-c.life.Done():
			lifeDone = true
		case <-ctx.Done():
			ctxDone = true
		}
	}
	switch {
	case lifeDone:
		// The checkout ends under the turn (Close, Finish, idle): the step
		// is killed, and the cleanup, which waits for this turn, ends the
		// rest.
		t.stop()
		drainTurn(t)
		c.endTurn()
		return TurnEvent{}, c.endErr()
	case ctxDone:
		// Interrupted first; killed after the grace, or at once when the
		// checkout ends meanwhile.
		var ok bool
		if m, ok = c.interruptTurn(t); !ok {
			c.endTurn()
			return TurnEvent{}, c.endErr()
		}
		c.endTurn()
		if m.canceled {
			break
		}
		// Not counted nor logged, like a Run whose ctx ended: the caller
		// gave up on it.
		res := m.result
		c.stamp(res, !m.alive)
		if !m.alive {
			c.endProcess()
		}
		c.mu.Lock()
		c.armIdle()
		c.mu.Unlock()
		return TurnEvent{Result: res}, ctx.Err()
	}
	c.endTurn()
	if m.canceled {
		c.endProcess()
		c.mu.Lock()
		c.armIdle()
		c.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return TurnEvent{}, err
		}
		return TurnEvent{}, context.Canceled
	}
	res := m.result
	c.stamp(res, !m.alive)
	if !m.alive {
		c.endProcess()
	}
	c.pool.finish(&Job{ID: res.ID, trace: t.span.SpanContext()}, res)
	c.mu.Lock()
	c.armIdle()
	c.mu.Unlock()
	return TurnEvent{Result: res}, nil
}

// interruptTurn interrupts the turn's step and waits for its outcome,
// refusing the host calls it makes meanwhile (an interrupt that reaches
// a step during a call takes effect once the call is answered). When the
// checkout ends first, the step is killed and interruptTurn reports false.
func (c *Checkout) interruptTurn(t *activeTurn) (turnMsg, bool) {
	t.interruptStep()
	msg := "the step was interrupted"
	// Calls that wait for Resume are answered at once: the interrupt
	// takes effect when they are.
	for _, call := range t.pending {
		t.answers[call.ID] <- worker.Reply{Error: &msg}
		delete(t.answers, call.ID)
	}
	t.pending = nil
	if m := t.ended; m != nil {
		t.ended = nil
		return *m, true
	}
	for {
		select {
		case m := <-t.events:
			if m.call == nil {
				return m, true
			}
			m.answer <- worker.Reply{Error: &msg}
		case <-c.life.Done():
			t.stop()
			drainTurn(t)
			return turnMsg{}, false
		}
	}
}

// drainTurn waits for a killed turn's outcome, dropping its calls.
func drainTurn(t *activeTurn) turnMsg {
	if m := t.ended; m != nil {
		t.ended = nil
		return *m
	}
	for {
		m := <-t.events
		if m.call == nil {
			return m
		}
	}
}

// failStep answers a step the session could not run with a
// PoolWorkerError that ends the session; the caller holds the turn.
func (c *Checkout) failStep(id any, sc trace.SpanContext, msg string, accepted time.Time) TurnEvent {
	return c.failStepKind(id, sc, KindCrashed, msg, accepted)
}

// failStepKind is failStep for an error of kind k.
func (c *Checkout) failStepKind(id any, sc trace.SpanContext, k Kind, msg string, accepted time.Time) TurnEvent {
	c.mu.Lock()
	c.armIdle()
	c.mu.Unlock()
	res := c.pool.failed(&Job{ID: id}, c.pl, k, msg, accepted)
	c.stamp(res, true)
	c.pool.finish(&Job{ID: id, trace: sc}, res)
	return TurnEvent{Result: res}
}

// stamp marks a result as a session step's; the caller holds the turn.
func (c *Checkout) stamp(res *Result, ended bool) {
	res.Session = c.name
	res.Step = c.steps + c.base
	res.SessionEnded = ended
	res.Restarted = c.replacement && c.steps == 1
	if c.restoredIdle {
		res.Restored, c.restoredIdle = true, false
	}
}

// endProcess forgets the session's process, killing it if need be; the
// caller holds the turn.
func (c *Checkout) endProcess() {
	c.mu.Lock()
	child := c.child
	c.child = nil
	c.tpl = nil
	c.mu.Unlock()
	if child != nil {
		child.Close()
		c.prevChild = child
	}
	c.steps = 0
}

// resetScratch empties the scratch directory a session's ended process
// left, before the next one starts; the caller holds the turn. What a
// process writes to its scratch (a tmpfs by default) is charged to its
// memory cgroup, which goes with the process: files kept for the next
// one would be charged to no live limit, and a session restarting its
// process (an exit, a crash, a failed dump, an idle session kept in a
// file) grew the host's memory by its allowance each time. So the next
// process starts with an empty scratch directory, as with empty
// variables.
func (c *Checkout) resetScratch() error {
	prev := c.prevChild
	if prev == nil || c.pl.scratchRoot == nil {
		return nil
	}
	// Gone means reaped: a process still dying could add an entry after
	// the reset, so one that is not gone in time fails the step (and the
	// next step tries again) rather than start the next process beside
	// its files.
	if !prev.WaitReaped(reapWait) {
		return errors.New("the session's previous process was not gone after " + reapWait.String())
	}
	if err := c.pl.scratchRoot.reset(c.pl.scratch, true); err != nil {
		return err
	}
	c.prevChild = nil
	return nil
}

// Finish ends the session: a step still running is killed at once, its
// process is killed, and its slot among Config.MaxSessions
// is free again when Finish returns nil. Of several Finish calls, one
// returns nil and the others ErrFinished; on a checkout that ended
// otherwise, Finish returns why (ErrFinished for an idle one, ErrClosed
// when the pool was closed). When ctx ends before the processes are gone,
// Finish returns ctx.Err(): the checkout is finished all the same, and the
// rest of its cleanup goes on in the background.
func (c *Checkout) Finish(ctx context.Context) error {
	if c.remote != nil {
		return c.remote.Finish(ctx)
	}
	if !c.end(errFinished()) {
		return c.endErr()
	}
	select {
	case <-c.ended:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// end ends the checkout for the reason why, unless it has ended already
// (then it reports false). Deciding is atomic; the rest is not waited for:
// a turn in progress sees life end, kills its step and returns, and then
// the cleanup, on its own goroutine, kills the process
// and frees the slot; ended is closed once it has.
func (c *Checkout) end(why *Error) bool {
	c.mu.Lock()
	if c.why != nil {
		c.mu.Unlock()
		return false
	}
	c.why = why
	if c.idle != nil {
		c.idle.Stop()
	}
	c.mu.Unlock()
	c.kill()
	go c.cleanup()
	return true
}

// cleanup waits for the turn in progress to return, then releases what
// the checkout holds. It keeps the turn: nobody takes another.
func (c *Checkout) cleanup() {
	c.token <- struct{}{}
	if t := c.turn; t != nil {
		// A turn waiting for Resume, with no caller in it.
		t.stop()
		drainTurn(t)
		c.endTurn()
		endSpan(t.span, nil, c.endErr())
	}
	c.mu.Lock()
	child := c.child
	c.mu.Unlock()
	c.endProcess()
	if child != nil {
		// Gone means reaped: Finish and Close return with no zombie left.
		child.WaitReaped(reapWait)
	}
	c.dropIdleDump()
	c.pl.close()
	p := c.pool
	p.coMu.Lock()
	delete(p.checkouts, c)
	p.wakeCheckoutLocked()
	p.coMu.Unlock()
	close(c.ended)
	if c.onEnd != nil {
		c.onEnd()
	}
}

// reconfigure gives a checkout without a live process the permissions of
// a new creating request (the pool protocol's "the next request under the
// same name starts a new process, with the permissions that request
// brings").
func (c *Checkout) reconfigure(job Job) error {
	pl, rerr := c.pool.plan(&job, true)
	if rerr != nil {
		return rerr
	}
	if err := c.acquire(context.Background()); err != nil {
		pl.close()
		return err
	}
	defer c.release()
	if c.child != nil || c.turn != nil {
		pl.close()
		return newError(KindProtocol, "the session's process is still alive")
	}
	c.pl.close()
	c.pl = pl
	c.job = job
	return nil
}
