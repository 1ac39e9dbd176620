package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
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
	Pid    int
	tpl    *Template
	ctl    *net.UnixConn
	stdout *os.File
	stderr *os.File
	pidfd  int

	exitOnce sync.Once
	exitCh   chan ExitStatus
	status   ExitStatus

	killOnce sync.Once
}

func newChild(t *Template, pid int, fds []int) (*Child, error) {
	ctlFile := os.NewFile(uintptr(fds[0]), "job-control")
	conn, err := net.FileConn(ctlFile)
	ctlFile.Close()
	if err != nil {
		closeAll(fds[1:])
		return nil, fmt.Errorf("child control channel: %w", err)
	}
	for _, fd := range fds[1:3] {
		if err := unix.SetNonblock(fd, true); err != nil {
			conn.Close()
			closeAll(fds[1:])
			return nil, err
		}
	}
	unix.CloseOnExec(fds[3])
	return &Child{
		Pid:    pid,
		tpl:    t,
		ctl:    conn.(*net.UnixConn),
		stdout: os.NewFile(uintptr(fds[1]), "job-stdout"),
		stderr: os.NewFile(uintptr(fds[2]), "job-stderr"),
		pidfd:  fds[3],
		exitCh: make(chan ExitStatus, 1),
	}, nil
}

func (c *Child) exited(st ExitStatus) {
	c.exitOnce.Do(func() {
		c.status = st
		c.exitCh <- st
		close(c.exitCh)
	})
}

// Kill sends SIGKILL through the child's pidfd, which cannot hit a reused
// pid.
func (c *Child) Kill() {
	_ = unix.PidfdSendSignal(c.pidfd, unix.SIGKILL, nil, 0)
}

// Close kills the child and releases every host-side descriptor.
func (c *Child) Close() {
	c.killOnce.Do(func() {
		c.Kill()
		c.ctl.Close()
		c.stdout.Close()
		c.stderr.Close()
		unix.Close(c.pidfd)
	})
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

	var wg sync.WaitGroup
	wg.Add(2)
	go capture(c.stdout, job.MaxOutput, &o.Stdout, &o.StdoutTrunc, &wg)
	go capture(c.stderr, job.MaxOutput, &o.Stderr, &o.StderrTrunc, &wg)
	pipesClosed := make(chan struct{})
	go func() { wg.Wait(); close(pipesClosed) }()

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
		<-pipesClosed
		o.Status = c.waitStatus(time.Second)
		o.End = time.Now()
		return o
	}

	events := make(chan ctlEvent, 4)
	go c.readCtl(events)

	var timer <-chan time.Time
	if job.Timeout > 0 {
		t := time.NewTimer(job.Timeout)
		defer t.Stop()
		timer = t.C
	}
	ctlOpen := true
	killed := false
	kill := func() {
		if !killed {
			killed = true
			c.Kill()
		}
	}
	for ctlOpen {
		select {
		case ev := <-events:
			if ev.end {
				ctlOpen = false
				if ev.err != nil && o.Violation == "" && !killed {
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
			default:
				if o.Violation == "" && !o.Done {
					o.Violation = fmt.Sprintf("unexpected %q frame on the control channel", m.T)
				}
				kill()
			}
		case <-timer:
			o.TimedOut = true
			kill()
			timer = nil
		case <-cancel:
			o.Canceled = true
			kill()
			cancel = nil
		}
	}
	// The control channel is closed: the child exited or is exiting.
	if !o.Done {
		select {
		case st := <-c.exitCh:
			o.Status = &st
		case <-timer:
			o.TimedOut = true
			kill()
			st := <-c.exitCh
			o.Status = &st
		case <-cancel:
			o.Canceled = true
			kill()
			st := <-c.exitCh
			o.Status = &st
		}
	}
	// Output pipes close when the process is gone. A child that passed its
	// pipes on is dead by now (killed above or exited), so this is bounded.
	select {
	case <-pipesClosed:
	case <-timer:
		o.TimedOut = true
		kill()
		<-pipesClosed
	case <-cancel:
		o.Canceled = true
		kill()
		<-pipesClosed
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
	n, _, err := c.ctl.WriteMsgUnix(buf, oob, nil)
	if err != nil {
		return err
	}
	if n < len(buf) {
		_, err = c.ctl.Write(buf[n:])
	}
	return err
}

type ctlEvent struct {
	msg childMsg
	err error // why the channel ended, nil for a clean close
	end bool  // the channel ended; no more events follow
}

func (c *Child) readCtl(events chan<- ctlEvent) {
	r := frame.NewReader(c.ctl, maxCtlFrame)
	for {
		b, err := r.Next()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				err = nil
			} else if errors.Is(err, io.ErrUnexpectedEOF) {
				err = errors.New("control channel cut inside a frame")
			}
			events <- ctlEvent{err: err, end: true}
			return
		}
		var m childMsg
		if err := json.Unmarshal(b, &m); err != nil {
			events <- ctlEvent{err: fmt.Errorf("malformed control frame: %v", err), end: true}
			return
		}
		events <- ctlEvent{msg: m}
	}
}
