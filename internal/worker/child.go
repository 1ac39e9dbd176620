package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

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
	Pid int
	tpl *Template
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
	ctlMu      sync.Mutex // guards ctlFd: a closed descriptor number may be reused at once
	refillOnce sync.Once
	closed     chan struct{} // closed by Close
	kind       int           // kindDeny or kindAllow
}

// newChild takes the spare's descriptors as the template sent them:
// control socket, stdout and stderr read ends, pidfd, bell read end.
func newChild(t *Template, pid, kind int, fds []int) (*Child, error) {
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
		Pid:      pid,
		tpl:      t,
		ctlFd:    fds[0],
		bell:     os.NewFile(uintptr(fds[4]), "job-bell"),
		stdoutFd: fds[1],
		stderrFd: fds[2],
		pidfd:    fds[3],
		exitCh:   make(chan ExitStatus, 1),
		closed:   make(chan struct{}),
		kind:     kind,
	}, nil
}

func (c *Child) exited(st ExitStatus) {
	c.exitOnce.Do(func() {
		c.exitCh <- st
		close(c.exitCh)
	})
}

// Kill sends SIGKILL through the child's pidfd, which cannot hit a reused
// pid.
func (c *Child) Kill() {
	_ = unix.PidfdSendSignal(c.pidfd, unix.SIGKILL, nil, 0)
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
		unix.Close(c.pidfd)
		c.refillOnce.Do(func() { c.tpl.refill(c.kind) })
	})
}

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
}

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
}

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
	Canceled    bool        // killed because the caller's cancel channel closed
	Violation   string      // the child broke the control protocol and was killed
	Stdout      []byte
	Stderr      []byte
	StdoutTrunc bool
	StderrTrunc bool
	Start       time.Time // when the job was handed to the child
	End         time.Time
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
}

type childMsg struct {
	T     string     `json:"t"`
	Msg   string     `json:"msg"`
	Exit  *int       `json:"exit"`
	Error *ErrorInfo `json:"error"`
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

// drainTimeout bounds the wait for a finished job's output pipes to close.
const drainTimeout = 2 * time.Second

// maxCtlFrame bounds one frame from a child: a child is hostile once user
// code runs, so it gets no more room than an honest report needs.
const maxCtlFrame = 64 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// capture reads f to EOF, keeping at most max bytes and discarding the rest.
func capture(f *os.File, max int, out *[]byte, trunc *bool, wg *sync.WaitGroup) {
	defer wg.Done()
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var keep []byte
	for {
		n, err := f.Read(buf)
		if n > 0 {
			room := max - len(keep)
			if room > 0 {
				take := n
				if take > room {
					take = room
				}
				keep = append(keep, buf[:take]...)
			}
			if n > room {
				*trunc = true
			}
		}
		if err != nil {
			break
		}
	}
	if *trunc {
		keep = trimUTF8(keep)
	}
	*out = keep
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
// cancel closes. The child is always dead when Run returns.
func (c *Child) Run(job *Job, cancel <-chan struct{}) *Outcome {
	o := &Outcome{}
	defer c.Close()

	// Output capture starts when the job reports, ends, or has run for
	// outputDelay; until then the pipes (64 KiB and more each) hold it.
	var pipes <-chan struct{} // closed when both pipes reached EOF; nil until capture starts
	var outFiles []*os.File
	startCapture := func() {
		if pipes != nil {
			return
		}
		stdout := os.NewFile(uintptr(c.stdoutFd), "job-stdout")
		stderr := os.NewFile(uintptr(c.stderrFd), "job-stderr")
		c.stdoutFd, c.stderrFd = -1, -1
		outFiles = []*os.File{stdout, stderr}
		var wg sync.WaitGroup
		wg.Add(2)
		go capture(stdout, job.MaxOutput, &o.Stdout, &o.StdoutTrunc, &wg)
		go capture(stderr, job.MaxOutput, &o.Stderr, &o.StderrTrunc, &wg)
		closed := make(chan struct{})
		go func() {
			wg.Wait()
			stdout.Close()
			stderr.Close()
			close(closed)
		}()
		pipes = closed
	}
	captureTimer := time.NewTimer(outputDelay)
	defer captureTimer.Stop()

	f := jobFrame{T: "job", Code: job.Code, Name: job.Name, Script: job.Script, Argv: job.Argv,
		Env: job.Env, Path: job.Path, Network: job.Network, Limits: job.Limits}
	fds := make([]int, len(job.Grants))
	f.Rules = make([]uint64, len(job.Grants))
	for i, g := range job.Grants {
		fds[i] = g.Fd
		f.Rules[i] = g.Access
	}
	o.Start = time.Now()
	if err := c.sendJob(&f, fds); err != nil {
		// The child died before it could take the job: no user code ran.
		c.Kill()
		startCapture()
		<-pipes
		o.Status = c.waitStatus(time.Second)
		o.End = time.Now()
		return o
	}

	events := make(chan ctlEvent, 16)
	go c.watchCtl(events)

	var timer <-chan time.Time
	if job.Timeout > 0 {
		t := time.NewTimer(job.Timeout)
		defer t.Stop()
		timer = t.C
	}
	killed := false
	kill := func() {
		if !killed {
			killed = true
			c.Kill()
		}
	}
	exitCh := c.exitCh
	pipesDone := false
	var drain <-chan time.Time
	for {
		// The result is complete once the output pipes are closed and the
		// outcome is known: the child's own report, a kill of ours, or —
		// for a child that ended without reporting — its exit status. A
		// reported or killed child's teardown is not waited for.
		known := o.Done || o.SetupError != "" || o.Violation != "" || o.TimedOut || o.Canceled || (events == nil && o.Status != nil)
		if known {
			startCapture()
			if pipesDone {
				break
			}
			if drain == nil {
				// Nothing more is read from the control socket. Closing it
				// also frees any descriptors the job queued on it (its own
				// pipe ends, say), which would keep the pipes open.
				c.closeCtl()
				events = nil
				// The child is dead or being killed, so its pipes close
				// soon; a job that smuggled their ends elsewhere gets its
				// output cut off rather than hanging the worker.
				t := time.NewTimer(drainTimeout)
				defer t.Stop()
				drain = t.C
			}
		}
		var pipesWait <-chan struct{}
		if !pipesDone {
			pipesWait = pipes
		}
		select {
		case <-captureTimer.C:
			startCapture()
		case ev := <-events:
			if ev.end {
				events = nil
				if ev.err != nil && o.Violation == "" && !o.Done && !killed {
					o.Violation = ev.err.Error()
					kill()
				}
				continue
			}
			m := ev.msg
			switch {
			case m.T == "started" && !o.Started && o.SetupError == "":
				o.Started = true
			case m.T == "setup_error" && !o.Started && o.SetupError == "":
				o.SetupError = m.Msg
				if o.SetupError == "" {
					o.SetupError = "confinement failed"
				}
			case m.T == "done" && o.Started && !o.Done && m.Exit != nil:
				o.Done = true
				o.Exit = *m.Exit
				o.Error = m.Error
				// Nothing the child does after reporting can matter.
				kill()
				timer = nil
			case o.Done:
				// Whatever follows its report is ignored; it is being killed.
			default:
				if o.Violation == "" {
					o.Violation = fmt.Sprintf("unexpected %q frame on the control channel", m.T)
				}
				kill()
			}
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
			}
		case <-timer:
			timer = nil
			if !o.Done {
				o.TimedOut = true
				kill()
			}
		case <-cancel:
			cancel = nil
			if !o.Done {
				o.Canceled = true
				kill()
			}
		}
	}
	o.End = time.Now()
	return o
}

func (c *Child) waitStatus(d time.Duration) *ExitStatus {
	select {
	case st := <-c.exitCh:
		return &st
	case <-time.After(d):
		return nil
	}
}

func (c *Child) sendJob(f *jobFrame, fds []int) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	buf := frame.Append(make([]byte, 0, len(b)+frame.HeaderSize), b)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	c.ctlMu.Lock()
	defer c.ctlMu.Unlock()
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
	c.ctlMu.Lock()
	defer c.ctlMu.Unlock()
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

type ctlEvent struct {
	msg childMsg
	err error // why the channel ended, nil for a clean close
	end bool  // the channel ended; no more events follow
}

// watchCtl delivers the child's frames: it reads the control socket
// whenever the bell rings, and when the bell closes (the child exited, or
// its code closed the bell) it falls back to polling the socket until it
// ends.
func (c *Child) watchCtl(events chan<- ctlEvent) {
	rings := make(chan bool, 1) // true: the bell is closed
	go func() {
		buf := make([]byte, 64)
		for {
			_, err := c.bell.Read(buf)
			closed := err != nil
			select {
			case rings <- closed:
			default:
				if closed {
					// A pending ring is being handled; make sure the close
					// is seen after it.
					select {
					case rings <- true:
					case <-c.closed:
					}
				}
			}
			if closed {
				return
			}
		}
	}()
	var pending []byte
	tmp := make([]byte, 32<<10)
	var poll <-chan time.Time
	for {
		select {
		case closed := <-rings:
			if closed && poll == nil {
				t := time.NewTicker(ctlPollInterval)
				defer t.Stop()
				poll = t.C
			}
		case <-poll:
		case <-c.closed:
			return
		}
		// Read everything the socket holds now.
		eof := false
		for {
			n, err := c.recvCtl(tmp)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n == 0 {
				eof = err == nil || (err != unix.EAGAIN && err != unix.EWOULDBLOCK)
				break
			}
			pending = append(pending, tmp[:n]...)
			if len(pending) > maxCtlFrame+frame.HeaderSize {
				break
			}
		}
		for {
			payload, rest, ok, err := frame.Split(pending, maxCtlFrame)
			if err != nil {
				c.emit(events, ctlEvent{err: err, end: true})
				return
			}
			if !ok {
				break
			}
			var m childMsg
			if err := json.Unmarshal(payload, &m); err != nil {
				c.emit(events, ctlEvent{err: fmt.Errorf("malformed control frame: %v", err), end: true})
				return
			}
			pending = rest
			if !c.emit(events, ctlEvent{msg: m}) {
				return
			}
		}
		if eof {
			var err error
			if len(pending) > 0 {
				err = errors.New("control channel cut inside a frame")
			}
			c.emit(events, ctlEvent{err: err, end: true})
			return
		}
	}
}

// emit delivers ev unless Run has finished with the child.
func (c *Child) emit(events chan<- ctlEvent, ev ctlEvent) bool {
	select {
	case events <- ev:
		return true
	case <-c.closed:
		return false
	}
}
