package jsonl

import (
	"io"
	"syscall"

	"github.com/pynox/pynox/internal/rawio"
)

// syscallConner is a pipe end of os/exec's (an *os.File, or its own
// wrapper of one).
type syscallConner interface {
	SyscallConn() (syscall.RawConn, error)
}

// rawPipes returns the command's pipes, from Cmd.StdoutPipe and
// Cmd.StdinPipe, read and written with raw system calls in the poller
// (internal/rawio): through os.File each read and write woke the client
// process's parked monitor thread, a wake-up of another thread per line
// (issue 12). Closing the writer closes the pipe. Pipes it cannot use so
// are returned as they are.
func rawPipes(stdout io.Reader, stdin io.WriteCloser) (io.Reader, io.WriteCloser) {
	var r io.Reader = stdout
	if f, ok := stdout.(syscallConner); ok {
		if rf := rawio.New(f); rf != nil {
			r = rf
		}
	}
	var w io.WriteCloser = stdin
	if f, ok := stdin.(syscallConner); ok {
		if wf := rawio.New(f); wf != nil {
			w = rawWriteCloser{wf, stdin}
		}
	}
	return r, w
}

// rawWriteCloser writes through a rawio.File and closes the pipe.
type rawWriteCloser struct {
	*rawio.File
	c io.Closer
}

func (w rawWriteCloser) Close() error { return w.c.Close() }
