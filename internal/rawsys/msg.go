//go:build linux

package rawsys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// msghdr points a message header at p and the control message oob.
func msghdr(msg *unix.Msghdr, iov *unix.Iovec, p, oob []byte) {
	if len(p) > 0 {
		iov.Base = &p[0]
		iov.SetLen(len(p))
	}
	msg.Iov = iov
	msg.Iovlen = 1
	if len(oob) > 0 {
		msg.Control = &oob[0]
		msg.SetControllen(len(oob))
	}
}

// Sendmsg is unix.SendmsgN to a socket that does not block: a
// non-blocking one, or flags with MSG_DONTWAIT. It returns the bytes
// sent.
func Sendmsg(fd int, p, oob []byte, flags int) (int, error) {
	var msg unix.Msghdr
	var iov unix.Iovec
	msghdr(&msg, &iov, p, oob)
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
	var msg unix.Msghdr
	var iov unix.Iovec
	msghdr(&msg, &iov, p, oob)
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
