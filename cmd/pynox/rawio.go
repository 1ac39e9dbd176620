package main

import (
	"io"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawFile reads or writes a non-blocking file that Go's poller waits on,
// with raw read(2) and write(2): a read or write of a file that cannot
// block need not tell the scheduler, and telling it (as os.File does,
// through syscall.Syscall) wakes the runtime's monitor thread whenever
// every P was idle before — for `pynox pool`, at every request line and
// every result, each waking another CPU (issue 12; see
// internal/worker/rawsys.go).
type rawFile struct {
	f  *os.File // kept for its descriptor's life
	rc syscall.RawConn
}

// newRawFile wraps f, a non-blocking file registered with the poller; it
// returns nil when f cannot be used so.
func newRawFile(f *os.File) *rawFile {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil
	}
	return &rawFile{f: f, rc: rc}
}

// Read reads what the file holds, waiting in the poller for data.
func (r *rawFile) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n uintptr
	var e syscall.Errno
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			n, _, e = syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			if e != syscall.EINTR {
				return e != syscall.EAGAIN
			}
		}
	})
	switch {
	case err != nil:
		return 0, err
	case e != 0:
		return 0, e
	case n == 0:
		return 0, io.EOF
	}
	return int(n), nil
}

// Write writes all of p, waiting in the poller for room.
func (r *rawFile) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		var n uintptr
		var e syscall.Errno
		err := r.rc.Write(func(fd uintptr) bool {
			for {
				rest := p[done:]
				n, _, e = syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&rest[0])), uintptr(len(rest)))
				if e != syscall.EINTR {
					return e != syscall.EAGAIN
				}
			}
		})
		if err != nil {
			return done, err
		}
		if e != 0 {
			return done, e
		}
		done += int(n)
	}
	return done, nil
}

// pollableStdout returns standard output, when it is a pipe, as a fresh
// non-blocking open file description of that pipe (through
// /proc/self/fd/1) written with raw writes (rawFile), as pollableStdin
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
	if w := newRawFile(f); w != nil {
		return w
	}
	f.Close()
	return os.Stdout
}

// rawStdin is pollableStdin read with raw reads (rawFile) when it is the
// pipe's own non-blocking description.
func rawStdin() io.Reader {
	f := pollableStdin()
	if f == os.Stdin {
		return f
	}
	if r := newRawFile(f); r != nil {
		return r
	}
	return f
}
