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
// whose status os/exec must collect: those share the command's session and
// either lead a process group of their own (the templates) or are in the
// command's group (probes of the interpreter). A template's child is in
// neither: before its setsid it is in the template's group, after it in a
// session of its own. Only exited children are looked at, without reaping
// (WNOWAIT), before one is reaped.
func reapOrphans() {
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) // as PID 1, it reaps anyway
	sid, err := unix.Getsid(0)
	if err != nil {
		return
	}
	pgrp := unix.Getpgrp()
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
			if !reapOnce(sid, pgrp) {
				// One of ours is exited but not yet collected by os/exec;
				// it hides those behind it from waitid: look again soon.
				retry.Reset(100 * time.Millisecond)
			}
		}
	}()
}

// reapOnce reaps exited children that the command did not start (see
// ours). It returns false when it stopped at an exited child of its own.
func reapOnce(sid, pgrp int) bool {
	for {
		pid, err := exitedChild()
		if err != nil || pid <= 0 {
			return true // no child at all (ECHILD), or none exited
		}
		if ours(pid, sid, pgrp) {
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

// ours reports whether the child pid is one the command started itself:
// in the command's session (sid) and either a process group leader (a
// template) or in the command's process group (pgrp). A zombie keeps its
// session and group until it is reaped. When either cannot be read, the
// child counts as ours: os/exec may be waiting for it.
func ours(pid, sid, pgrp int) bool {
	s, err := unix.Getsid(pid)
	if err != nil {
		return true
	}
	if s != sid {
		return false
	}
	g, err := unix.Getpgid(pid)
	if err != nil {
		return true
	}
	return g == pid || g == pgrp
}
