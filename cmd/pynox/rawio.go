package main

import (
	"errors"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/rawio"
)

// pollableStdout returns standard output, when it is a pipe, as a fresh
// non-blocking open file description of that pipe (through
// /proc/self/fd/1) written with raw writes (internal/rawio), as pollableStdin
// does for standard input: the description the pool inherited keeps its
// mode. Anything other than a pipe, or a pipe that cannot be reopened, is
// returned as os.Stdout.
func pollableStdout() io.Writer {
	var st unix.Stat_t
	if unix.Fstat(1, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return os.Stdout
	}
	f, err := os.OpenFile("/proc/self/fd/1", os.O_WRONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return os.Stdout
	}
	if w := rawio.New(f); w != nil {
		return sigpipeWriter{w}
	}
	f.Close()
	return os.Stdout
}

// sigpipeWriter is the pool's own description of the stdout pipe, which
// fails a write to a pipe with no reader with EPIPE where a write to
// descriptor 1 kills the process with SIGPIPE (os/signal: "A write to a
// broken pipe on file descriptors 1 or 2 ..."). The pool went on reading
// and running requests whose answers nobody could read; now it ends as
// docs/protocol.md says: killed by SIGPIPE, like a write to descriptor 1,
// since that is what it does (unless SIGPIPE is ignored, when the write
// error stands).
type sigpipeWriter struct{ w io.Writer }

func (s sigpipeWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if errors.Is(err, syscall.EPIPE) {
		rest := p[n:]
		if len(rest) == 0 {
			rest = []byte("\n")
		}
		_, _ = os.Stdout.Write(rest)
	}
	return n, err
}

// rawStdin is pollableStdin read with raw reads (internal/rawio) when it is the
// pipe's own non-blocking description.
func rawStdin() io.Reader {
	f := pollableStdin()
	if f == os.Stdin {
		return f
	}
	if r := rawio.New(f); r != nil {
		return r
	}
	return f
}
