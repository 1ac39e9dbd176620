package worker

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/pynox/pynox/internal/pidfd"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/cgroup"
	"github.com/pynox/pynox/internal/frame"
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
	bell  *os.File
	// The output pipes' read ends. They are not registered with Go's poller
	// until the job has reported or has run for outputDelay, so a short
	// job's writes wake nothing on the host: on virtual machines, waking an
	// idle CPU costs the writer a noticeable fraction of a millisecond.
	stdoutFd int
	stderrFd int
	pidfd    int

	exitOnce sync.Once
	exitCh   chan ExitStatus

	killOnce   sync.Once
	ctlMu      sync.RWMutex // guards ctlFd: a closed descriptor number may be reused at once
	refillOnce sync.Once
	holdRefill atomic.Bool   // Close leaves the refill to RefillNow
	pidMu      sync.Mutex    // guards pidfd against a signal racing its close
	closed     chan struct{} // closed by Close
	kind       int           // kindDeny or kindAllow

	// The bell is read by one goroutine for the child's whole life; each
	// turn's watcher takes its rings from here.
	bellOnce   sync.Once
	rings      chan struct{} // a ring is pending
	bellClosed chan struct{} // the bell reached end of file
	rung       atomic.Int64  // bytes read from the bell: one ring each
	frames     int64         // whole frames read from the control socket
	pending    []byte        // control bytes read but not yet a whole frame
	rbuf       []byte        // read buffer of the control socket

	// Set by Run (and RunStep) only, between turns.
	session   bool
	functions map[string]bool
	step      int
	status    *ExitStatus // how the process ended, once known

	// The child's cgroup, set before the child is handed out (see
	// Template.deliver); cgErr says why joining one failed, which fails
	// every job the child is given.
	cg       *cgroup.Group
	cgErr    error
	cgMargin int64 // added to a job's allowance for its cgroup's memory limit
}

// newChild takes the spare's descriptors as the template sent them:
// control socket, stdout and stderr read ends, pidfd, bell read end. nsPid
// is the pid the template reported, in its own namespace.
func newChild(t *Template, nsPid, kind int, fds []int) (*Child, error) {
	for _, fd := range fds {
		unix.CloseOnExec(fd)
	}
	tv := unix.NsecToTimeval(ctlSendTimeout.Nanoseconds())
	err := unix.SetsockoptTimeval(fds[0], unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	for _, fd := range []int{fds[1], fds[2], fds[4]} {
		if err == nil {
			err = unix.SetNonblock(fd, true)
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
		bell:       os.NewFile(uintptr(fds[4]), "job-bell"),
		stdoutFd:   fds[1],
		stderrFd:   fds[2],
		pidfd:      fds[3],
		exitCh:     make(chan ExitStatus, 1),
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

// Kill sends SIGKILL through the child's pidfd, which cannot hit a reused
// pid.
func (c *Child) Kill() { c.signal(unix.SIGKILL) }

// signal sends sig through the pidfd unless Close has released it (its
// number may name another process's pidfd by now).
func (c *Child) signal(sig unix.Signal) error {
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	if c.pidfd < 0 {
		return unix.EBADF
	}
	return unix.PidfdSendSignal(c.pidfd, sig, nil, 0)
}

// Close kills the child, releases every host-side descriptor, and asks
// the template for the spare that replaces it. The replacement is forked
// only now, not when the child was taken, so that its fork and
// preparation do not compete with the job for the CPU.
func (c *Child) Close() {
	c.killOnce.Do(func() {
		c.Kill()
		close(c.closed)
		c.closeCtl()
		c.bell.Close()
		if c.stdoutFd >= 0 {
			unix.Close(c.stdoutFd)
			unix.Close(c.stderrFd)
		}
		c.pidMu.Lock()
		unix.Close(c.pidfd)
		c.pidfd = -1
		c.pidMu.Unlock()
		if c.cg != nil {
			// Released once the process has gone (retried until then).
			c.cg.Release()
		}
		if !c.tpl.onDemand && !c.holdRefill.Load() {
			c.refillOnce.Do(func() { c.tpl.refill(c.kind) })
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
	c.refillOnce.Do(func() { c.tpl.refill(c.kind) })
}

// Limits are the request-dependent rlimits of a job.
type Limits struct {
	Memory  int64 `json:"memory"` // address space on top of the template's
	Fsize   int64 `json:"fsize"`  // RLIMIT_FSIZE
	CPUSecs int64 `json:"cpu"`    // RLIMIT_CPU backstop
	// SessionCPU is a session's hard RLIMIT_CPU: the CPU time of its whole
	// life. Run sets it to SessionCPU when it is zero.
	SessionCPU int64 `json:"session_cpu,omitempty"`
}

// SessionCPU is the CPU time, in seconds, of a session's whole life: its
// hard RLIMIT_CPU. A process cannot raise its own hard limit (nor can the
// pool without CAP_SYS_RESOURCE, which root in a container often lacks),
// so a session's is set once, when it is confined, and bounds what its
// code can get by raising its soft limit and ignoring SIGXCPU. Each turn
// is held to its own allowance (its CPUSecs) by the pool, which reads the
// process's CPU clock while the turn runs. A session that reaches it is
// killed, and the next step starts a new process.
const SessionCPU = 3600

// Job is what a child needs to confine itself and run one piece of code.
type Job struct {
	Code    string            // source text
	Name    string            // file name for tracebacks
	Script  bool              // the code came from a script file (__file__ is set)
	Argv    []string          // sys.argv[1:]
	Env     map[string]string // added to the base environment
	Path    []string          // package dirs, first on sys.path
	Grants  []Grant           // Landlock rules beyond the runtime's
	Network bool
	Limits  Limits

	Timeout   time.Duration // killed after this long; 0 = no timeout
	MaxOutput int           // bytes kept of each of stdout and stderr

	// Session keeps the process and its __main__ after the code ends, for
	// RunStep.
	Session bool
	// Functions are the host functions the job may call (pynox_host).
	Functions []string
	Host      HostFunc // answers the calls of the first turn
	MaxCalls  int      // calls allowed per turn
}

// MaxCall bounds a host call's JSON arguments and its JSON result.
const MaxCall = 1 << 20

// Call is a host-function call a job made.
type Call struct {
	Function string
	Args     json.RawMessage // a JSON array
	Kwargs   json.RawMessage // a JSON object
}

// Reply answers a Call: a JSON result, or an error message that the job
// sees as pynox_host.HostError.
type Reply struct {
	Result json.RawMessage
	Error  *string
}

// HostFunc answers a job's host call. It runs on its own goroutine and
// must return soon after ctx ends (the turn ended: its reply is no longer
// wanted).
type HostFunc func(ctx context.Context, call Call) Reply

// Grant is one Landlock rule: an O_PATH descriptor the host opened and
// verified, and the rights it gives. Run sends the descriptor; the caller
// still owns it.
type Grant struct {
	Fd     int
	Access uint64
}

// ErrorInfo is the child's account of a Python exception.
type ErrorInfo struct {
	Type     string  `json:"type"`
	Message  string  `json:"message"`
	File     *string `json:"file"`
	Line     *int    `json:"line"`
	Errno    *int    `json:"errno,omitempty"`
	Filename *string `json:"filename,omitempty"`
}

// Outcome is everything the host learned about one job.
type Outcome struct {
	Started     bool        // the child confined itself and began running user code
	SetupError  string      // a confinement step failed; no user code ran
	Done        bool        // the child reported completion
	Exit        int         // exit status the child reported (when Done)
	Error       *ErrorInfo  // the exception the child reported (when Done)
	Status      *ExitStatus // how the process ended, when known
	TimedOut    bool        // killed at Job.Timeout
	CPUExceeded bool        // a session's turn killed for using more CPU time than its allowance
	Canceled    bool        // killed because the caller's cancel channel closed
	Violation   string      // the child broke the control protocol and was killed
	Stdout      []byte
	Stderr      []byte
	StdoutTrunc bool
	StderrTrunc bool
	Start       time.Time // when the job was handed to the child
	End         time.Time
	// Alive: the step ended and the session's process waits for the next.
	Alive bool
	Calls int // host calls the turn made
	// OOMKilled: the process died of SIGKILL and its cgroup's OOM counter
	// says the kernel killed it for exceeding its memory limit.
	OOMKilled bool
	// MemoryLimit is the memory limit of the child's cgroup in bytes; zero
	// without cgroups.
	MemoryLimit int64
}

type jobFrame struct {
	T       string            `json:"t"`
	Code    string            `json:"code"`
	Name    string            `json:"name"`
	Script  bool              `json:"script"`
	Argv    []string          `json:"argv"`
	Env     map[string]string `json:"env"`
	Path    []string          `json:"path"`
	Rules   []uint64          `json:"rules"`
	Network bool              `json:"network"`
	Limits  Limits            `json:"limits"`

	Session   bool     `json:"session,omitempty"`
	Step      int      `json:"step"`
	Functions []string `json:"functions,omitempty"`
}

type stepFrame struct {
	T    string   `json:"t"`
	Step int      `json:"step"`
	Code string   `json:"code"`
	Name string   `json:"name"`
	Argv []string `json:"argv"`
	CPU  int64    `json:"cpu"`
}

type replyFrame struct {
	T      string          `json:"t"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *string         `json:"error,omitempty"`
}

type childMsg struct {
	T     string     `json:"t"`
	Msg   string     `json:"msg"`
	Exit  *int       `json:"exit"`
	Error *ErrorInfo `json:"error"`
	Step  int        `json:"step"`
	Final bool       `json:"final"`

	Function string          `json:"function"`
	Args     json.RawMessage `json:"args"`
	Kwargs   json.RawMessage `json:"kwargs"`
}

// outputDelay is how long a job runs before the host starts reading its
// output as it comes; see Child.stdoutFd.
const outputDelay = 2 * time.Millisecond

// ctlSendTimeout bounds a write to a child's control socket: a spare that
// does not take its job within it is treated as dead.
const ctlSendTimeout = 5 * time.Second

// ctlPollInterval is how often the host reads the control socket of a
// child whose code closed its bell.
const ctlPollInterval = 5 * time.Millisecond

// inlineFrame is a frame size that always fits a control socket's buffer
// (a Unix socket's is 200 KiB and more by default): a write of that much
// never waits for the reader. runner.py's INLINE_FRAME is the same.
const inlineFrame = 32 << 10

// drainTimeout bounds the wait for a finished job's output pipes to close.
const drainTimeout = 2 * time.Second

// maxCtlFrame bounds one frame from a child: a child is hostile once user
// code runs, so it gets no more room than an honest report or host call
// needs.
const maxCtlFrame = MaxCall + 64<<10

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// sink keeps at most max bytes of a stream and counts the rest as
// truncated.
type sink struct {
	max   int
	keep  []byte
	trunc bool
}

func (k *sink) add(p []byte) {
	room := k.max - len(k.keep)
	if room > 0 {
		k.keep = append(k.keep, p[:min(len(p), room)]...)
	}
	if len(p) > room {
		k.trunc = true
	}
}

func (k *sink) result() []byte {
	if k.trunc {
		return trimUTF8(k.keep)
	}
	return k.keep
}

// drainNow reads what a non-blocking pipe holds now, reporting whether it
// reached end of file.
func drainNow(fd int, k *sink) (eof bool) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	for {
		n, err := unix.Read(fd, *bp)
		if n > 0 {
			k.add((*bp)[:n])
			continue
		}
		if err == unix.EINTR {
			continue
		}
		return err == nil // 0 bytes without error: end of file
	}
}

// capture reads f to EOF into k.
func capture(f *os.File, k *sink, wg *sync.WaitGroup) {
	defer wg.Done()
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	for {
		n, err := f.Read(*bp)
		if n > 0 {
			k.add((*bp)[:n])
		}
		if err != nil {
			return
		}
	}
}

// trimUTF8 drops a multi-byte character cut in half at the end of b.
func trimUTF8(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			return b
		}
	}
	return b
}

// Run hands job to the child and waits for its outcome: until the child
// reports completion and its output pipes close, or it dies, times out, or
// cancel closes. The child is always dead when Run returns, unless the job
// is a session whose process lives on (Outcome.Alive): then the next
// steps go to RunStep, and Close ends it.
func (c *Child) Run(job *Job, cancel <-chan struct{}) *Outcome {
	f := jobFrame{T: "job", Code: job.Code, Name: job.Name, Script: job.Script, Argv: job.Argv,
		Env: job.Env, Path: job.Path, Network: job.Network, Limits: job.Limits,
		Session: job.Session, Step: 1, Functions: job.Functions}
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
		return &Outcome{SetupError: err.Error(), Start: now, End: now}
	}
	o := c.turn(turnSpec{
		send:      func() error { return c.sendFrame(&f, fds) },
		timeout:   job.Timeout,
		maxOutput: job.MaxOutput,
		host:      job.Host,
		maxCalls:  job.MaxCalls,
		cpu:       cpu,
	}, cancel)
	c.noteOOM(o)
	if !o.Alive {
		c.Close()
	}
	return o
}

// Step is one later piece of code for a session's process.
type Step struct {
	Code      string
	Name      string
	Argv      []string
	Timeout   time.Duration
	MaxOutput int
	CPUSecs   int64    // the step's CPU-time backstop
	Host      HostFunc // answers the step's host calls
	MaxCalls  int
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
	msgs, partial, end, err := c.readFrames()
	switch {
	case len(msgs) > 0 || partial || err != nil:
		now := time.Now()
		c.Close()
		return &Outcome{Started: true, Violation: "the session's process wrote on its control channel between steps", Start: now, End: now}
	case end:
		now := time.Now()
		c.Kill()
		o := &Outcome{Started: true, Start: now}
		o.Status = c.status
		if o.Status == nil {
			o.Status = c.waitStatus(time.Second)
		}
		c.Close()
		o.End = time.Now()
		return o
	}

	out, errp, err := outputPipes()
	if err != nil {
		c.Close()
		now := time.Now()
		return &Outcome{Started: true, SetupError: "pipe: " + err.Error(), Start: now, End: now}
	}
	c.stdoutFd, c.stderrFd = out[0], errp[0]
	// Strings and numbers only: encoding cannot fail.
	payload, _ := json.Marshal(&stepFrame{T: "step", Step: c.step, Code: st.Code, Name: st.Name, Argv: st.Argv, CPU: st.CPUSecs})
	o := c.turn(turnSpec{
		send: func() error {
			// The process is stopped. A frame that fits the socket's
			// buffer goes first, so that the process, once resumed, finds
			// it at once (one wake-up, not two); a larger one needs the
			// process reading.
			small := len(payload) < inlineFrame
			if !small {
				if err := c.signal(unix.SIGCONT); err != nil {
					unix.Close(out[1])
					unix.Close(errp[1])
					return err
				}
			}
			err := c.sendRaw(payload, []int{out[1], errp[1]})
			unix.Close(out[1])
			unix.Close(errp[1])
			if err == nil && small {
				err = c.signal(unix.SIGCONT)
			}
			return err
		},
		timeout:   st.Timeout,
		maxOutput: st.MaxOutput,
		host:      st.Host,
		maxCalls:  st.MaxCalls,
		cpu:       st.CPUSecs,
		continued: true,
	}, cancel)
	c.noteOOM(o)
	if !o.Alive {
		c.Close()
	}
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
	if err := unix.ClockGettime(processCPUClock(pid), &ts); err != nil {
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

// outputPipes makes a step's stdout and stderr pipes; their read ends
// are non-blocking.
func outputPipes() (out, errp [2]int, err error) {
	if err = unix.Pipe2(out[:], unix.O_CLOEXEC); err != nil {
		return out, errp, err
	}
	if err = unix.Pipe2(errp[:], unix.O_CLOEXEC); err != nil {
		unix.Close(out[0])
		unix.Close(out[1])
		return out, errp, err
	}
	unix.SetNonblock(out[0], true)
	unix.SetNonblock(errp[0], true)
	return out, errp, nil
}

// turnSpec is what differs between a job's first turn and a session's
// later steps.
type turnSpec struct {
	send      func() error // hands the code over
	timeout   time.Duration
	maxOutput int
	host      HostFunc
	maxCalls  int
	continued bool // a later step: the process was already running user code
	// cpu is a session turn's CPU time in seconds: the turn is killed when
	// it has used a second more (as by a one-shot job's hard RLIMIT_CPU).
	// Zero for one-shot jobs, whose own hard RLIMIT_CPU does it.
	cpu int64
}

// pendingCall is a host call the turn is waiting on.
type pendingCall struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// turn hands one piece of code to the child and waits for its outcome.
// Everything happens on the calling goroutine but the bell's reader, the
// output pipes' readers (only for output that outlives the report, or a
// job that runs longer than outputDelay) and host calls.
func (c *Child) turn(ts turnSpec, cancel <-chan struct{}) *Outcome {
	o := &Outcome{Started: ts.continued}

	// Output capture starts when the job reports, ends, or has run for
	// outputDelay; until then the pipes (64 KiB and more each) hold it.
	// When it starts, what the pipes hold is read at once; only a pipe
	// that is still open gets a reader goroutine.
	outSink := sink{max: ts.maxOutput}
	errSink := sink{max: ts.maxOutput}
	var pipes <-chan struct{} // closed when both pipes reached EOF; nil until capture starts
	var outFiles []*os.File
	capturing := false
	startCapture := func() {
		if capturing {
			return
		}
		capturing = true
		outFd, errFd := c.stdoutFd, c.stderrFd
		c.stdoutFd, c.stderrFd = -1, -1
		outEOF := drainNow(outFd, &outSink)
		errEOF := drainNow(errFd, &errSink)
		closed := make(chan struct{})
		pipes = closed
		if outEOF && errEOF {
			unix.Close(outFd)
			unix.Close(errFd)
			close(closed)
			return
		}
		stdout := os.NewFile(uintptr(outFd), "job-stdout")
		stderr := os.NewFile(uintptr(errFd), "job-stderr")
		outFiles = []*os.File{stdout, stderr}
		var wg sync.WaitGroup
		wg.Add(2)
		go capture(stdout, &outSink, &wg)
		go capture(stderr, &errSink, &wg)
		go func() {
			wg.Wait()
			stdout.Close()
			stderr.Close()
			close(closed)
		}()
	}
	finishOutput := func() {
		o.Stdout, o.StdoutTrunc = outSink.result(), outSink.trunc
		o.Stderr, o.StderrTrunc = errSink.result(), errSink.trunc
	}
	captureTimer := time.NewTimer(outputDelay)
	defer captureTimer.Stop()

	o.Start = time.Now()
	if err := ts.send(); err != nil {
		// The child died before it could take the code.
		c.Kill()
		startCapture()
		<-pipes
		finishOutput()
		o.Status = c.waitStatus(time.Second)
		o.End = time.Now()
		return o
	}

	var timer <-chan time.Time
	if ts.timeout > 0 {
		t := time.NewTimer(ts.timeout)
		defer t.Stop()
		timer = t.C
	}
	// A session's turn is held to its CPU time from here (its hard
	// RLIMIT_CPU is the session's whole life's): the process's CPU clock
	// is read when the turn could have used up what is left of it on
	// every CPU at once, and at least once a second.
	var cpuBase, cpuMax time.Duration
	var cpuCheck <-chan time.Time
	var cpuTimer *time.Timer
	armCPU := func(used time.Duration) {
		wait := (cpuMax - used) / time.Duration(runtime.NumCPU())
		wait = min(max(wait, 10*time.Millisecond), time.Second)
		if cpuTimer == nil {
			cpuTimer = time.NewTimer(wait)
		} else {
			cpuTimer.Reset(wait)
		}
		cpuCheck = cpuTimer.C
	}
	defer func() {
		if cpuTimer != nil {
			cpuTimer.Stop()
		}
	}()
	cpuBaseErr := error(nil)
	if ts.cpu > 0 {
		cpuMax = time.Duration(ts.cpu+1) * time.Second
		if cpuBase, cpuBaseErr = c.cpuTime(); cpuBaseErr == nil {
			armCPU(0)
		}
	}
	killed := false
	kill := func() {
		if !killed {
			killed = true
			c.Kill()
		}
	}
	violation := func(msg string) {
		if o.Violation == "" && !o.Done {
			o.Violation = msg
		}
		kill()
	}
	if cpuBaseErr != nil {
		// Without it the turn could not be held to its CPU time.
		o.SetupError = "the session's CPU time cannot be read: " + cpuBaseErr.Error()
		kill()
	}

	// Host calls: at most one at a time (the child's runner takes turns);
	// the handler runs on its own goroutine so that timeouts still apply.
	var call *pendingCall
	replies := make(chan Reply, 1)
	endCall := func() {
		if call != nil {
			call.cancel()
			call = nil
		}
	}
	defer endCall()
	answer := func(r Reply) {
		b, err := json.Marshal(replyFrame{T: "reply", Result: r.Result, Error: r.Error})
		if err != nil {
			msg := "the host's reply could not be encoded: " + err.Error()
			b, _ = json.Marshal(replyFrame{T: "reply", Error: &msg})
		}
		if len(b) < inlineFrame {
			// It fits the socket's buffer, so the write does not wait for
			// the child to read.
			if err := c.sendRaw(b, nil); err != nil {
				kill()
			}
			return
		}
		// A large one may need the child to read as it goes: its write
		// must not hold up the timer.
		go func() {
			if err := c.sendRaw(b, nil); err != nil {
				c.Kill()
			}
		}()
	}
	refuse := func(msg string) { answer(Reply{Error: &msg}) }

	handle := func(m *childMsg) {
		switch {
		case m.T == "started" && !o.Started && o.SetupError == "":
			o.Started = true
		case m.T == "setup_error" && !o.Started && o.SetupError == "":
			o.SetupError = m.Msg
			if o.SetupError == "" {
				o.SetupError = "confinement failed"
			}
		case m.T == "done" && o.Started && !o.Done && m.Exit != nil && m.Step == c.step && call == nil:
			o.Done = true
			o.Exit = *m.Exit
			o.Error = m.Error
			timer = nil
			if c.session && !m.Final {
				o.Alive = true
			} else {
				// Nothing the child does after reporting can matter.
				kill()
			}
		case m.T == "call" && o.Started && !o.Done && call == nil && m.Step == c.step:
			o.Calls++
			switch {
			case !c.functions[m.Function]:
				// A call to an undeclared name never reaches the host.
				refuse(fmt.Sprintf("no host function named %q", m.Function))
			case ts.host == nil:
				refuse("no host answers calls for this job")
			case o.Calls > ts.maxCalls:
				refuse(fmt.Sprintf("this job made more than %d host calls", ts.maxCalls))
			case !jsonIs(m.Args, '[') || (len(m.Kwargs) > 0 && !jsonIs(m.Kwargs, '{') && string(m.Kwargs) != "null"):
				violation("malformed host call")
			case len(m.Args)+len(m.Kwargs) > MaxCall:
				refuse(fmt.Sprintf("the arguments are %d bytes of JSON; the limit is %d", len(m.Args)+len(m.Kwargs), MaxCall))
			default:
				// What the job wrote goes to the host, and in `pynox pool`
				// onto the client's stream, only if every client can read it.
				if err := cmp.Or(checkCallJSON(m.Args), checkCallJSON(m.Kwargs)); err != nil {
					refuse(fmt.Sprintf("the arguments to %s cannot be passed on: %v", m.Function, err))
					break
				}
				ctx, cancel := context.WithCancel(context.Background())
				pc := &pendingCall{ctx: ctx, cancel: cancel}
				call = pc
				cl := Call{Function: m.Function, Args: m.Args, Kwargs: m.Kwargs}
				if len(cl.Kwargs) == 0 || string(cl.Kwargs) == "null" {
					cl.Kwargs = json.RawMessage("{}")
				}
				go func() {
					r := ts.host(pc.ctx, cl)
					select {
					case replies <- r:
					case <-pc.ctx.Done():
					}
				}()
			}
		case o.Done && !o.Alive:
			// Whatever follows its report is ignored; it is being killed.
		default:
			violation(fmt.Sprintf("unexpected %q frame on the control channel", m.T))
		}
	}

	// The control channel is read when the bell rings, and polled once the
	// bell is closed (the child exited, or its code closed the bell) or a
	// frame is arriving in parts.
	c.bellOnce.Do(func() { go c.readBell() })
	ctlOpen := true
	var poll <-chan time.Time
	var ticker *time.Ticker
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	startPoll := func() {
		if ticker == nil {
			ticker = time.NewTicker(ctlPollInterval)
			poll = ticker.C
		}
	}
	bellClosed := c.bellClosed
	readCtl := func() {
		if !ctlOpen {
			return
		}
		msgs, partial, end, err := c.readFrames()
		for i := range msgs {
			handle(&msgs[i])
		}
		if partial {
			startPoll()
		}
		if end {
			ctlOpen = false
			poll = nil
			if err != nil && !o.Done && !killed {
				violation(err.Error())
			}
			if o.Alive {
				// The session's process closed its channel after its
				// report: it is not alive after all.
				o.Alive = false
				kill()
			}
		}
	}

	exitCh := c.exitCh
	if c.status != nil {
		exitCh = nil
		o.Status = c.status
	}
	pipesDone := false
	var drain <-chan time.Time
	for {
		// The result is complete once the output pipes are closed and the
		// outcome is known: the child's own report, a kill of ours, or —
		// for a child that ended without reporting — its exit status. A
		// reported or killed child's teardown is not waited for.
		known := o.Done || o.SetupError != "" || o.Violation != "" || o.TimedOut || o.CPUExceeded || o.Canceled || (!ctlOpen && o.Status != nil)
		if known {
			startCapture()
			if !pipesDone && isClosed(pipes) {
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
					ctlOpen = false
					poll = nil
				}
				// The child is dead or being killed, or a session between
				// steps, so its pipes close soon; a job that smuggled their
				// ends elsewhere gets its output cut off rather than
				// hanging the worker.
				t := time.NewTimer(drainTimeout)
				defer t.Stop()
				drain = t.C
			}
		}
		var pipesWait <-chan struct{}
		if !pipesDone {
			pipesWait = pipes
		}
		var rings <-chan struct{}
		if ctlOpen {
			rings = c.rings
		}
		select {
		case <-captureTimer.C:
			startCapture()
		case <-rings:
			readCtl()
			if n := c.rung.Load(); n > 2*c.frames+spareRings {
				violation(fmt.Sprintf("it rang its bell (descriptor 4) %d times but wrote %d frames on its control channel; the limit is two rings per frame and %d more", n, c.frames, spareRings))
			}
		case <-bellClosed:
			bellClosed = nil
			startPoll()
			readCtl()
		case <-poll:
			readCtl()
		case r := <-replies:
			if call == nil {
				continue
			}
			call.cancel() // the handler is done
			call = nil
			if r.Error == nil && len(r.Result) > MaxCall {
				msg := fmt.Sprintf("the host's result is %d bytes of JSON; the limit is %d", len(r.Result), MaxCall)
				r = Reply{Error: &msg}
			}
			answer(r)
		case <-pipesWait:
			pipesDone = true
		case <-drain:
			for _, f := range outFiles {
				f.Close()
			}
			<-pipes
			pipesDone = true
		case st, ok := <-exitCh:
			exitCh = nil
			if ok {
				o.Status = &st
				c.status = &st
				o.Alive = false
			}
		case <-timer:
			timer = nil
			if !o.Done {
				o.TimedOut = true
				kill()
			}
		case <-cpuCheck:
			cpuCheck = nil
			if o.Done || killed {
				continue
			}
			now, err := c.cpuTime()
			switch {
			case err != nil:
				// The process is gone: its end is on its way.
			case now-cpuBase > cpuMax:
				o.CPUExceeded = true
				kill()
			default:
				armCPU(now - cpuBase)
			}
		case <-cancel:
			cancel = nil
			if !o.Done {
				o.Canceled = true
				kill()
			}
		}
	}
	finishOutput()
	if o.Alive && (killed || c.status != nil) {
		o.Alive = false
	}
	if o.Alive {
		// A session's process does not run between steps: its threads
		// neither burn CPU nor write anything until the next step.
		if err := c.signal(unix.SIGSTOP); err != nil {
			o.Alive = false
			kill()
		}
	}
	o.End = time.Now()
	return o
}

// MaxCallDepth bounds how deeply a host call's arguments nest (arrays and
// objects): Python's json module, in the client that answers the call,
// fails on a line nested some thousand levels deep.
const MaxCallDepth = 256

// MaxCallNumber bounds the length of a number in a host call's arguments:
// CPython refuses to convert an integer of more than 4,300 digits by
// default, so its json module fails on the line that holds one.
const MaxCallNumber = 4300

// checkCallJSON checks JSON that Go has already found valid (a call's
// arguments, written by the job) against what every client can decode:
// valid UTF-8, at most MaxCallDepth levels, numbers of at most
// MaxCallNumber characters, and no object that repeats a key (which
// parsers read differently). Honest calls pass: the runner encodes them
// with Python's json module, as ASCII, from Python lists and dicts.
func checkCallJSON(raw json.RawMessage) error {
	if !utf8.Valid(raw) {
		// Outside its strings JSON is ASCII: the bad bytes are in a string.
		return errors.New("a string is not valid UTF-8")
	}
	depth, num := 0, 0
	inString, escaped := false, false
	for _, ch := range raw {
		if inString {
			switch {
			case escaped:
				escaped = false
			case ch == '\\':
				escaped = true
			case ch == '"':
				inString = false
			}
			continue
		}
		if ch == '-' || ch == '+' || ch == '.' || ch == 'e' || ch == 'E' || ('0' <= ch && ch <= '9') {
			// Outside strings these bytes belong to numbers only (the
			// literals true, false and null aside, which are short).
			if num++; num > MaxCallNumber {
				return fmt.Errorf("a number is longer than %d characters", MaxCallNumber)
			}
			continue
		}
		num = 0
		switch ch {
		case '"':
			inString = true
		case '[', '{':
			if depth++; depth > MaxCallDepth {
				return fmt.Errorf("they nest deeper than %d levels", MaxCallDepth)
			}
		case ']', '}':
			depth--
		}
	}
	if key, ok := repeatedKey(raw); ok {
		return fmt.Errorf("an object repeats the key %q (parsers disagree on which value counts)", key)
	}
	return nil
}

// repeatedKey reports the first key that an object in raw (valid JSON)
// holds twice, compared as decoded: Python's json and encoding/json keep
// the last of two equal keys, other parsers the first, so a host that
// vets arguments with one and acts with another would be bypassed.
func repeatedKey(raw json.RawMessage) (string, bool) {
	type level struct {
		keys    map[string]struct{} // nil for an array
		wantKey bool
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var stack []level
	// done marks the end of a value: its object then expects a key.
	done := func() {
		if n := len(stack); n > 0 && stack[n-1].keys != nil {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false // io.EOF; raw was checked valid before
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				stack = append(stack, level{keys: map[string]struct{}{}, wantKey: true})
			case '[':
				stack = append(stack, level{})
			default:
				stack = stack[:len(stack)-1]
				done()
			}
		case string:
			if n := len(stack); n > 0 && stack[n-1].keys != nil && stack[n-1].wantKey {
				if _, dup := stack[n-1].keys[v]; dup {
					return v, true
				}
				stack[n-1].keys[v] = struct{}{}
				stack[n-1].wantKey = false
				continue
			}
			done()
		default:
			done()
		}
	}
}

// jsonIs reports whether raw is a JSON value starting with the byte b ('['
// for an array, '{' for an object).
func jsonIs(raw json.RawMessage, b byte) bool {
	for _, ch := range raw {
		switch ch {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return ch == b
	}
	return false
}

func (c *Child) waitStatus(d time.Duration) *ExitStatus {
	select {
	case st := <-c.exitCh:
		return &st
	case <-time.After(d):
		return nil
	}
}

// sendFrame writes one JSON frame to the child, with descriptors.
func (c *Child) sendFrame(v any, fds []int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.sendRaw(b, fds)
}

// sendRaw writes one frame holding payload to the child. Reads and writes
// may overlap; only closing the socket excludes both.
func (c *Child) sendRaw(payload []byte, fds []int) error {
	buf := frame.Append(make([]byte, 0, len(payload)+frame.HeaderSize), payload)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	c.ctlMu.RLock()
	defer c.ctlMu.RUnlock()
	if c.ctlFd < 0 {
		return unix.EBADF
	}
	n, err := unix.SendmsgN(c.ctlFd, buf, oob, nil, unix.MSG_NOSIGNAL)
	for err == nil && n < len(buf) {
		var m int
		m, err = unix.SendmsgN(c.ctlFd, buf[n:], nil, nil, unix.MSG_NOSIGNAL)
		n += m
	}
	return err
}

// recvCtl reads what the control socket holds now, without blocking.
// A closed socket reads as end of file.
func (c *Child) recvCtl(buf []byte) (int, error) {
	c.ctlMu.RLock()
	defer c.ctlMu.RUnlock()
	if c.ctlFd < 0 {
		return 0, nil
	}
	n, _, err := unix.Recvfrom(c.ctlFd, buf, unix.MSG_DONTWAIT)
	return n, err
}

// closeCtl closes the control socket once; any descriptors a job queued
// on it are freed with it.
func (c *Child) closeCtl() {
	c.ctlMu.Lock()
	defer c.ctlMu.Unlock()
	if c.ctlFd >= 0 {
		unix.Close(c.ctlFd)
		c.ctlFd = -1
	}
}

// bellRead is how much readBell takes from the bell at once: a job that
// floods its bell is found out on the first read, not after thousands.
const bellRead = 4 << 10

// spareRings is how many more rings than twice its whole frames a child
// may make before it is killed for ringing without writing frames. The
// runner rings once per frame, and twice for a frame too large for the
// socket's buffer (after its header, and after the rest); a ring may also
// find its frame already read with the one before it. An honest child
// never comes near it; a flood of its bell passes it in one read.
const spareRings = 256

// readBell turns the bell's bytes into rings, for the child's whole
// life, and closes bellClosed at its end of file. It reads in bulk and
// counts each byte as a ring (Child.rung); the turn compares the count
// with the frames the rings brought.
func (c *Child) readBell() {
	defer close(c.bellClosed)
	buf := make([]byte, bellRead)
	for {
		n, err := c.bell.Read(buf)
		c.rung.Add(int64(n))
		if err != nil {
			return
		}
		select {
		case c.rings <- struct{}{}:
		default: // a ring is pending already
		}
	}
}

// readFrames reads what the control socket holds now and returns the whole
// frames in it. partial reports the start of a frame still arriving; end
// that the channel ended, with err saying why when it was not clean.
func (c *Child) readFrames() (msgs []childMsg, partial, end bool, err error) {
	if c.rbuf == nil {
		c.rbuf = make([]byte, 32<<10)
	}
	tmp := c.rbuf
	eof := false
	for {
		n, rerr := c.recvCtl(tmp)
		if rerr == unix.EINTR {
			continue
		}
		if rerr != nil || n == 0 {
			eof = rerr == nil || (rerr != unix.EAGAIN && rerr != unix.EWOULDBLOCK)
			break
		}
		c.pending = append(c.pending, tmp[:n]...)
		if len(c.pending) > maxCtlFrame+frame.HeaderSize {
			break
		}
	}
	for {
		payload, rest, ok, ferr := frame.Split(c.pending, maxCtlFrame)
		if ferr != nil {
			return msgs, false, true, ferr
		}
		if !ok {
			break
		}
		var m childMsg
		if jerr := json.Unmarshal(payload, &m); jerr != nil {
			return msgs, false, true, fmt.Errorf("malformed control frame: %v", jerr)
		}
		c.pending = rest
		c.frames++
		msgs = append(msgs, m)
	}
	if eof {
		if len(c.pending) > 0 {
			return msgs, false, true, errors.New("control channel cut inside a frame")
		}
		return msgs, false, true, nil
	}
	return msgs, len(c.pending) > 0, false, nil
}
