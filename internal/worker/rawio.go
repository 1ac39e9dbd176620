package worker

// Raw reads of the children's non-blocking descriptors.
//
// A system call made through syscall.Syscall (every os.File read, every
// golang.org/x/sys/unix call) tells Go's scheduler that the thread may
// block: when no P is running (the pool was idle, waiting for the next
// event), that first call wakes the runtime's monitor thread (sysmon)
// from its deep sleep, which then polls every 20 µs until the process is
// idle again. With the one P `pynox pool` runs on for two workers, each
// burst of activity the job's child causes (its bell rings, its output
// pipes closing) started with such a read: a futex wake-up, and two or
// more context switches of the monitor thread, for a read that cannot
// block (the descriptors are non-blocking). These reads are made with
// syscall.RawSyscall instead, through the descriptor's RawConn where Go's
// network poller waits for it; nothing else changes (end of file, errors,
// closing the file while a read waits).

import (
	"io"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawRead reads from the non-blocking descriptor fd without entering the
// scheduler's system-call state.
func rawRead(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawRecv is recvfrom(2) of fd into p with flags (the sender's address
// is not asked for), without entering the scheduler's system-call state.
// Use it only with MSG_DONTWAIT or on a non-blocking socket.
func rawRecv(fd int, p []byte, flags int) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), uintptr(flags), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawConnRead reads from rc like os.File.Read: it waits in Go's network
// poller while nothing is there, returns io.EOF at end of file, and the
// poller's error once the file is closed; the read itself is rawRead.
func rawConnRead(rc syscall.RawConn, p []byte) (int, error) {
	var n int
	var err error
	if cerr := rc.Read(func(fd uintptr) bool {
		for {
			n, err = rawRead(int(fd), p)
			if err != unix.EINTR {
				return err != unix.EAGAIN
			}
		}
	}); cerr != nil {
		return 0, cerr
	}
	if err != nil {
		return 0, err
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}
