package pynox

import (
	"context"
	"sync"
	"time"

	"github.com/pynox/pynox/internal/worker"
)

// Checkout is a session: one confined CPython process whose __main__
// survives between steps, for agents that define a variable in one call
// and use it in the next. It is what monty-pool calls a checkout.
//
// A Checkout owns a template process of its own, started by
// [Pool.Checkout], and the process it forks, started by the first [Checkout.Feed].
// The job given to Pool.Checkout fixes the session's permissions, limits,
// environment and host functions; each step brings only code, name, args
// and optionally its own timeout and output cap.
//
// A Python exception leaves the session alive, like a notebook cell. A
// timeout, a crash or an exit ends its process: that step's result has
// SessionEnded set, and the next Feed starts a new process (with empty
// globals) under the same permissions.
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
	lastUse time.Time // when the idle timer was last armed

	life  context.Context    // canceled when the checkout starts to end
	kill  context.CancelFunc // cancels life
	ended chan struct{}      // closed once its processes are gone and its slot is free
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
}

// TurnEvent is how a turn of a [Checkout] ended: the step called a host
// function (Call is set: answer it with [Checkout.Resume]), or it
// completed (Result is set).
type TurnEvent struct {
	Call   *Call
	Result *Result
}

// activeTurn is a step that runs on its own goroutine while its caller
// answers host calls.
type activeTurn struct {
	events  chan turnMsg
	replies chan worker.Reply
	cancel  chan struct{} // kills the step
	kill    sync.Once
	pending *Call  // the call waiting for Resume
	done    func() // called once when the turn ends: Shutdown waits for it
}

func (t *activeTurn) stop() { t.kill.Do(func() { close(t.cancel) }) }

// endTurn forgets the turn, which has ended; the caller holds the turn.
func (c *Checkout) endTurn() {
	if t := c.turn; t != nil {
		c.turn = nil
		t.done()
	}
}

type turnMsg struct {
	call     *Call
	result   *Result
	alive    bool // the session's process lives on
	canceled bool
}

// Checkout starts a session with job's permissions, limits, environment
// and host functions (job.Code, Script and Args must be empty: steps bring
// the code). It starts the session's own template, which takes about as
// long as a pool's start (tens of milliseconds, plus preloads); the first
// Feed forks the session's process from it.
//
// It fails with a KindRequest error for a job outside the ceiling, with
// ErrExhausted when Config.MaxSessions sessions are open, with a KindSpawn
// error when the template cannot start, with ErrClosed after Close, and
// with ctx.Err() when ctx ends first.
func (p *Pool) Checkout(ctx context.Context, job Job) (*Checkout, error) {
	return p.checkout(ctx, job, "", nil)
}

// checkout is Checkout for a named session of the pool protocol; onEnd
// runs once when the checkout ends, whatever ends it.
func (p *Pool) checkout(ctx context.Context, job Job, name string, onEnd func(*Checkout)) (*Checkout, error) {
	if err := p.usable(); err != nil {
		return nil, err
	}
	if job.Code != "" || len(job.Args) > 0 || job.Name != "" {
		return nil, requestErrorf("a checkout's job takes no code, name or args: each Step brings its own")
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
	case len(p.checkouts) >= p.cfg.MaxSessions:
		p.coMu.Unlock()
		p.mu.Unlock()
		pl.close()
		return nil, newError(KindExhausted, "max_sessions sessions are open; finish one first")
	}
	p.checkouts[c] = struct{}{}
	p.coMu.Unlock()
	p.restarts.Add(1) // the template's start, below
	p.mu.Unlock()

	// The template's start is not bound to ctx beyond the wait: a caller
	// that gives up leaves nothing behind. Close waits for the start
	// (restarts), so no template outlives the pool.
	type started struct {
		t   *worker.Template
		err error
	}
	ch := make(chan started, 1)
	go func() {
		t, err := p.startSessionTemplate()
		ch <- started{t, err}
	}()
	select {
	case s := <-ch:
		defer p.restarts.Done()
		if s.err != nil {
			c.end(errFinished())
			<-c.ended
			return nil, &Error{Kind: KindSpawn, Type: KindSpawn.String(), Err: s.err}
		}
		c.mu.Lock()
		why := c.why
		if why == nil {
			c.tpl = s.t
		}
		c.mu.Unlock()
		if why != nil { // the pool closed meanwhile
			s.t.Close()
			return nil, c.endErr()
		}
	case <-ctx.Done():
		c.end(errFinished())
		<-c.ended
		go func() {
			defer p.restarts.Done()
			if s := <-ch; s.t != nil {
				s.t.Close()
			}
		}()
		return nil, ctx.Err()
	}
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
	c.lastUse = time.Now()
}

// Pid returns the process id of the session's live process, or 0 when it
// has none (before the first Feed, after it ended). Diagnostics and tests.
func (c *Checkout) Pid() int {
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
// session as it was; one that ends while the step runs kills the step,
// and the session's process with it.
func (c *Checkout) Feed(ctx context.Context, step Step) (TurnEvent, error) {
	accepted := time.Now()
	if err := c.acquire(ctx); err != nil {
		return TurnEvent{}, err
	}
	defer c.release()
	if c.turn != nil {
		return TurnEvent{}, newError(KindProtocol, "host call %d is waiting for Resume", c.turn.pending.ID)
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
	t := &activeTurn{events: make(chan turnMsg, 1), replies: make(chan worker.Reply, 1)}
	h := step.Host
	if h == nil {
		h = c.job.Host
	}
	host := c.pool.hostAdapter(step.ID, c.name, h)
	if host == nil {
		host = t.host(c.pool, step.ID, c.name)
	}
	ws.Host = host
	onOut := step.OnOutput
	if onOut == nil {
		onOut = c.job.OnOutput
	}
	ws.Output = c.pool.outputAdapter(step.ID, c.name, onOut)
	// A dead session template is replaced: the step pays its start. Its
	// process died with it, and this step says so instead of running in a
	// new process as if nothing had happened.
	if c.tpl == nil || isDone(c.tpl.Done()) {
		lost, prev := c.child != nil, c.steps
		c.mu.Lock()
		old := c.tpl
		c.tpl = nil
		c.mu.Unlock()
		if old != nil {
			old.Close()
		}
		c.endProcess()
		if lost {
			c.steps = prev + 1
			ev := c.failStep(step.ID, "the session's process died with its template; the next step starts a new one", accepted)
			c.steps = 0
			return ev, nil
		}
		tpl, err := c.pool.startSessionTemplate()
		if err != nil {
			return c.failStep(step.ID, "the session's template could not be started: "+err.Error(), accepted), nil
		}
		c.mu.Lock()
		c.tpl = tpl
		c.mu.Unlock()
	}
	child := c.child
	var restore []byte
	if child == nil {
		var err error
		child, err = c.tpl.Take(c.pl.network, tctx.Done())
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
			return c.failStep(step.ID, "the session's template failed: "+err.Error(), accepted), nil
		}
		c.mu.Lock()
		c.child = child
		c.mu.Unlock()
		c.steps = 0
		restore = c.takeRestore()
	}
	first := c.steps == 0
	c.steps++
	c.turn = t
	t.done, stepDone = stepDone, nil
	t.cancel = make(chan struct{})
	cancel := t.cancel
	stepPl := *c.pl
	stepPl.job.Timeout = ws.Timeout
	go func() {
		var out *worker.Outcome
		if first {
			j := c.pl.job
			j.Code, j.Name, j.Argv = ws.Code, ws.Name, ws.Argv
			j.Timeout, j.MaxOutput, j.Host = ws.Timeout, ws.MaxOutput, ws.Host
			j.Output = ws.Output
			j.Restore = restore
			j.Limits.CPUSecs = ws.CPUSecs
			out = child.Run(&j, cancel)
		} else {
			out = child.RunStep(ws, cancel)
		}
		res := c.pool.result(&Job{ID: step.ID}, &stepPl, out, accepted)
		t.events <- turnMsg{result: res, alive: out.Alive, canceled: out.Canceled}
	}()
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
	return &worker.Step{
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
		select {
		case t.events <- turnMsg{call: call}:
		case <-ctx.Done():
			return worker.Reply{}
		}
		select {
		case r := <-t.replies:
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
// was; after the answer, with the step killed and the session's process
// with it.
func (c *Checkout) Resume(ctx context.Context, callID int64, v ResumeValue) (TurnEvent, error) {
	reply := v.reply() // encoding the value is the caller's own work
	if err := c.acquire(ctx); err != nil {
		return TurnEvent{}, err
	}
	defer c.release()
	t := c.turn
	if t == nil || t.pending == nil {
		return TurnEvent{}, newError(KindProtocol, "no host call is waiting for Resume (call %d was answered already, or its step ended)", callID)
	}
	if t.pending.ID != callID {
		return TurnEvent{}, newError(KindProtocol, "call %d is not waiting for an answer; call %d is", callID, t.pending.ID)
	}
	t.pending = nil
	c.mu.Lock()
	c.idle.Stop()
	c.lastUse = time.Now()
	c.mu.Unlock()
	t.replies <- reply
	return c.await(ctx, t)
}

// await waits for the turn's next event; the caller holds the turn.
func (c *Checkout) await(ctx context.Context, t *activeTurn) (TurnEvent, error) {
	var m turnMsg
	select {
	case m = <-t.events:
		if m.call != nil {
			t.pending = m.call
			// A caller that never resumes nor finishes loses the session
			// after Config.SessionIdle, like an idle one.
			c.mu.Lock()
			c.armIdle()
			c.mu.Unlock()
			return TurnEvent{Call: m.call}, nil
		}
	case <-c.life.Done():
		// The checkout ends under the turn (Close, Finish, idle): the step
		// is killed, and the cleanup, which waits for this turn, ends the
		// rest.
		t.stop()
		drainTurn(t)
		c.endTurn()
		return TurnEvent{}, c.endErr()
	case <-ctx.Done():
		t.stop()
		m = drainTurn(t)
		m.canceled = true
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
	c.pool.finish(&Job{ID: res.ID}, res)
	c.mu.Lock()
	c.armIdle()
	c.mu.Unlock()
	return TurnEvent{Result: res}, nil
}

// drainTurn waits for a killed turn's outcome, dropping its calls.
func drainTurn(t *activeTurn) turnMsg {
	for {
		m := <-t.events
		if m.call == nil {
			return m
		}
	}
}

// failStep answers a step the session could not run with a
// PoolWorkerError that ends the session; the caller holds the turn.
func (c *Checkout) failStep(id any, msg string, accepted time.Time) TurnEvent {
	c.mu.Lock()
	c.armIdle()
	c.mu.Unlock()
	res := c.pool.failed(&Job{ID: id}, c.pl, KindCrashed, msg, accepted)
	c.stamp(res, true)
	c.pool.finish(&Job{ID: id}, res)
	return TurnEvent{Result: res}
}

// startSessionTemplate starts a session's own template, which forks only
// when asked.
func (p *Pool) startSessionTemplate() (*worker.Template, error) {
	opts := p.templateOptions()
	opts.OnDemand = true
	return worker.Start(opts)
}

// stamp marks a result as a session step's; the caller holds the turn.
func (c *Checkout) stamp(res *Result, ended bool) {
	res.Session = c.name
	res.Step = c.steps + c.base
	res.SessionEnded = ended
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
	c.mu.Unlock()
	if child != nil {
		child.Close()
	}
	c.steps = 0
}

// Finish ends the session: a step still running is killed at once, its
// process and template are killed, and its slot among Config.MaxSessions
// is free again when Finish returns nil. Of several Finish calls, one
// returns nil and the others ErrFinished; on a checkout that ended
// otherwise, Finish returns why (ErrFinished for an idle one, ErrClosed
// when the pool was closed). When ctx ends before the processes are gone,
// Finish returns ctx.Err(): the checkout is finished all the same, and the
// rest of its cleanup goes on in the background.
func (c *Checkout) Finish(ctx context.Context) error {
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
// the cleanup, on its own goroutine, kills the process and the template
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
	}
	c.endProcess()
	c.mu.Lock()
	tpl := c.tpl
	c.tpl = nil
	c.mu.Unlock()
	if tpl != nil {
		tpl.Close()
	}
	c.dropIdleDump()
	c.pl.close()
	p := c.pool
	p.coMu.Lock()
	delete(p.checkouts, c)
	p.coMu.Unlock()
	close(c.ended)
	if c.onEnd != nil {
		c.onEnd()
	}
}

// reconfigure gives a checkout without a live process the permissions of
// a new creating request (the pool protocol's "the next request under the
// same name starts a new process, with the permissions that request
// brings"), keeping its template.
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
