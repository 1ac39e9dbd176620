// Package rawio reads and writes non-blocking files that Go's poller
// waits on with raw read(2) and write(2) system calls.
//
// A read or write of such a file never blocks, so it need not tell the
// scheduler that the thread may block; os.File tells it (through
// syscall.Syscall) every time, and when the runtime's monitor thread
// (sysmon) is parked because every P was idle, as in a process that
// waits for its peer between messages, that first call wakes it on
// another CPU, and it then polls every 20 µs until it finds the Ps idle
// again: a wake-up of another thread per message exchanged (issue 12).
package rawio

import (
	"io"
	"os"
	"syscall"
	"unsafe"
)

// File reads or writes a non-blocking file through its syscall.RawConn.
type File struct {
	rc syscall.RawConn
}

// New returns a File of f, a non-blocking file registered with the
// poller (a pipe from os.Pipe, or a file opened with O_NONBLOCK), or nil
// when f has no raw connection.
func New(f interface {
	SyscallConn() (syscall.RawConn, error)
}) *File {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil
	}
	return &File{rc: rc}
}

// Read reads what the file holds, waiting in the poller for data; it
// returns io.EOF at end of file.
func (r *File) Read(p []byte) (int, error) {
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
func (r *File) Write(p []byte) (int, error) {
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
			return done, &os.PathError{Op: "write", Path: "pipe", Err: e}
		}
		done += int(n)
	}
	return done, nil
}
