package pynox

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// outputsEmpty reports whether the outputs directory of the plan's
// scratch directory holds no entry at all, with raw system calls: most
// steps and jobs write no outputs, and a system call through
// syscall.Syscall wakes the Go runtime's monitor thread when every P was
// idle before, as the pool's Ps are while a session step runs
// (internal/worker/rawsys.go). The directory is opened beneath the
// scratch root's own descriptor, with no symlink, magic link or mount
// crossing on the way (collectOutputs reaches it by path, with the same
// refusals): one path walk of two names instead of the root's whole
// path. The scratch directory is the pool's own, on a local file system,
// so these calls do not block. Any failure, or any entry, says false:
// the caller then scans the directory as before.
func (pl *plan) outputsEmpty() bool {
	s := pl.scratchRoot
	if s == nil || pl.scratch == "" {
		return false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return false
	}
	ofd, err := rawOpenat2(s.fd, pl.scratch+"/"+OutputsDir, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolveBeneath})
	if err != nil {
		return false
	}
	defer unix.RawSyscall(unix.SYS_CLOSE, uintptr(ofd), 0, 0)
	return dirEmptyFd(ofd)
}

// rawOpenat2 is unix.Openat2 as a raw system call.
func rawOpenat2(dirfd int, path string, how *unix.OpenHow) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	fd, _, e := unix.RawSyscall6(unix.SYS_OPENAT2, uintptr(dirfd), uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(how)), unsafe.Sizeof(*how), 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}
