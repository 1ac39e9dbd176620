package worker

// This file holds the Child, the host side of one spare, and its jobs' and
// steps' entry points; wire.go holds what crosses to the child, ctl.go its
// control channel, output.go the capture of its output, turn.go a turn.

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pynox/pynox/internal/cgroup"
	"github.com/pynox/pynox/internal/pidfd"
	"golang.org/x/sys/unix"
)

// ExitStatus is how a child process ended, as its template reaped it.
type ExitStatus struct {
	Code         int  // exit status when it exited
	Signal       int  // signal number when a signal killed it
	TemplateDied bool // the template died first, so the status is unknown
}

// Child is one forked, pre-confined spare; it runs at most one job.
type Child struct {
	nsPid int // its pid as its template knows it: the key of exit reports
	tpl   *Template
	// The pid in the host's namespace, learnt from the pidfd when first
	// asked (Pid): not on the way of a spare to its job.
	pidOnce sync.Once
	pid     int
	// The control socket is a raw descriptor that Go reads only when the
	// child rings its bell (a pipe, registered with the poller), closes it,
	// or the host polls it as a fallback: the "started" frame then wakes
	// nobody, and a job that finishes fast wakes the host once. Writes to
	// it block, bounded by ctlSendTimeout.
	ctlFd int
	// The bell's read end, read through the template's bellPoller
	// (bell.go), or through bell, an os.File of its own, when the
	// template has none; bellMu guards both.
	bellFd int
	bell   *os.File
	bellID uint64 // the bell's id in the bellPoller, once watched
	bellMu sync.Mutex
	// The output pipes' read ends. They are not registered with Go's poller
	// until the job has reported or has run for outputDelay, so a short
	// job's writes wake nothing on the host: on virtual machines, waking an
	// idle CPU costs the writer a noticeable fraction of a millisecond.
	stdoutFd int
	stderrFd int
	pidfd    int

	exitOnce sync.Once
	exitCh   chan ExitStatus
	reaped   chan struct{} // closed when the template reports the exit (or dies)
	// exitUsage is the rusage the template reported with the exit (set
	// before reaped closes), or nil.
	exitUsage *Usage

	// Replies to host calls that the control socket did not take at once
	// (replies.go).
	replyMu sync.Mutex
	replies replyQueue

	killOnce   sync.Once
	killSent   atomic.Bool  // a SIGKILL went through the pidfd (see Kill)
	ctlMu      sync.RWMutex // guards ctlFd: a closed descriptor number may be reused at once
	refillOnce sync.Once
	holdRefill atomic.Bool   // Close leaves the refill to RefillNow
	holdClose  atomic.Bool   // Run leaves Close to its caller (HoldClose)
	pidMu      sync.Mutex    // guards pidfd against a signal racing its close
	closed     chan struct{} // closed by Close
	kind       int           // kindDeny or kindAllow
	nsSpare    bool          // the template's ready ns spare: its replacement is one too
	// lease is the namespace the ns spare entered ahead of its job (see
	// Template.preEnter and TakeNSLease), until its taker takes it;
	// leaseTaken says it was taken (or the child closed): no lease is
	// sent from then on. Both guarded by leaseMu.
	leaseMu    sync.Mutex
	lease      *NSLease
	leaseTaken bool

	// The bell is read by one goroutine for the child's whole life; each
	// turn's watcher takes its rings from here.
	bellOnce   sync.Once
	bellEnd    sync.Once     // closes bellClosed
	rings      chan struct{} // a ring is pending
	bellClosed chan struct{} // the bell reached end of file
	rung       atomic.Int64  // bytes read from the bell: one ring each
	frames     int64         // whole frames read from the control socket
	pending    []byte        // control bytes read but not yet a whole frame

	// Set by Run (and RunStep) only, between turns.
	session   bool
	functions map[string]bool
	step      int
	status    *ExitStatus // how the process ended, once known
	// lastUsage is what noteUsage read after the last session step, the
	// next step's base (see stepBase); nil when unknown, or when a dump
	// ran since.
	lastUsage *Usage
	// procFiles are the one-shot job's /proc/<pid>/stat and status,
	// opened by jobBase and closed by noteUsage (see procFiles).
	procFiles procFiles
	// sproc are a session process's held /proc files (session_usage.go).
	sproc sessionProc
	// nextPipes are the next step's output pipes, when made ahead
	// (step_pipes.go); guarded by pidMu.
	nextPipes stepPipes

	// The child's cgroup, set before the child is handed out (see
	// Template.deliver); cgErr says why joining one failed, which fails
	// every job the child is given.
	cg       *cgroup.Group
	cgErr    error
	cgMargin int64 // added to a job's allowance for its cgroup's memory limit

	// prepared are the same files opened when the spare was delivered
	// (prepareUsage), until jobBase takes them or Close closes them;
	// guarded by pidMu.
	prepared procFiles
}

// newChild takes the spare's descriptors as the template sent them:
// control socket, stdout and stderr read ends, pidfd, bell read end. nsPid
// is the pid the template reported, in its own namespace.
// The descriptors are close-on-exec already (see Template.readLoop).
func newChild(t *Template, nsPid, kind int, fds []int) (*Child, error) {
	tv := unix.NsecToTimeval(ctlSendTimeout.Nanoseconds())
	err := rawSetsockoptTimeval(fds[0], unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	for _, fd := range []int{fds[1], fds[2], fds[4]} {
		if err == nil {
			// Pipe read ends the template made with pipe2(O_CLOEXEC):
			// their only status flag is O_RDONLY, so one F_SETFL sets
			// O_NONBLOCK without the F_GETFL of unix.SetNonblock.
			err = rawSetfl(fd, unix.O_NONBLOCK)
		}
	}
	if err != nil {
		closeAll(fds)
		return nil, fmt.Errorf("child channels: %w", err)
	}
	return &Child{
		nsPid:      nsPid,
		tpl:        t,
		ctlFd:      fds[0],
		bellFd:     fds[4],
		stdoutFd:   fds[1],
		stderrFd:   fds[2],
		pidfd:      fds[3],
		exitCh:     make(chan ExitStatus, 1),
		reaped:     make(chan struct{}),
		closed:     make(chan struct{}),
		kind:       kind,
		rings:      make(chan struct{}, 1),
		bellClosed: make(chan struct{}),
	}, nil
}

func (c *Child) exited(st ExitStatus) {
	c.exitOnce.Do(func() {
		c.exitCh <- st
		close(c.exitCh)
		close(c.reaped)
		// A ready ns spare that died before its job (killed from
		// outside, say) ends the lease of the namespace it entered: the
		// mounter would otherwise keep that namespace until the dead
		// spare is taken or the pool closes.
		c.releaseLease()
		if c.tpl != nil {
			c.tpl.releaseReaped(c)
		}
	})
}

// Pid returns the child's process id in the caller's PID namespace, or 0
// when the host cannot learn it (the child was reaped before it was first
// asked). The template's own pids are its namespace's; the pidfd names
// the process in ours.
func (c *Child) Pid() int {
	c.pidOnce.Do(func() {
		if !c.tpl.info.PIDNamespace {
			c.pid = c.nsPid
			return
		}
		c.pidMu.Lock()
		defer c.pidMu.Unlock()
		if c.pidfd >= 0 {
			c.pid, _ = pidfd.Pid(c.pidfd)
		}
	})
	return c.pid
}

// joinCgroup creates the child's cgroup with the memory limit given and
// moves the process into it. A failure is kept and fails the child's job
// (fail closed).
func (c *Child) joinCgroup(m *cgroup.Manager, memory, margin int64) {
	g, err := m.NewGroup(memory)
	if err == nil {
		c.pidMu.Lock()
		if c.pidfd < 0 {
			err = errors.New("the spare was closed before it joined its cgroup")
		} else {
			err = g.Add(c.pidfd)
		}
		c.pidMu.Unlock()
	}
	c.cg, c.cgErr, c.cgMargin = g, err, margin
}

// limitMemory sets the child's cgroup memory limit for a job allowance.
func (c *Child) limitMemory(allowance int64) error {
	if c.cgErr != nil {
		return c.cgErr
	}
	if c.cg == nil {
		return nil
	}
	return c.cg.SetMemory(allowance + c.cgMargin)
}

// noteOOM records in o whether the kernel's OOM killer ended the job, for
// a job that died of SIGKILL without reporting.
func (c *Child) noteOOM(o *Outcome) {
	if c.cg == nil {
		return
	}
	o.MemoryLimit = c.cg.Memory()
	if !o.Done && o.Status != nil && o.Status.Signal == int(unix.SIGKILL) && !o.TimedOut && !o.Canceled {
		o.OOMKilled = c.cg.OOMKilled()
	}
}

// Gone reports whether the child's process has ended (its pidfd is
// readable), been closed, or lost its template, whose death takes every
// process of its PID namespace with it. A session checks it before a
// step, to start a replacement for a process that died between steps.
func (c *Child) Gone() bool {
	if isClosed(c.tpl.done) || isClosed(c.closed) {
		return true
	}
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	if c.pidfd < 0 {
		return true
	}
	fds := []unix.PollFd{{Fd: int32(c.pidfd), Events: unix.POLLIN}}
	n, err := rawPollNow(fds)
	return err == nil && n > 0
}

// WaitReaped waits, at most d, until the child's template has reaped its
// process (or died, taking it along), and reports whether it has. Call it
// after Close, which kills the process.
func (c *Child) WaitReaped(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.exitCh: // closed once the exit is known, whoever read it
		return true
	case <-t.C:
		return false
	}
}

// Template returns the template that forked the child.
func (c *Child) Template() *Template { return c.tpl }

// Kill sends SIGKILL through the child's pidfd, which cannot hit a reused
// pid. Once one went through, the process is dying and Kill sends no
// other: a job's turn kills the child at its report and Close kills it
// again, a system call per job for nothing.
func (c *Child) Kill() {
	if c.killSent.Load() {
		return
	}
	if c.signal(unix.SIGKILL) == nil {
		c.killSent.Store(true)
	}
}

// signal sends sig through the pidfd unless Close has released it (its
// number may name another process's pidfd by now).
func (c *Child) signal(sig unix.Signal) error {
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	if c.pidfd < 0 {
		return unix.EBADF
	}
	return rawPidfdSignal(c.pidfd, sig)
}

// Close kills the child, releases every host-side descriptor, and asks
// the template for the spare that replaces it. The replacement is forked
// only now, not when the child was taken, so that its fork and
// preparation do not compete with the job for the CPU.
func (c *Child) Close() {
	c.killOnce.Do(func() {
		c.Kill()
		c.releaseLease()
		close(c.closed)
		c.closeCtl()
		c.closeBell()
		if c.stdoutFd >= 0 {
			rawClose(c.stdoutFd)
			rawClose(c.stderrFd)
		}
		c.takePrepared().close()
		c.pidMu.Lock()
		rawClose(c.pidfd)
		c.pidfd = -1
		c.closeSessionProc()
		c.closeStepPipes()
		c.pidMu.Unlock()
		if c.cg != nil {
			// Released once the template has reaped the process, which it
			// reports: from then on the group holds no task (unless the
			// job left processes behind, which Release waits out). Polling
			// the group from here, before the kill has taken effect, cost
			// a timer and several reads per job.
			// A template that dies takes its children with it (its PID
			// namespace, or their parent-death signal), so its death
			// releases the group too, whether or not it had the child
			// on its books (a pool's Close waits for every release).
			// The template keeps the group until then (releaseReaped),
			// rather than a goroutine per job waiting for it.
			if g := c.cg; !c.tpl.releaseWhenReaped(c, g) {
				g.Release()
			}
		}
		if !c.holdRefill.Load() {
			c.refillOnce.Do(func() { c.tpl.refillChild(c) })
		}
	})
}

// HoldRefill makes Close leave the request for this child's replacement
// to RefillNow: the pool asks for it once the job's answer is out, so that
// the fork does not compete with delivering it.
func (c *Child) HoldRefill() { c.holdRefill.Store(true) }

// RefillNow asks the template for this child's replacement right away
// instead of when the child is closed. Under a backlog the replacement's
// fork and preparation then overlap the job instead of following it; with
// no backlog, waiting keeps them off the CPU the job is using.
func (c *Child) RefillNow() {
	c.refillOnce.Do(func() {
		c.tpl.unhold(c)
		c.tpl.refillChild(c)
	})
}

// Run hands job to the child and waits for its outcome: until the child
// reports completion and its output pipes close, or it dies, times out, or
// cancel closes. The child is always dead when Run returns, unless the job
// is a session whose process lives on (Outcome.Alive): then the next
// steps go to RunStep, and Close ends it.
func (c *Child) Run(job *Job, cancel <-chan struct{}) *Outcome {
	f := jobFrame{T: "job", Code: job.Code, Name: job.Name, Script: job.Script, Argv: job.Argv,
		Env: job.Env, Path: job.Path, Network: job.Network, Limits: job.Limits,
		Session: job.Session, Step: 1, Functions: job.Functions, Tools: job.Tools, Inputs: job.Inputs}
	var cpu int64
	if job.Session {
		f.Limits.SessionCPU = cmp.Or(f.Limits.SessionCPU, SessionCPU)
		cpu = job.Limits.CPUSecs
	}
	fds := make([]int, len(job.Grants))
	f.Rules = make([]uint64, len(job.Grants))
	for i, g := range job.Grants {
		fds[i] = g.Fd
		f.Rules[i] = g.Access
	}
	var attach func() error
	if ns := job.Namespace; ns != nil {
		if ns.Entered {
			f.NSEntered = true
			attach = ns.Attach
		} else {
			fds = append(fds, ns.User, ns.Mount)
		}
		f.NS, f.NSRules = true, ns.Rules
	}
	if job.Restore != nil {
		mfd, err := dumpMemfd(job.Restore)
		if err != nil {
			c.Close()
			now := time.Now()
			return &Outcome{SetupError: "the session's dump could not be handed over: " + err.Error(), Start: now, End: now}
		}
		defer unix.Close(mfd)
		fds = append(fds, mfd)
		f.Restore = true
	}
	if attach != nil && len(fds) == 0 {
		// A frame without descriptors may be read in one piece with the
		// frame after it (the kernel stops a read only after one with
		// descriptors), so the "attached" frame does not follow one:
		// the mounts are attached before the job is sent.
		if err := attach(); err != nil {
			c.Close()
			now := time.Now()
			return &Outcome{SetupError: err.Error(), Start: now, End: now}
		}
		attach = nil
	}
	f.NSWait = attach != nil
	c.session = job.Session
	c.functions = make(map[string]bool, len(job.Functions))
	for _, n := range job.Functions {
		c.functions[n] = true
	}
	c.step = 1
	if err := c.limitMemory(job.Limits.Memory); err != nil {
		// No user code may run outside the limits.
		c.Close()
		now := time.Now()
		if errors.Is(err, unix.ESRCH) {
			// The spare died before it could join its cgroup: nothing
			// ran, and the job may go to another spare (not Started,
			// no SetupError).
			return &Outcome{Start: now, End: now}
		}
		return &Outcome{SetupError: err.Error(), Start: now, End: now}
	}
	var base *Usage
	if job.Session {
		base = c.stepBase()
	} else {
		base = c.jobBase()
	}
	o := c.turn(turnSpec{
		send: func() error {
			b, err := marshalFrame(&f)
			if err != nil {
				return err
			}
			err = c.sendRaw(b, fds)
			if err == nil && job.Session {
				// The second step's pipes, made while the first runs
				// (step_pipes.go).
				c.prepareStepPipes()
			}
			return err
		},
		afterSend: c.attachAfterSend(attach),
		timeout:   job.Timeout,
		maxOutput: job.MaxOutput,
		output:    job.Output,
		display:   job.Display,
		host:      job.Host,
		maxCalls:  job.MaxCalls,
		cpu:       cpu,
		ctx:       job.Ctx,
		interrupt: job.Interrupt,
	}, cancel)
	c.noteOOM(o)
	if !o.Alive {
		c.endRun()
	}
	c.noteUsage(o, base, job.Session)
	return o
}

// RunStep runs the next step of a session whose process is alive (the last
// Outcome had Alive set). It brings the step a fresh pair of output pipes.
// When the step ends the process (an exit, a crash, a timeout), the child
// is closed and Outcome.Alive is false.
func (c *Child) RunStep(st *Step, cancel <-chan struct{}) *Outcome {
	c.step++
	// Between steps the process is stopped, and the runner holds its host
	// lock from its report until the next step: nothing may be waiting on
	// the channel. Anything there was forged, and ends the session.
	out, errp, ended := c.betweenSteps()
	if ended != nil {
		return ended
	}
	// Strings, numbers and the inputs, which the caller checked: encoding
	// cannot fail.
	base := c.stepBase()
	payload, _ := marshalFrame(&stepFrame{T: "step", Step: c.step, Code: st.Code, Name: st.Name, Argv: st.Argv, CPU: st.CPUSecs, Inputs: st.Inputs})
	o := c.turn(turnSpec{
		send: func() error {
			// The process is stopped. A frame that fits the socket's
			// buffer goes first, so that the process, once resumed, finds
			// it at once (one wake-up, not two); a larger one needs the
			// process reading.
			small := len(payload) < inlineFrame
			if !small {
				if err := c.signal(unix.SIGCONT); err != nil {
					rawClose(out[1])
					rawClose(errp[1])
					return err
				}
			}
			err := c.sendRaw(payload, []int{out[1], errp[1]})
			if err == nil && small {
				err = c.signal(unix.SIGCONT)
			}
			// The host's copies of the write ends, closed once the
			// process is on its way (it has its own in the frame): the
			// pipes reach end of file only when every copy is closed,
			// which the turn waits for after the report, never before.
			rawClose(out[1])
			rawClose(errp[1])
			if err == nil {
				// While the process runs the step.
				c.prepareStepPipes()
			}
			return err
		},
		timeout:   st.Timeout,
		maxOutput: st.MaxOutput,
		output:    st.Output,
		display:   st.Display,
		host:      st.Host,
		maxCalls:  st.MaxCalls,
		cpu:       st.CPUSecs,
		continued: true,
		ctx:       st.Ctx,
		interrupt: st.Interrupt,
	}, cancel)
	c.noteOOM(o)
	if !o.Alive {
		c.Close()
	}
	c.noteUsage(o, base, true)
	return o
}

// cpuTime returns the CPU time the child's process has used, all its
// threads together: the process's CPU clock, which anyone may read. Its
// pid is taken from the pidfd once (a reused pid could only make the
// pool read another process's clock; signals go through the pidfd).
func (c *Child) cpuTime() (time.Duration, error) {
	pid := c.Pid()
	if pid <= 0 {
		return 0, unix.ESRCH
	}
	var ts unix.Timespec
	if err := rawClockGettime(processCPUClock(pid), &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}

// processCPUClock is the clock of a process's CPU time (all its threads,
// the dead ones included): glibc's clock_getcpuclockid, which reading
// needs no permission.
func processCPUClock(pid int) int32 {
	const cpuClockSched = 2 // CPUCLOCK_SCHED: user and system time, in ns
	return int32(^uint32(pid)<<3) | cpuClockSched
}

// Exited waits up to d for the template to report that the child has
// exited (it is reaped then: none of its threads can act any more) and
// says whether it did.
func (c *Child) Exited(d time.Duration) bool { return c.waitStatus(d) != nil }

func (c *Child) waitStatus(d time.Duration) *ExitStatus {
	select {
	case st := <-c.exitCh:
		return &st
	case <-time.After(d):
		return nil
	}
}

// betweenSteps readies a live session process for its next turn (a step
// or a dump): nothing may be waiting on its channel between steps (the
// process is stopped, and its runner holds its host lock from its report
// until the next step; anything there was forged and ends the session),
// and the turn gets a fresh pair of output pipes, whose read ends become
// the child's. It returns the pipes, or the Outcome that ends the process.
func (c *Child) betweenSteps() (out, errp [2]int, o *Outcome) {
	msgs, partial, end, err := c.readFrames()
	switch {
	case len(msgs) > 0 || partial || err != nil:
		now := time.Now()
		c.Close()
		return out, errp, &Outcome{Started: true, Violation: "the session's process wrote on its control channel between steps", Start: now, End: now}
	case end:
		now := time.Now()
		c.Kill()
		o := &Outcome{Started: true, Start: now, Status: c.status}
		if o.Status == nil {
			o.Status = c.waitStatus(time.Second)
		}
		c.Close()
		o.End = time.Now()
		return out, errp, o
	}
	var ok bool
	if out, errp, ok = c.takeStepPipes(); !ok {
		out, errp, err = outputPipes()
	}
	if err != nil {
		c.Close()
		now := time.Now()
		return out, errp, &Outcome{Started: true, SetupError: "pipe: " + err.Error(), Start: now, End: now}
	}
	c.stdoutFd, c.stderrFd = out[0], errp[0]
	return out, errp, nil
}
