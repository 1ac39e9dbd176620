package worker

// Capture of a job's stdout and stderr pipes.

import (
	"os"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// outputDelay is how long a job runs before the host starts reading its
// output as it comes; see Child.stdoutFd.
const outputDelay = 2 * time.Millisecond

// drainTimeout bounds the wait for a finished job's output pipes to close.
const drainTimeout = 2 * time.Second

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
		n, err := rawRead(fd, *bp)
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
	read := f.Read
	if rc, err := f.SyscallConn(); err == nil {
		read = func(p []byte) (int, error) { return rawConnRead(rc, p) } // see rawio.go
	}
	for {
		n, err := read(*bp)
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

// outputPipes makes a step's stdout and stderr pipes; their read ends
// are non-blocking.
func outputPipes() (out, errp [2]int, err error) {
	if err = rawPipe2(&out, unix.O_CLOEXEC); err != nil {
		return out, errp, err
	}
	if err = rawPipe2(&errp, unix.O_CLOEXEC); err != nil {
		unix.Close(out[0])
		unix.Close(out[1])
		return out, errp, err
	}
	// A new pipe's read end has no status flag but O_RDONLY: one F_SETFL
	// each, without the F_GETFL of unix.SetNonblock.
	for _, fd := range []int{out[0], errp[0]} {
		if err = rawSetfl(fd, unix.O_NONBLOCK); err != nil {
			closeAll([]int{out[0], out[1], errp[0], errp[1]})
			return out, errp, err
		}
	}
	return out, errp, nil
}

// output is a turn's capture of the job's stdout and stderr. Capture
// starts when the job reports, ends, or has run for outputDelay; until
// then the pipes (64 KiB and more each) hold it. When it starts, what the
// pipes hold is read at once; only a pipe that is still open gets a
// reader goroutine.
type output struct {
	stdout, stderr sink
	started        bool
	// closed is closed when both pipes reached end of file; nil until
	// capture starts.
	closed <-chan struct{}
	files  []*os.File // the pipes still being read
	pipes  *pipeGroup // or those read by the template's poller
	// stream passes the output on as it comes (see streamer); nil when
	// nobody asked for it.
	stream *streamer
	// closeLater: pipes found at end of file when capture starts are
	// left to Child.closeLater (a live session step's, see step_pipes.go).
	closeLater bool
}

func newOutput(max int, fn OutputFunc) *output {
	out := &output{stdout: sink{max: max}, stderr: sink{max: max}}
	if fn != nil {
		out.stream = &streamer{fn: fn, hurry: make(chan struct{})}
	}
	return out
}

// start takes the child's output pipes and starts capturing them, once.
func (out *output) start(c *Child) {
	if out.started {
		return
	}
	out.started = true
	outFd, errFd := c.stdoutFd, c.stderrFd
	c.stdoutFd, c.stderrFd = -1, -1
	if out.stream != nil {
		// Streamed output is read only by the readers, which call the
		// callback: never on the turn's goroutine, which must keep
		// watching the clock however slow the callback is.
		out.startStream(outFd, errFd)
		return
	}
	outEOF := drainNow(outFd, &out.stdout)
	errEOF := drainNow(errFd, &out.stderr)
	closed := make(chan struct{})
	out.closed = closed
	if outEOF && errEOF {
		if out.closeLater {
			c.closeLater(outFd, errFd)
		} else {
			rawClose(outFd)
			rawClose(errFd)
		}
		close(closed)
		return
	}
	if c.tpl != nil {
		// The pipes still open are read by the template's poller
		// (pipewatch.go); one at end of file is closed now.
		var fds []int
		var ks []*sink
		for i, fd := range []int{outFd, errFd} {
			if []bool{outEOF, errEOF}[i] {
				continue
			}
			fds = append(fds, fd)
			ks = append(ks, []*sink{&out.stdout, &out.stderr}[i])
		}
		if g := c.tpl.bells.watchPipes(fds, ks, closed); g != nil {
			if outEOF {
				rawClose(outFd)
			}
			if errEOF {
				rawClose(errFd)
			}
			out.pipes = g
			return
		}
	}
	stdout := os.NewFile(uintptr(outFd), "job-stdout")
	stderr := os.NewFile(uintptr(errFd), "job-stderr")
	out.files = []*os.File{stdout, stderr}
	var wg sync.WaitGroup
	wg.Add(2)
	go capture(stdout, &out.stdout, &wg)
	go capture(stderr, &out.stderr, &wg)
	go func() {
		wg.Wait()
		stdout.Close()
		stderr.Close()
		close(closed)
	}()
}

// cutOff closes the pipes being read, for a job that smuggled their
// write ends elsewhere, and waits for the readers.
func (out *output) cutOff() {
	if out.pipes != nil {
		out.pipes.cutOff()
	}
	for _, f := range out.files {
		f.Close()
	}
	<-out.closed
}

// finish puts what was captured into o.
func (out *output) finish(o *Outcome) {
	o.Stdout, o.StdoutTrunc = out.stdout.result(), out.stdout.trunc
	o.Stderr, o.StderrTrunc = out.stderr.result(), out.stderr.trunc
}
