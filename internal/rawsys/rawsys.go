//go:build linux

// Package rawsys makes the system calls of a job's way through the pool
// that never wait for anything but the kernel's own locks (opening,
// closing, making and removing the pool's own directories and files, and
// reading their status) as raw system calls, with the signatures of
// their golang.org/x/sys/unix counterparts.
//
// Every golang.org/x/sys/unix wrapper goes through syscall.Syscall, which
// tells Go's scheduler that the thread may block. When every P was idle,
// as it is whenever the pool waits for a client or a child, the runtime's
// monitor thread (sysmon) is parked, and the first such call after the
// wait wakes it on another CPU; it then polls until it finds the Ps idle
// again. With `pynox pool` on its one P (two workers) and 2 ms of think
// time between jobs, these wake-ups were about two per job, and the
// monitor's passes a fifth of the host's CPU (issue 12). A raw call
// keeps the P for its duration, which for these calls is what the P
// would wait anyway.
package rawsys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

func errno(e unix.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

// Openat is unix.Openat.
func Openat(dirfd int, path string, flags int, mode uint32) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	for {
		fd, _, e := unix.RawSyscall6(unix.SYS_OPENAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), uintptr(flags), uintptr(mode), 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(fd), nil
	}
}

// Close is unix.Close.
func Close(fd int) error {
	_, _, e := unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
	return errno(e)
}

// Mkdirat is unix.Mkdirat.
func Mkdirat(dirfd int, path string, mode uint32) error {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	_, _, e := unix.RawSyscall(unix.SYS_MKDIRAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), uintptr(mode))
	return errno(e)
}

// Unlinkat is unix.Unlinkat.
func Unlinkat(dirfd int, path string, flags int) error {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	_, _, e := unix.RawSyscall(unix.SYS_UNLINKAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), uintptr(flags))
	return errno(e)
}

// Fstat is unix.Fstat.
func Fstat(fd int, st *unix.Stat_t) error {
	_, _, e := unix.RawSyscall(unix.SYS_FSTAT, uintptr(fd), uintptr(unsafe.Pointer(st)), 0)
	return errno(e)
}

// Fchmod is unix.Fchmod.
func Fchmod(fd int, mode uint32) error {
	_, _, e := unix.RawSyscall(unix.SYS_FCHMOD, uintptr(fd), uintptr(mode), 0)
	return errno(e)
}

// Getdents is unix.Getdents.
func Getdents(fd int, buf []byte) (int, error) {
	var p unsafe.Pointer
	if len(buf) > 0 {
		p = unsafe.Pointer(&buf[0])
	}
	n, _, e := unix.RawSyscall(unix.SYS_GETDENTS64, uintptr(fd), uintptr(p), uintptr(len(buf)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// Seek is unix.Seek.
func Seek(fd int, offset int64, whence int) (int64, error) {
	off, _, e := unix.RawSyscall(unix.SYS_LSEEK, uintptr(fd), uintptr(offset), uintptr(whence))
	if e != 0 {
		return 0, e
	}
	return int64(off), nil
}

// Read is unix.Read, for a descriptor that never blocks (a /proc or
// cgroup file, a non-blocking pipe or socket).
func Read(fd int, p []byte) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(ptr), uintptr(len(p)))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

// Pread is unix.Pread.
func Pread(fd int, p []byte, off int64) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_PREAD64, uintptr(fd), uintptr(ptr), uintptr(len(p)), uintptr(off), 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

// Write is unix.Write, for a descriptor that never blocks (a /proc or
// cgroup control file).
func Write(fd int, p []byte) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	for {
		n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(ptr), uintptr(len(p)))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}
