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
// Feed and Resume wait for one another. Finish ends it; so do
// [Pool.Close] and, after Config.SessionIdle without a turn, the pool.
type Checkout struct {
	pool *Pool
	job  Job   // the creating request; Code, Script and Args are unused
	pl   *plan // grants stay open for the checkout's life

	mu       sync.Mutex // one turn at a time
	tpl      *worker.Template
	child    *worker.Child // the live session process, or nil
	steps    int           // steps run by the current process
	turn     *activeTurn   // a turn waiting for Resume
	finished error         // why the checkout ended, once it has
	idle     *time.Timer
	lastUse  time.Time // when the idle timer was last armed
	name     string    // the session's name in the pool protocol
	onEnd    func()    // called once when the checkout ends
	endOnce  sync.Once
	turnDone chan struct{} // closed by end: wakes a caller waiting on a turn
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
	Timeout   Duration
	MaxOutput int
	// Host answers this step's host calls instead of the session job's
	// Host. With neither, calls surface as TurnEvents.
	Host HostFunc
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
	pending *Call // the call waiting for Resume
}

func (t *activeTurn) stop() { t.kill.Do(func() { close(t.cancel) }) }

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
	if job.Code != "" || len(job.Args) > 0 || job.Name != "" {
		return nil, requestErrorf("a checkout's job takes no code, name or args: each Step brings its own")
	}
	pl, rerr := p.plan(&job, true)
	if rerr != nil {
		return nil, rerr
	}
	c := &Checkout{pool: p, job: job, pl: pl, name: name, turnDone: make(chan struct{})}
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
		return nil, ErrClosed
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
			c.end(ErrFinished)
			return nil, &Error{Kind: KindSpawn, Type: KindSpawn.String(), Err: s.err}
		}
		c.mu.Lock()
		finished := c.finished
		if finished == nil {
			c.tpl = s.t
		}
		c.mu.Unlock()
		if finished != nil { // the pool closed meanwhile
			s.t.Close()
			return nil, ErrClosed
		}
	case <-ctx.Done():
		c.end(ErrFinished)
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

func (c *Checkout) isFinished() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.finished
}

// armIdle (re)starts the idle timer; c.mu is held.
func (c *Checkout) armIdle() {
	if c.finished != nil {
		return
	}
	if c.idle == nil {
		c.idle = time.AfterFunc(c.pool.cfg.SessionIdle, func() {
			c.mu.Lock()
			// A turn that began as the timer fired keeps the session.
			stale := time.Since(c.lastUse) >= c.pool.cfg.SessionIdle
			c.mu.Unlock()
			if stale {
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
// unchanged), a call still waiting for Resume (ErrProtocol), a finished
// checkout (ErrFinished), or ctx ending (ctx.Err(): the step is killed
// and the session's process with it).
func (c *Checkout) Feed(ctx context.Context, step Step) (TurnEvent, error) {
	accepted := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.finished != nil {
		return TurnEvent{}, c.finished
	}
	if c.turn != nil {
		return TurnEvent{}, newError(KindProtocol, "a host call is waiting for Resume")
	}
	ws, rerr := c.stepPlan(&step)
	if rerr != nil {
		return TurnEvent{}, rerr
	}
	c.idle.Stop()
	c.lastUse = time.Now()
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
	// A dead session template is replaced: the step pays its start. Its
	// process died with it, and this step says so instead of running in a
	// new process as if nothing had happened.
	if c.tpl == nil || isDone(c.tpl.Done()) {
		lost, prev := c.child != nil, c.steps
		if c.tpl != nil {
			c.tpl.Close()
		}
		c.endProcess()
		c.tpl = nil
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
		c.tpl = tpl
	}
	child := c.child
	if child == nil {
		var err error
		child, err = c.tpl.Take(c.pl.network, ctx.Done())
		if err != nil {
			if ctx.Err() != nil {
				c.armIdle()
				return TurnEvent{}, ctx.Err()
			}
			return c.failStep(step.ID, "the session's template failed: "+err.Error(), accepted), nil
		}
		c.child = child
		c.steps = 0
	}
	first := c.steps == 0
	c.steps++
	c.turn = t
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
	if len(s.Code) > maxCodeSize {
		return nil, requestErrorf("code is %d bytes; the limit is %d", len(s.Code), maxCodeSize)
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

// Resume answers the Call the last turn returned and waits for the turn's
// next event. It fails with ErrProtocol when no call is waiting, with
// ErrFinished for a finished checkout, and with ctx.Err() when ctx ends
// (the step is killed, and the session's process with it).
func (c *Checkout) Resume(ctx context.Context, v ResumeValue) (TurnEvent, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.finished != nil {
		return TurnEvent{}, c.finished
	}
	t := c.turn
	if t == nil || t.pending == nil {
		return TurnEvent{}, newError(KindProtocol, "no host call is waiting for Resume")
	}
	t.pending = nil
	c.idle.Stop()
	c.lastUse = time.Now()
	t.replies <- v.reply()
	return c.await(ctx, t)
}

// await waits for the turn's next event; c.mu is held.
func (c *Checkout) await(ctx context.Context, t *activeTurn) (TurnEvent, error) {
	var m turnMsg
	select {
	case m = <-t.events:
		if m.call != nil {
			t.pending = m.call
			// A caller that never resumes nor finishes loses the session
			// after Config.SessionIdle, like an idle one.
			c.armIdle()
			return TurnEvent{Call: m.call}, nil
		}
	case <-c.turnDone:
		// The checkout ends under the turn (Close, Finish, idle).
		t.stop()
		m = drainTurn(t)
	case <-ctx.Done():
		t.stop()
		m = drainTurn(t)
		m.canceled = true
	}
	c.turn = nil
	if m.canceled {
		c.endProcess()
		c.armIdle()
		if err := ctx.Err(); err != nil {
			return TurnEvent{}, err
		}
		// The checkout ended under the turn: end waits for c.mu, which
		// this holds, to record why.
		return TurnEvent{}, ErrFinished
	}
	res := m.result
	c.stamp(res, !m.alive)
	if !m.alive {
		c.endProcess()
	}
	c.pool.finish(&Job{ID: res.ID}, res)
	c.armIdle()
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
// PoolWorkerError that ends the session; c.mu is held.
func (c *Checkout) failStep(id any, msg string, accepted time.Time) TurnEvent {
	c.armIdle()
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

// stamp marks a result as a session step's; c.mu is held.
func (c *Checkout) stamp(res *Result, ended bool) {
	res.Session = c.name
	res.Step = c.steps
	res.SessionEnded = ended
}

// endProcess forgets the session's process, killing it if need be; c.mu
// is held.
func (c *Checkout) endProcess() {
	if c.child != nil {
		c.child.Close()
		c.child = nil
	}
	c.steps = 0
}

// Finish ends the session: its process and template are killed, and its
// slot among Config.MaxSessions is free again. A step still running is
// killed. Finishing twice returns ErrFinished.
func (c *Checkout) Finish(ctx context.Context) error {
	if err := c.isFinished(); err != nil {
		return err
	}
	c.end(ErrFinished)
	return nil
}

// end finishes the checkout once, for any reason: a running turn is
// killed first.
func (c *Checkout) end(why error) {
	c.endOnce.Do(func() {
		// A caller waiting on a turn kills it and returns; then the
		// checkout is free.
		close(c.turnDone)
		c.mu.Lock()
		defer c.mu.Unlock()
		if t := c.turn; t != nil {
			// A turn waiting for Resume, with no caller in it.
			t.stop()
			drainTurn(t)
			c.turn = nil
		}
		c.finished = why
		if c.idle != nil {
			c.idle.Stop()
		}
		c.endProcess()
		if c.tpl != nil {
			c.tpl.Close()
			c.tpl = nil
		}
		c.pl.close()
		p := c.pool
		p.coMu.Lock()
		delete(p.checkouts, c)
		p.coMu.Unlock()
		if c.onEnd != nil {
			go c.onEnd()
		}
	})
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
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.finished != nil {
		pl.close()
		return c.finished
	}
	if c.child != nil || c.turn != nil {
		pl.close()
		return newError(KindProtocol, "the session's process is still alive")
	}
	c.pl.close()
	c.pl = pl
	c.job = job
	return nil
}
