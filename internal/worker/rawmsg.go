package worker

// Raw reads and writes of a template's control socket through the poller
// (see rawsys.go for why a call that cannot block is made raw).
//
// The template's frames (a spare ready, a child's exit) arrive while the
// pool waits for them: its one P idle, the runtime's monitor thread
// parked. net.UnixConn's ReadMsgUnix and Write go through
// syscall.Syscall, and the first such call after the wait woke the
// monitor: with two workers and 2 ms of think time, the template's
// recvmsg was half of the monitor's wake-ups (about one per job).

import (
	"io"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawRecvmsg reads from rc like net.UnixConn.ReadMsgUnix on a stream
// socket (with MSG_CMSG_CLOEXEC): it waits in Go's network poller while
// nothing is there, returns io.EOF once the peer has closed and nothing
// is left, and the poller's error once the socket is closed or a
// deadline passed.
func rawRecvmsg(rc syscall.RawConn, p, oob []byte) (n, oobn, flags int, err error) {
	var msg unix.Msghdr
	var iov unix.Iovec
	if len(p) > 0 {
		iov.Base = &p[0]
		iov.SetLen(len(p))
	}
	msg.Iov = &iov
	msg.Iovlen = 1
	if len(oob) > 0 {
		msg.Control = &oob[0]
		msg.SetControllen(len(oob))
	}
	var e unix.Errno
	var r uintptr
	if cerr := rc.Read(func(fd uintptr) bool {
		for {
			msg.SetControllen(len(oob))
			msg.Flags = 0
			r, _, e = unix.RawSyscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&msg)),
				uintptr(unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT))
			if e != unix.EINTR {
				return e != unix.EAGAIN
			}
		}
	}); cerr != nil {
		return 0, 0, 0, cerr
	}
	if e != 0 {
		return 0, 0, 0, e
	}
	n, oobn, flags = int(r), int(msg.Controllen), int(msg.Flags)
	if n == 0 && oobn == 0 && len(p) > 0 {
		return 0, 0, flags, io.EOF
	}
	return n, oobn, flags, nil
}

// rawConnWrite writes all of p to rc like net.UnixConn.Write: it waits in
// Go's network poller while the socket's buffer is full.
func rawConnWrite(rc syscall.RawConn, p []byte) (int, error) {
	done := 0
	for done < len(p) {
		var n int
		var err error
		if cerr := rc.Write(func(fd uintptr) bool {
			for {
				n, err = rawSend(int(fd), p[done:])
				if err != unix.EINTR {
					return err != unix.EAGAIN
				}
			}
		}); cerr != nil {
			return done, cerr
		}
		if err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// rawSend is send(2) with MSG_DONTWAIT|MSG_NOSIGNAL: a peer that is gone
// fails it with EPIPE rather than raising SIGPIPE.
func rawSend(fd int, p []byte) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	n, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(ptr), uintptr(len(p)),
		uintptr(unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawSetsockoptTimeval is setsockopt(2) of a struct timeval option.
func rawSetsockoptTimeval(fd, level, opt int, tv *unix.Timeval) error {
	_, _, e := unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(tv)), unsafe.Sizeof(*tv), 0)
	if e != 0 {
		return e
	}
	return nil
}
