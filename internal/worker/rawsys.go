package worker

// System calls on a turn's way made as raw system calls: they never block
// (the descriptors are non-blocking, or the call is MSG_DONTWAIT, or it is
// a read of /proc, a signal, a close), so they need not tell Go's
// scheduler that the thread may block. A call through syscall.Syscall
// (every one of golang.org/x/sys/unix's wrappers) does tell it, and when
// the runtime's monitor thread (sysmon) is parked because every P was
// idle — as it is whenever the pool waits for a client or a child — the
// first such call after the wait wakes it, on another CPU, and it then
// polls every 20 µs until it finds the Ps idle again. Measured through
// `pynox pool` (cmd/pynox's BenchmarkPoolSessionStep), that was some 3.5
// of the 7.3 context switches of the pool's process tree per session
// step, and a tenth of its CPU (issue 12).

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/rawsys"
)

// errnoErr returns nil for a zero errno.
func errnoErr(e unix.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

// The calls internal/rawsys makes for every package of the pool.
var (
	rawRead  = rawsys.Read
	rawPread = rawsys.Pread
	rawWrite = rawsys.Write
	rawClose = rawsys.Close
)

// rawSendmsg is sendmsg(2) of p with the control message oob, with flags
// that include MSG_DONTWAIT: rawsys.Sendmsg, called directly (through a
// func variable, p would escape to the heap).
func rawSendmsg(fd int, p, oob []byte, flags int) (int, error) {
	return rawsys.Sendmsg(fd, p, oob, flags)
}

// rawOpen is open(2) of a /proc file (path is absolute).
func rawOpen(path string, flags int) (int, error) {
	return rawsys.Openat(unix.AT_FDCWD, path, flags, 0)
}

// rawRecv is recvfrom(2) with flags that include MSG_DONTWAIT.
func rawRecv(fd int, p []byte, flags int) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(ptr), uintptr(len(p)), uintptr(flags), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawPidfdSignal is pidfd_send_signal(2) with no siginfo.
func rawPidfdSignal(pidfd int, sig unix.Signal) error {
	_, _, e := unix.RawSyscall6(unix.SYS_PIDFD_SEND_SIGNAL, uintptr(pidfd), uintptr(sig), 0, 0, 0, 0)
	return errnoErr(e)
}

// rawClockGettime reads a clock that the vDSO does not serve (a process's
// CPU clock).
func rawClockGettime(clock int32, ts *unix.Timespec) error {
	_, _, e := unix.RawSyscall(unix.SYS_CLOCK_GETTIME, uintptr(clock), uintptr(unsafe.Pointer(ts)), 0)
	return errnoErr(e)
}

// rawPollNow is poll(2) with a zero timeout: which of fds are ready now.
func rawPollNow(fds []unix.PollFd) (int, error) {
	var ts unix.Timespec
	n, _, e := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)), uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawPipe2 is pipe2(2).
func rawPipe2(p *[2]int, flags int) error {
	var fds [2]int32
	_, _, e := unix.RawSyscall(unix.SYS_PIPE2, uintptr(unsafe.Pointer(&fds)), uintptr(flags), 0)
	if e != 0 {
		return e
	}
	p[0], p[1] = int(fds[0]), int(fds[1])
	return nil
}

// rawSetfl is fcntl(fd, F_SETFL, flags).
func rawSetfl(fd, flags int) error {
	_, _, e := unix.RawSyscall(unix.SYS_FCNTL, uintptr(fd), uintptr(unix.F_SETFL), uintptr(flags))
	return errnoErr(e)
}
