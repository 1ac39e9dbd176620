package main

import (
	"io"
	"os"

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
		return w
	}
	f.Close()
	return os.Stdout
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
