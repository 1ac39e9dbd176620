package worker

// Raw reads of a child's output pipes through the poller (the turn's
// other non-blocking system calls are in rawsys.go).
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

	"golang.org/x/sys/unix"
)

// rawConnRead reads from rc like os.File.Read: it waits in Go's network
// poller while nothing is there, returns io.EOF at end of file, and the
// poller's error once the file is closed; the read itself is rawRead
// (rawsys.go).
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
