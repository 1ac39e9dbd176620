package main

import (
	"os"
	"os/signal"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// reapOrphans makes the command a child subreaper (PR_SET_CHILD_SUBREAPER)
// and reaps, for as long as it runs, every orphan that becomes its child:
// with templates in PID namespaces of their own none can (the kernel kills
// and reaps a namespace with its template), but without them the spares of
// a template that was killed die by their parent-death signal and would
// otherwise stay zombies of the pool, or of PID 1 (`pynox pool` as a
// container's init). It never reaps a process the command started itself,
// whose status os/exec must collect: those, the templates, share the
// command's session, while every child a template forks starts a session
// of its own before it can be orphaned. Only exited children are looked
// at, without reaping (WNOWAIT), before one is reaped.
func reapOrphans() {
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) // as PID 1, it reaps anyway
	sid, err := unix.Getsid(0)
	if err != nil {
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	go func() {
		retry := time.NewTimer(time.Hour)
		retry.Stop()
		for {
			select {
			case <-sig:
			case <-retry.C:
			}
			if !reapOnce(sid) {
				// One of ours is exited but not yet collected by os/exec;
				// it hides those behind it from waitid: look again soon.
				retry.Reset(100 * time.Millisecond)
			}
		}
	}()
}

// reapOnce reaps exited children in another session than sid. It returns
// false when it stopped at an exited child of the command's own session.
func reapOnce(sid int) bool {
	for {
		pid, err := exitedChild()
		if err != nil || pid <= 0 {
			return true // no child at all (ECHILD), or none exited
		}
		if s, err := unix.Getsid(pid); err == nil && s == sid {
			return false
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err != nil {
			return true
		}
	}
}

// exitedChild returns the pid of an exited child without reaping it
// (waitid P_ALL, WEXITED|WNOHANG|WNOWAIT), or 0 when none has exited.
func exitedChild() (int, error) {
	// siginfo_t is 128 bytes; si_pid follows si_signo, si_errno and
	// si_code, at the union's pointer-aligned offset.
	var info [128]byte
	_, _, e := unix.Syscall6(unix.SYS_WAITID, unix.P_ALL, 0, uintptr(unsafe.Pointer(&info[0])),
		unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, 0, 0)
	if e != 0 {
		return 0, e
	}
	off := uintptr(12)
	if unsafe.Sizeof(uintptr(0)) == 8 {
		off = 16
	}
	return int(*(*int32)(unsafe.Pointer(&info[off]))), nil
}
