//go:build linux

package rawsys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// msghdr returns an I/O vector of p and a message header of it and the
// control message oob, whose Iov the caller points at the vector, a
// variable of its own. (Nothing is stored through a pointer: that made
// the vector and p escape to the heap, an allocation per call.)
func msghdr(p, oob []byte) (iov unix.Iovec, msg unix.Msghdr) {
	if len(p) > 0 {
		iov.Base = &p[0]
		iov.SetLen(len(p))
	}
	msg.Iovlen = 1
	if len(oob) > 0 {
		msg.Control = &oob[0]
		msg.SetControllen(len(oob))
	}
	return iov, msg
}

// Sendmsg is unix.SendmsgN to a socket that does not block: a
// non-blocking one, or flags with MSG_DONTWAIT. It returns the bytes
// sent.
func Sendmsg(fd int, p, oob []byte, flags int) (int, error) {
	iov, msg := msghdr(p, oob)
	msg.Iov = &iov
	for {
		n, _, e := unix.RawSyscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), uintptr(flags))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

// Recvmsg is unix.Recvmsg from a socket that does not block: a
// non-blocking one, or flags with MSG_DONTWAIT. It returns the bytes read
// into p and oob and the message's flags.
func Recvmsg(fd int, p, oob []byte, flags int) (n, oobn, recvflags int, err error) {
	iov, msg := msghdr(p, oob)
	msg.Iov = &iov
	for {
		r, _, e := unix.RawSyscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), uintptr(flags))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, 0, 0, e
		}
		return int(r), int(msg.Controllen), int(msg.Flags), nil
	}
}
