package worker

// A turn: one piece of code handed to a child, and the wait for its
// outcome.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// turnSpec is what differs between a job's first turn and a session's
// later steps.
type turnSpec struct {
	send func() error // hands the code over
	// afterSend, when set, runs once send has succeeded, while the child
	// confines itself; an error kills the child before any code runs
	// (a setup error). See Namespace.Attach.
	afterSend func() error
	timeout   time.Duration
	maxOutput int
	output    OutputFunc  // streams the output as it comes, or nil
	display   DisplayFunc // streams rich outputs as they come, or nil
	host      HostFunc
	maxCalls  int
	continued bool // a later step: the process was already running user code
	// cpu is a session turn's CPU time in seconds: the turn is killed when
	// it has used a second more (as by a one-shot job's hard RLIMIT_CPU).
	// Zero for one-shot jobs, whose own hard RLIMIT_CPU does it.
	cpu int64
	// ctx is the parent of host calls' contexts (Background when nil);
	// interrupt, when closed, sends the code SIGINT.
	ctx       context.Context
	interrupt <-chan struct{}
	// dropStderr keeps none of the child's stderr (a dump's, which
	// nobody reads): it is drained, not held up to maxOutput.
	dropStderr bool
}

// InterruptGrace is how long a step may run on after its interrupt
// (SIGINT) before it is killed: code that catches KeyboardInterrupt and
// goes on, or that blocks in C with SIGINT pending, loses its process.
const InterruptGrace = 2 * time.Second

// pendingCall is a host call the turn is waiting on.
type pendingCall struct {
	ctx    context.Context
	cancel context.CancelFunc
	gone   chan struct{} // closed when the turn stops waiting for the answer
}

// callReply is a handler's answer to the call with the child's id.
type callReply struct {
	id int64
	r  Reply
}

// MaxInFlight is how many host calls a job may have in flight at once
// (runner.py's MAX_IN_FLIGHT): its runner holds a further call back until
// one is answered, and the pool refuses one beyond it.
const MaxInFlight = 64

// turn is one piece of code handed to a child, and the wait for its
// outcome. Everything happens on the goroutine that runs it but the bell's
// reader, the output pipes' readers (only for output that outlives the
// report, or a job that runs longer than outputDelay) and host calls.
type turn struct {
	c   *Child
	ts  turnSpec
	o   *Outcome
	out *output

	timeout <-chan time.Time // fires at ts.timeout; nil once the job has reported
	killed  bool             // the turn has killed the child
	stopped bool             // a session step's process was stopped after its report

	// A session's turn is held to its CPU time (its hard RLIMIT_CPU is the
	// session's whole life's): the process's CPU clock is read when the
	// turn could have used up what is left of it on every CPU at once, and
	// at least once a second.
	cpuBase, cpuMax time.Duration
	cpuCheck        <-chan time.Time
	cpuTimer        *time.Timer // an AfterFunc sending on cpuFired (see newTimer)
	cpuFired        chan time.Time

	// Host calls: up to MaxInFlight at a time, by the id the child gave
	// each; every handler runs on its own goroutine, so that the calls
	// run concurrently and timeouts still apply.
	calls   map[int64]*pendingCall
	replies chan callReply // made at the first host call
	// canceled is the caller's cancel channel (run's cancel): a host
	// answer that comes once it is closed is not passed on (see reply).
	canceled <-chan struct{}

	// The control channel is read when the bell rings, and polled once the
	// bell is closed (the child exited, or its code closed the bell) or a
	// frame is arriving in parts.
	ctlOpen bool
	poll    <-chan time.Time
	ticker  *time.Ticker

	timers []*time.Timer // stopped when the turn ends

	// The goroutines that run host calls, kept between calls (see
	// runCall): made at the first call, ended with the turn.
	callWork chan func()
	callQuit chan struct{}

	// Rich outputs: the bytes kept so far, and the DisplayFunc's
	// goroutine once the first output came.
	displayBytes int
	disp         *displayer
}

// turn hands one piece of code to the child and waits for its outcome.
func (c *Child) turn(ts turnSpec, cancel <-chan struct{}) *Outcome {
	t := &turn{
		c:       c,
		ts:      ts,
		o:       &Outcome{Started: ts.continued},
		out:     newOutput(ts.maxOutput, ts.output),
		calls:   map[int64]*pendingCall{},
		ctlOpen: true,
	}
	if ts.dropStderr {
		t.out.stderr.max = 0
	}
	defer t.stop()
	return t.run(cancel)
}

// newTimer starts a timer that the turn stops when it ends, and returns
// the channel it fires on.
//
// The timer is a time.AfterFunc that sends on a buffered channel, not a
// time.Timer's own channel: since Go 1.23 a timer channel's timer enters
// the runtime's heap only while a goroutine is blocked on it, so each time
// the turn's select blocked (once per frame the child wrote: per host
// call, say) the timer was added again, and the runtime woke the thread
// blocked in the network poller (netpollBreak) to recompute its sleep. An
// AfterFunc's timer is added once, when it is started.
func (t *turn) newTimer(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	t.timers = append(t.timers, time.AfterFunc(d, func() { ch <- time.Now() }))
	return ch
}

// stop releases the turn's timers and ends its host call, if any.
func (t *turn) stop() {
	for _, tm := range t.timers {
		tm.Stop()
	}
	if t.cpuTimer != nil {
		t.cpuTimer.Stop()
	}
	if t.ticker != nil {
		t.ticker.Stop()
	}
	t.endCalls()
	if t.callQuit != nil {
		close(t.callQuit) // idle call runners end; busy ones once their call returns
	}
}

// run sends the code and waits for the outcome.
func (t *turn) run(cancel <-chan struct{}) *Outcome {
	c, o := t.c, t.o
	t.canceled = cancel
	captureTimer := t.newTimer(outputDelay)

	// The CPU clock's base is read before the code goes, while the
	// process waits for it (stopped, or blocked reading its job): a step
	// that ends at once (a crash, an exit) may be reaped before a read
	// after the send, and its clock would be gone.
	cpuErr := t.startCPU()
	o.Start = time.Now()
	gone := func() *Outcome {
		// The child died before it could take the code.
		c.Kill()
		t.out.start(c)
		t.out.known()
		<-t.out.closed
		t.out.finish(o)
		o.Status = c.waitStatus(time.Second)
		o.End = time.Now()
		return o
	}
	if err := t.ts.send(); err != nil {
		return gone()
	}

	if t.ts.afterSend != nil {
		if err := t.ts.afterSend(); errors.Is(err, errChildGone) {
			return gone()
		} else if err != nil {
			o.SetupError = err.Error()
			t.kill()
		}
	}
	if t.ts.timeout > 0 {
		t.timeout = t.newTimer(t.ts.timeout)
	}
	if err := cpuErr; err != nil {
		// Without it the turn could not be held to its CPU time.
		o.SetupError = "the session's CPU time cannot be read: " + err.Error()
		t.kill()
	}

	c.bellOnce.Do(c.watchBell)
	bellClosed := c.bellClosed
	exitCh := c.exitCh
	if c.status != nil {
		exitCh = nil
		o.Status = c.status
	}
	pipesDone := false
	var drain <-chan time.Time
	interrupt := t.ts.interrupt
	var grace <-chan time.Time
	for {
		// The result is complete once the output pipes are closed and the
		// outcome is known: the child's own report, a kill of ours, or —
		// for a child that ended without reporting — its exit status. A
		// reported or killed child's teardown is not waited for.
		if t.known() {
			// A session step's process that lives on keeps its spent
			// pipes until its next step (Child.closeLater).
			t.out.closeLater = o.Alive && !t.killed
			t.out.start(c)
			t.out.known()
			if !pipesDone && isClosed(t.out.closed) {
				pipesDone = true
			}
			if pipesDone {
				break
			}
			if drain == nil {
				if !o.Alive {
					// Nothing more is read from the control socket. Closing
					// it also frees any descriptors the job queued on it
					// (its own pipe ends, say), which would keep the pipes
					// open.
					c.closeCtl()
					t.ctlOpen = false
					t.poll = nil
				}
				// The child is dead or being killed, or a session between
				// steps, so its pipes close soon; a job that smuggled their
				// ends elsewhere gets its output cut off rather than
				// hanging the worker.
				drain = t.newTimer(drainTimeout)
			}
		}
		var pipesWait <-chan struct{}
		if !pipesDone {
			pipesWait = t.out.closed
		}
		var rings <-chan struct{}
		if t.ctlOpen {
			rings = c.rings
		}
		select {
		case <-captureTimer:
			t.out.start(c)
		case <-rings:
			t.readCtl()
			if n := c.rung.Load(); n > 2*c.frames+spareRings {
				t.violation(fmt.Sprintf("it rang its bell (descriptor 4) %d times but wrote %d frames on its control channel; the limit is two rings per frame and %d more", n, c.frames, spareRings))
			}
		case <-bellClosed:
			bellClosed = nil
			t.startPoll()
			t.readCtl()
		case <-t.poll:
			t.readCtl()
		case r := <-t.replies:
			// An interrupt asked for before this answer goes first: the
			// runner holds SIGINT while it waits, so the step takes the
			// KeyboardInterrupt as the answer is in. Left to the select's
			// random choice, the answer could win, and the step end before
			// the signal was sent.
			select {
			case <-interrupt:
				interrupt = nil
				grace = t.interruptNow(grace)
			default:
			}
			t.reply(r)
		case <-pipesWait:
			pipesDone = true
		case <-drain:
			t.out.cutOff()
			pipesDone = true
		case st, ok := <-exitCh:
			exitCh = nil
			if ok {
				o.Status = &st
				c.status = &st
				o.Alive = false
			}
		case <-t.timeout:
			t.timeout = nil
			if !o.Done {
				o.TimedOut = true
				t.kill()
			}
		case <-t.cpuCheck:
			t.checkCPU()
		case <-interrupt:
			interrupt = nil
			grace = t.interruptNow(grace)
		case <-grace:
			grace = nil
			if !o.Done && !t.killed {
				o.InterruptKilled = true
				t.kill()
			}
		case <-cancel:
			cancel = nil
			if !o.Done {
				o.Canceled = true
				t.kill()
			}
		}
	}
	t.out.finish(o)
	t.endDisplay()
	if o.Alive && (t.killed || c.status != nil) {
		o.Alive = false
	}
	if o.Alive {
		t.pause()
	}
	o.End = time.Now()
	return o
}

// interruptNow sends the step SIGINT (or kills it when the signal cannot
// be sent) and returns the grace timer after which it is killed; grace
// is returned unchanged when the step is over.
func (t *turn) interruptNow(grace <-chan time.Time) <-chan time.Time {
	if t.o.Done || t.killed {
		return grace
	}
	t.o.Interrupted = true
	if t.c.signal(unix.SIGINT) != nil {
		t.kill()
		return grace
	}
	return t.newTimer(InterruptGrace)
}

// known reports whether the turn's outcome is known: the child's own
// report, a kill of ours, or the exit status of a child whose control
// channel ended.
func (t *turn) known() bool {
	o := t.o
	return o.Done || o.SetupError != "" || o.Violation != "" || o.TimedOut || o.CPUExceeded || o.Canceled || (!t.ctlOpen && o.Status != nil)
}

// pause stops a session's process until its next step, once: its threads
// neither burn CPU nor write anything between steps. A process that
// cannot be stopped is killed.
func (t *turn) pause() {
	if t.stopped || t.killed {
		return
	}
	if err := t.c.signal(unix.SIGSTOP); err != nil {
		t.o.Alive = false
		t.kill()
		return
	}
	t.stopped = true
}

// kill kills the child, once.
func (t *turn) kill() {
	if !t.killed {
		t.killed = true
		t.c.Kill()
	}
}

// violation records that the child broke the control protocol, unless it
// has reported already, and kills it.
func (t *turn) violation(msg string) {
	if t.o.Violation == "" && !t.o.Done {
		t.o.Violation = msg
	}
	t.kill()
}

// startCPU reads the session's CPU clock at the start of a turn that is
// held to its CPU time, and arms the first check.
func (t *turn) startCPU() error {
	if t.ts.cpu <= 0 {
		return nil
	}
	t.cpuMax = time.Duration(t.ts.cpu+1) * time.Second
	var err error
	if t.cpuBase, err = t.c.cpuTime(); err == nil {
		t.armCPU(0)
	}
	return err
}

// armCPU schedules the next read of the CPU clock, given the CPU time the
// turn has used.
func (t *turn) armCPU(used time.Duration) {
	wait := (t.cpuMax - used) / time.Duration(runtime.NumCPU())
	wait = min(max(wait, 10*time.Millisecond), time.Second)
	if t.cpuTimer == nil {
		ch := make(chan time.Time, 1)
		t.cpuFired = ch
		t.cpuTimer = time.AfterFunc(wait, func() {
			select {
			case ch <- time.Now():
			default:
			}
		})
	} else {
		t.cpuTimer.Reset(wait)
	}
	t.cpuCheck = t.cpuFired
}

// checkCPU reads the CPU clock and kills a turn that used more than its
// CPU time.
func (t *turn) checkCPU() {
	t.cpuCheck = nil
	if t.o.Done || t.killed {
		return
	}
	now, err := t.c.cpuTime()
	switch {
	case err != nil:
		// The process is gone: its end is on its way.
	case now-t.cpuBase > t.cpuMax:
		t.o.CPUExceeded = true
		t.kill()
	default:
		t.armCPU(now - t.cpuBase)
	}
}

// startPoll starts polling the control channel.
func (t *turn) startPoll() {
	if t.ticker == nil {
		t.ticker = time.NewTicker(ctlPollInterval)
		t.poll = t.ticker.C
	}
}

// readCtl reads and handles the frames the control channel holds now.
func (t *turn) readCtl() {
	if !t.ctlOpen {
		return
	}
	o := t.o
	msgs, partial, end, err := t.c.readFrames()
	for i := range msgs {
		t.handle(&msgs[i])
	}
	if partial {
		t.startPoll()
	}
	if end {
		t.ctlOpen = false
		t.poll = nil
		if err != nil && !o.Done && !t.killed {
			t.violation(err.Error())
		}
		if o.Alive {
			// The session's process closed its channel after its
			// report: it is not alive after all.
			o.Alive = false
			t.kill()
		}
	}
}

// handle acts on one frame from the child.
func (t *turn) handle(m *childMsg) {
	o, c := t.o, t.c
	switch {
	case m.T == "started" && !o.Started && o.SetupError == "":
		o.Started = true
	case m.T == "setup_error" && !o.Started && o.SetupError == "":
		o.SetupError = m.Msg
		if o.SetupError == "" {
			o.SetupError = "confinement failed"
		}
	case m.T == "done" && o.Started && !o.Done && m.Exit != nil && m.Step == c.step && len(t.calls) == 0:
		if msg := checkValue(m); msg != "" {
			t.violation(msg)
			return
		}
		// Every frame before the report has been read, so an honest child
		// has rung at most twice per frame: a flood of its bell that the
		// report would otherwise outrun is caught here.
		if n := c.rung.Load(); n > 2*c.frames+spareRings {
			t.violation(fmt.Sprintf("it rang its bell (descriptor 4) %d times but wrote %d frames on its control channel; the limit is two rings per frame and %d more", n, c.frames, spareRings))
			return
		}
		o.Done = true
		o.Exit = *m.Exit
		o.Error = m.Error
		o.Value = m.Value
		if m.ValueRepr != nil {
			o.ValueRepr = *m.ValueRepr
		}
		o.Skipped = m.Skipped
		t.timeout = nil
		if c.session && !m.Final {
			o.Alive = true
			// Stopped at once, not after the output drain: a thread
			// that kept a copy of the step's stdout would otherwise run
			// on, past the step's timeout and CPU check, for as long
			// as the drain waits.
			t.pause()
		} else {
			// Its counters, read before it is killed (after its final
			// report the runner waits for the kill): the result does not
			// wait for its template to report the reap (see noteUsage).
			if !isClosed(c.reaped) {
				if u, err := c.doneUsage(); err == nil && !isClosed(c.reaped) {
					o.doneUsage = &u
				}
			}
			// Nothing the child does after reporting can matter.
			t.kill()
		}
	case m.T == "display" && o.Started && !o.Done && m.Step == c.step:
		t.display(m)
	case m.T == "call" && o.Started && !o.Done && m.Step == c.step && t.calls[m.ID] == nil:
		t.hostCall(m)
	case o.Done && !o.Alive:
		// Whatever follows its report is ignored; it is being killed.
	default:
		t.violation(fmt.Sprintf("unexpected %q frame on the control channel", m.T))
	}
}

// hostCall checks a host call the child made and hands it to the host,
// or refuses it.
func (t *turn) hostCall(m *childMsg) {
	t.o.Calls++
	switch {
	case len(t.calls) >= MaxInFlight:
		t.refuse(m.ID, fmt.Sprintf("more than %d host calls in flight", MaxInFlight))
	case !t.c.functions[m.Function]:
		// A call to an undeclared name never reaches the host.
		t.refuse(m.ID, fmt.Sprintf("no host function named %q", m.Function))
	case t.ts.host == nil:
		t.refuse(m.ID, "no host answers calls for this job")
	case t.o.Calls > t.ts.maxCalls:
		t.refuse(m.ID, fmt.Sprintf("this job made more than %d host calls", t.ts.maxCalls))
	case !jsonIs(m.Args, '[') || (len(m.Kwargs) > 0 && !jsonIs(m.Kwargs, '{') && string(m.Kwargs) != "null"):
		t.violation("malformed host call")
	case len(m.Args)+len(m.Kwargs) > MaxCall:
		t.refuse(m.ID, fmt.Sprintf("the arguments are %d bytes of JSON; the limit is %d", len(m.Args)+len(m.Kwargs), MaxCall))
	default:
		// What the job wrote goes to the host, and in `pynox pool`
		// onto the client's stream, only if every client can read it.
		if err := cmp.Or(checkCallJSON(m.Args), checkCallJSON(m.Kwargs)); err != nil {
			t.refuse(m.ID, fmt.Sprintf("the arguments to %s cannot be passed on: %v", m.Function, err))
			return
		}
		// The host's ctx carries the caller's values and ends with the
		// caller's ctx or at the turn's deadline; its answer is still
		// passed on (it says why it failed), unless the turn has ended.
		parent := t.ts.ctx
		if parent == nil {
			parent = context.Background()
		}
		var ctx context.Context
		var cancel context.CancelFunc
		if t.ts.timeout > 0 {
			ctx, cancel = context.WithDeadline(parent, t.o.Start.Add(t.ts.timeout))
		} else {
			ctx, cancel = context.WithCancel(parent)
		}
		pc := &pendingCall{ctx: ctx, cancel: cancel, gone: make(chan struct{})}
		id := m.ID
		t.calls[id] = pc
		cl := Call{Function: m.Function, Args: m.Args, Kwargs: m.Kwargs}
		if len(cl.Kwargs) == 0 || string(cl.Kwargs) == "null" {
			cl.Kwargs = json.RawMessage("{}")
		}
		if t.replies == nil {
			// Made at the first call: most jobs make none, and its
			// MaxInFlight slots were the largest allocation per job.
			t.replies = make(chan callReply, MaxInFlight)
		}
		host, replies := t.ts.host, t.replies
		t.runCall(func() {
			r := host(pc.ctx, cl)
			select {
			case replies <- callReply{id, r}:
			case <-pc.gone:
			}
		})
	}
}

// reply passes the host's answer to a pending call on to the child.
func (t *turn) reply(cr callReply) {
	pc := t.calls[cr.id]
	if pc == nil {
		return
	}
	pc.cancel() // the handler is done
	delete(t.calls, cr.id)
	if t.ts.timeout > 0 && !t.o.Done && !time.Now().Before(t.o.Start.Add(t.ts.timeout)) {
		// The turn's time is up, which is likely why the host answered
		// (its ctx ended at the deadline): a timeout, not the answer.
		t.o.TimedOut = true
		t.timeout = nil
		t.kill()
		return
	}
	if t.canceled != nil && isClosed(t.canceled) && !t.o.Done {
		// The caller gave up, which is likely why the host answered (its
		// ctx ends with the caller's): the turn is canceled, as its
		// select would have found had it looked at cancel first, and the
		// child never gets an answer made of the cancellation.
		t.o.Canceled = true
		t.kill()
		return
	}
	r := cr.r
	if r.Error == nil && len(r.Result) > MaxCall {
		msg := fmt.Sprintf("the host's result is %d bytes of JSON; the limit is %d", len(r.Result), MaxCall)
		r = Reply{Error: &msg}
	}
	t.answer(cr.id, r)
}

// endCalls cancels the pending host calls: the turn no longer waits for
// their answers.
func (t *turn) endCalls() {
	for id, pc := range t.calls {
		pc.cancel()
		close(pc.gone)
		delete(t.calls, id)
	}
}

// refuse answers a host call with an error the job sees.
func (t *turn) refuse(id int64, msg string) { t.answer(id, Reply{Error: &msg}) }

// answer sends the reply to call id to the child.
func (t *turn) answer(id int64, r Reply) {
	r = checkedReply(r)
	b, err := json.Marshal(replyFrame{T: "reply", ID: id, Result: r.Result, Error: r.Error, ErrorType: r.ErrorType})
	if err != nil {
		msg := "the host's reply could not be encoded: " + err.Error()
		b, _ = json.Marshal(replyFrame{T: "reply", ID: id, Error: &msg})
	}
	// Several replies may be outstanding, and a child need not read
	// them: their writes must not hold up the timer, nor interleave.
	t.sendReply(b)
}
