//go:build linux

// Package pidfd reads what the pool needs to know of a pidfd.
package pidfd

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Pid returns the process id, in the caller's PID namespace, of the
// process a pidfd refers to: from the PIDFD_GET_INFO ioctl (Linux 6.13),
// which answers in the caller's own PID namespace, the one in which
// cgroup.procs and kill read a pid; on older kernels, from the "Pid:" line
// of /proc/self/fdinfo/<fd>, which answers in the namespace /proc was
// mounted for (the same one unless the caller entered a new PID namespace
// without mounting its own /proc).
// A template in a PID namespace of its own knows its children by their
// pids in that namespace; the host learns theirs from the pidfds the
// template hands over. It fails when the process has been reaped (the
// kernel then says -1) or is not visible in the caller's namespace (0).
func Pid(fd int) (int, error) {
	info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_PID}
	switch err := ioctlPidfdInfo(fd, &info); err {
	case nil:
		return int(info.Tgid), nil
	case unix.ENOTTY, unix.EINVAL:
		// An older kernel: read the fdinfo below.
	default:
		return 0, fmt.Errorf("PIDFD_GET_INFO on pidfd %d: %w", fd, err)
	}
	f, err := unix.Open("/proc/self/fdinfo/"+strconv.Itoa(fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("fdinfo of pidfd %d: %w", fd, err)
	}
	var buf [512]byte
	n, err := unix.Read(f, buf[:])
	unix.Close(f)
	if err != nil {
		return 0, fmt.Errorf("fdinfo of pidfd %d: %w", fd, err)
	}
	b := buf[:max(n, 0)]
	i := bytes.Index(b, []byte("\nPid:"))
	if i < 0 {
		return 0, fmt.Errorf("fdinfo of fd %d has no Pid line (not a pidfd?)", fd)
	}
	b = b[i+len("\nPid:"):]
	if j := bytes.IndexByte(b, '\n'); j >= 0 {
		b = b[:j]
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil {
		return 0, fmt.Errorf("fdinfo of pidfd %d: bad Pid line: %w", fd, err)
	}
	if pid <= 0 {
		return 0, errors.New("the pidfd's process has been reaped or is not visible in this pid namespace")
	}
	return pid, nil
}

// ioctlPidfdInfo is unix.IoctlPidfdInfo made as a raw system call: the
// ioctl never blocks, and the pool asks it for every spare (to move it
// into its cgroup) while its one P may have been idle, when a call
// through syscall.Syscall would wake the runtime's monitor thread (see
// internal/worker/rawsys.go).
func ioctlPidfdInfo(fd int, info *unix.PidfdInfo) error {
	_, _, e := unix.RawSyscall(unix.SYS_IOCTL, uintptr(fd), uintptr(unix.PIDFD_GET_INFO), uintptr(unsafe.Pointer(info)))
	if e != 0 {
		return e
	}
	return nil
}
