//go:build linux && (amd64 || arm64)

package seccomp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// childEnv selects the policy variant ("deny" or "allow") in a re-executed
// test binary that installs the filter and reports probe results.
const childEnv = "PYNOX_SECCOMP_CHILD"

func TestMain(m *testing.M) {
	if variant, ok := os.LookupEnv(childEnv); ok {
		os.Exit(kernelChild(variant))
	}
	os.Exit(m.Run())
}

// kernelChild installs the filter for every thread of this process and
// prints one "name errno" line per probe (errno 0 means success).
func kernelChild(variant string) int {
	runtime.LockOSThread()
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "seccomp child: "+format+"\n", args...)
		return 3
	}

	var pol Policy
	switch variant {
	case "deny":
	case "allow":
		pol.AllowNetwork = true
	default:
		return fail("unknown variant %q", variant)
	}
	prog, err := Build(pol)
	if err != nil {
		return fail("build: %v", err)
	}

	// Everything the probes need is prepared before the filter goes on.
	tmp, err := os.CreateTemp("", "pynox-seccomp-probe-*")
	if err != nil {
		return fail("%v", err)
	}
	defer os.Remove(tmp.Name())
	tmpFd := tmp.Fd()
	tmpPath, _ := unix.BytePtrFromString(tmp.Name())
	var tmpStat unix.Stat_t
	if err := unix.Stat("/tmp", &tmpStat); err != nil {
		return fail("stat /tmp: %v", err)
	}
	tmpMode := uintptr(tmpStat.Mode & 0o7777) // chmod probes would not change anything
	slashTmp, _ := unix.BytePtrFromString("/tmp")
	truePath, _ := unix.BytePtrFromString("/bin/true")
	argv := []*byte{truePath, nil}
	envv := []*byte{nil}
	mntSrc, _ := unix.BytePtrFromString("none")
	mntDst, _ := unix.BytePtrFromString("/nonexistent/pynox-seccomp-probe")
	mntType, _ := unix.BytePtrFromString("tmpfs")
	ppid := uintptr(os.Getppid())

	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fail("PR_SET_NO_NEW_PRIVS: %v", err)
	}
	tidsBefore := threadIDs()
	// The two layers in the pool's order: the template's, then the job's.
	for _, layer := range []Program{prog.Template, prog.Job} {
		fprog := unix.SockFprog{Len: uint16(len(layer)), Filter: &layer[0]}
		r1, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
			unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
		runtime.KeepAlive(layer)
		if errno != 0 || r1 != 0 {
			return fail("seccomp(SET_MODE_FILTER, TSYNC): r1=%d errno=%v", r1, errno)
		}
	}
	if mode, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err != nil || mode != 2 {
		return fail("PR_GET_SECCOMP = %d, %v; want 2", mode, err)
	}
	// Canary: nothing below may run unless the filter really is active.
	if _, _, e := unix.RawSyscall(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM, 0); e != unix.EPERM {
		return fail("canary socket(AF_UNIX) = %v, want EPERM; not probing", e)
	}

	report := func(name string, e syscall.Errno) { fmt.Printf("%s %d\n", name, int(e)) }
	// exitIfChild terminates a process accidentally created by a probe.
	exitIfChild := func(r1 uintptr, e syscall.Errno) {
		if e == 0 && r1 == 0 {
			unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
		}
	}
	closeOnSuccess := func(r1 uintptr, e syscall.Errno) syscall.Errno {
		if e == 0 {
			unix.Close(int(r1))
		}
		return e
	}

	r1, _, e := unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0)
	if e == 0 && int(r1) != os.Getpid() {
		e = unix.EINVAL
	}
	report("getpid", e)
	if nativeTable.x32 {
		_, _, e = unix.RawSyscall(unix.SYS_GETPID|x32SyscallBit, 0, 0, 0)
		report("getpid_x32", e)
	}
	if nr, ok := nativeTable.lookup("fork"); ok {
		r1, _, e = unix.RawSyscall(uintptr(nr), 0, 0, 0)
		exitIfChild(r1, e)
		report("fork", e)
	}
	if nr, ok := nativeTable.lookup("vfork"); ok {
		r1, _, e = unix.RawSyscall(uintptr(nr), 0, 0, 0)
		exitIfChild(r1, e)
		report("vfork", e)
	}
	// Allowed to the template (the first layer), denied by the job layer.
	r1, _, e = unix.RawSyscall(unix.SYS_PIDFD_OPEN, ppid, 0, 0)
	report("pidfd_open_parent", closeOnSuccess(r1, e))
	_, _, e = unix.RawSyscall(unix.SYS_EXECVE, uintptr(unsafe.Pointer(truePath)),
		uintptr(unsafe.Pointer(&argv[0])), uintptr(unsafe.Pointer(&envv[0])))
	report("execve", e)
	r1, _, e = unix.RawSyscall6(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
	exitIfChild(r1, e)
	report("clone_fork", e)
	// clone3(NULL, 0) would be a harmless EINVAL without the filter.
	_, _, e = unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	report("clone3", e)

	// Thread creation (clone with CLONE_THREAD) must still work: park more
	// goroutines on locked OS threads than the process had threads before the
	// filter, so the Go runtime has to clone new ones. A failing clone would
	// crash the runtime; success shows up as thread ids not seen before.
	var wg sync.WaitGroup
	release := make(chan struct{})
	tids := make(chan int)
	extra := len(tidsBefore) + 2
	for range extra {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			tids <- unix.Gettid()
			<-release
		}()
	}
	newThreads := 0
	for range extra {
		if !tidsBefore[<-tids] {
			newThreads++
		}
	}
	close(release)
	wg.Wait()
	e = 0
	if newThreads == 0 {
		e = unix.EAGAIN
	}
	report("thread_create", e)

	r1, _, e = unix.RawSyscall(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, 0)
	report("socket_inet", closeOnSuccess(r1, e))
	r1, _, e = unix.RawSyscall(unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_DGRAM, 0)
	report("socket_inet6", closeOnSuccess(r1, e))
	r1, _, e = unix.RawSyscall(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM, 0)
	report("socket_unix", closeOnSuccess(r1, e))
	r1, _, e = unix.RawSyscall(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)
	report("socket_netlink", closeOnSuccess(r1, e))
	var fds [2]int32
	_, _, e = unix.RawSyscall6(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM, 0,
		uintptr(unsafe.Pointer(&fds[0])), 0, 0)
	if e == 0 {
		unix.Close(int(fds[0]))
		unix.Close(int(fds[1]))
	}
	report("socketpair", e)

	_, _, e = unix.RawSyscall6(unix.SYS_PTRACE, unix.PTRACE_ATTACH, ppid, 0, 0, 0, 0)
	if e == 0 {
		unix.RawSyscall6(unix.SYS_PTRACE, unix.PTRACE_DETACH, ppid, 0, 0, 0, 0)
	}
	report("ptrace_attach", e)
	_, _, e = unix.RawSyscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER, 0, 0)
	report("unshare", e)
	_, _, e = unix.RawSyscall6(unix.SYS_MOUNT, uintptr(unsafe.Pointer(mntSrc)),
		uintptr(unsafe.Pointer(mntDst)), uintptr(unsafe.Pointer(mntType)), 0, 0, 0)
	report("mount", e)
	_, _, e = unix.RawSyscall(unix.SYS_BPF, 0xffff, 0, 0) // invalid command
	report("bpf", e)
	_, _, e = unix.RawSyscall(unix.SYS_IO_URING_SETUP, 1, 0, 0) // NULL params
	report("io_uring_setup", e)
	_, _, e = unix.RawSyscall(unix.SYS_KEYCTL, 0xffff, 0, 0) // invalid operation
	report("keyctl", e)
	_, _, e = unix.RawSyscall(unix.SYS_SETUID, 0, 0, 0)
	report("setuid", e)
	if nr, ok := nativeTable.lookup("chmod"); ok {
		_, _, e = unix.RawSyscall(uintptr(nr), uintptr(unsafe.Pointer(slashTmp)), tmpMode, 0)
		report("chmod", e)
	}
	atFdcwd := uintptr(0xffffffffffffff9c) // AT_FDCWD (-100)
	_, _, e = unix.RawSyscall6(unix.SYS_FCHMODAT, atFdcwd, uintptr(unsafe.Pointer(slashTmp)), tmpMode, 0, 0, 0)
	report("fchmodat", e)
	_, _, e = unix.RawSyscall(unix.SYS_FCHMOD, tmpFd, 0o600, 0)
	report("fchmod", e)

	var c byte = 'x'
	_, _, e = unix.RawSyscall(unix.SYS_IOCTL, 0, unix.TIOCSTI|1<<32, uintptr(unsafe.Pointer(&c)))
	report("ioctl_tiocsti", e)
	var termios unix.Termios
	_, _, e = unix.RawSyscall(unix.SYS_IOCTL, 0, unix.TCGETS, uintptr(unsafe.Pointer(&termios)))
	report("ioctl_tcgets", e)

	var rl unix.Rlimit
	_, _, e = unix.RawSyscall6(unix.SYS_PRLIMIT64, ppid, unix.RLIMIT_NOFILE, 0, uintptr(unsafe.Pointer(&rl)), 0, 0)
	report("prlimit64_other", e)
	_, _, e = unix.RawSyscall6(unix.SYS_PRLIMIT64, 0, unix.RLIMIT_NOFILE, 0, uintptr(unsafe.Pointer(&rl)), 0, 0)
	report("prlimit64_self", e)

	_, _, e = unix.RawSyscall(unix.SYS_PERSONALITY, 0x0008, 0, 0) // PER_LINUX32
	report("personality_set", e)
	_, _, e = unix.RawSyscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
	report("personality_query", e)

	_, _, e = unix.RawSyscall6(unix.SYS_UTIMENSAT, atFdcwd, uintptr(unsafe.Pointer(tmpPath)), 0, 0, 0, 0)
	report("utimensat_path", e)
	_, _, e = unix.RawSyscall6(unix.SYS_UTIMENSAT, tmpFd, 0, 0, 0, 0, 0)
	report("utimensat_fd", e)

	// Issue 9: what the deny list let through.
	_, _, e = unix.RawSyscall6(469, tmpFd, 0, 0, 0, 0, 0) // file_setattr(fd, "", NULL, 0, 0)
	report("file_setattr", e)
	for _, nr := range []uintptr{470, 471, 500, 520, 1000, 4095} {
		_, _, e = unix.RawSyscall(nr, 0, 0, 0)
		report(fmt.Sprintf("syscall_%d", nr), e)
	}
	var aioCtx uint64
	_, _, e = unix.RawSyscall(unix.SYS_IO_SETUP, 1, uintptr(unsafe.Pointer(&aioCtx)), 0)
	report("io_setup", e)
	_, _, e = unix.RawSyscall6(unix.SYS_LISTMOUNT, 0, 0, 0, 0, 0, 0)
	report("listmount", e)
	roFd, err := unix.Open(tmp.Name(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("open %s read-only: %v", tmp.Name(), err)
	}
	var flags int32
	_, _, e = unix.RawSyscall(unix.SYS_IOCTL, uintptr(roFd), unix.FS_IOC_SETFLAGS, uintptr(unsafe.Pointer(&flags)))
	report("ioctl_fs_ioc_setflags", e)
	_, _, e = unix.RawSyscall(unix.SYS_IOCTL, uintptr(roFd), unix.FS_IOC_SETFLAGS|1<<32, uintptr(unsafe.Pointer(&flags)))
	report("ioctl_fs_ioc_setflags_high", e)
	_, _, e = unix.RawSyscall(unix.SYS_FCNTL, uintptr(roFd), unix.F_SETLEASE, unix.F_RDLCK)
	report("fcntl_setlease", e)
	_, _, e = unix.RawSyscall(unix.SYS_FCNTL, uintptr(roFd), unix.F_GETFD, 0)
	report("fcntl_getfd", e)
	_, _, e = unix.RawSyscall(unix.SYS_FCNTL, uintptr(roFd), unix.F_GETFD|1<<32, 0)
	report("fcntl_getfd_high", e)
	unix.Close(roFd)
	for _, sp := range []struct {
		name         string
		domain, kind uintptr
	}{
		{"socketpair_cloexec", unix.AF_UNIX, unix.SOCK_STREAM | unix.SOCK_CLOEXEC | unix.SOCK_NONBLOCK},
		{"socketpair_dgram", unix.AF_UNIX, unix.SOCK_DGRAM},
		{"socketpair_seqpacket", unix.AF_UNIX, unix.SOCK_SEQPACKET},
		{"socketpair_netlink", unix.AF_NETLINK, unix.SOCK_RAW},
		{"socketpair_vsock", unix.AF_VSOCK, unix.SOCK_STREAM},
		{"socketpair_inet", unix.AF_INET, unix.SOCK_STREAM},
	} {
		_, _, e = unix.RawSyscall6(unix.SYS_SOCKETPAIR, sp.domain, sp.kind, 0, uintptr(unsafe.Pointer(&fds[0])), 0, 0)
		if e == 0 {
			unix.Close(int(fds[0]))
			unix.Close(int(fds[1]))
		}
		report(sp.name, e)
	}
	// bind on a socketpair half: an abstract name squatted.
	_, _, e = unix.RawSyscall6(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM, 0, uintptr(unsafe.Pointer(&fds[0])), 0, 0)
	if e != 0 {
		return fail("socketpair: %v", e)
	}
	abstract := unix.RawSockaddrUnix{Family: unix.AF_UNIX}
	copy(abstract.Path[1:], []int8{'p', 'y', 'n', 'o', 'x', '-', 'k', 't'})
	_, _, e = unix.RawSyscall(unix.SYS_BIND, uintptr(fds[0]), uintptr(unsafe.Pointer(&abstract)), 2+1+8)
	report("bind_abstract", e)
	unix.Close(int(fds[0]))
	unix.Close(int(fds[1]))
	_, _, e = unix.RawSyscall6(unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG, 0, 0, 0, 0, 0)
	report("prctl_set_pdeathsig", e)
	var sig int32
	_, _, e = unix.RawSyscall6(unix.SYS_PRCTL, unix.PR_GET_PDEATHSIG, uintptr(unsafe.Pointer(&sig)), 0, 0, 0, 0)
	report("prctl_get_pdeathsig", e)
	_, _, e = unix.RawSyscall6(unix.SYS_PRCTL, unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_STRICT, 0, 0, 0, 0)
	report("prctl_set_seccomp", e)
	_, _, e = unix.RawSyscall6(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, 1, 0, 0, 0, 0)
	report("prctl_set_dumpable", e)
	_, _, e = unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_STRICT, 0, 0)
	report("seccomp_strict", e)

	// Second review: real-time signals, fallocate modes, other processes'
	// clocks and sessions. A pid no process has answers ESRCH when the
	// kernel sees the call.
	const nobody = 0x7ffffff0
	_, _, e = unix.RawSyscall(unix.SYS_KILL, nobody, 0, 0)
	report("kill_sig0", e)
	_, _, e = unix.RawSyscall(unix.SYS_KILL, nobody, uintptr(unix.SIGTERM), 0)
	report("kill_sigterm", e)
	_, _, e = unix.RawSyscall(unix.SYS_KILL, nobody, 32, 0)
	report("kill_sigrtmin", e)
	_, _, e = unix.RawSyscall(unix.SYS_KILL, nobody, 64|1<<32, 0)
	report("kill_sig64_high", e)
	_, _, e = unix.RawSyscall(unix.SYS_KILL, nobody, ^uintptr(0), 0)
	report("kill_negative", e)
	_, _, e = unix.RawSyscall(unix.SYS_TGKILL, uintptr(os.Getpid()), nobody, 33)
	report("tgkill_sigrtmin1", e)
	_, _, e = unix.RawSyscall(unix.SYS_TGKILL, uintptr(os.Getpid()), nobody, uintptr(unix.SIGURG))
	report("tgkill_sigurg", e)
	_, _, e = unix.RawSyscall(unix.SYS_TKILL, nobody, uintptr(unix.SIGTERM), 0)
	report("tkill", e)
	_, _, e = unix.RawSyscall6(unix.SYS_FALLOCATE, tmpFd, 0, 0, 4096, 0, 0)
	report("fallocate_0", e)
	_, _, e = unix.RawSyscall6(unix.SYS_FALLOCATE, tmpFd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096, 0, 0)
	report("fallocate_punch_hole", e)
	_, _, e = unix.RawSyscall6(unix.SYS_FALLOCATE, tmpFd, unix.FALLOC_FL_KEEP_SIZE, 0, 1<<20, 0, 0)
	report("fallocate_keep_size", e)
	_, _, e = unix.RawSyscall6(unix.SYS_FALLOCATE, tmpFd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, 0, 1<<20, 0, 0)
	report("fallocate_zero_range_keep_size", e)
	var ts unix.Timespec
	clock := func(pid int, which uintptr) uintptr { return uintptr(uint32(int32(^pid)<<3)) | which }
	_, _, e = unix.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_PROCESS_CPUTIME_ID, uintptr(unsafe.Pointer(&ts)), 0)
	report("clock_process_cputime", e)
	_, _, e = unix.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_THREAD_CPUTIME_ID, uintptr(unsafe.Pointer(&ts)), 0)
	report("clock_thread_cputime", e)
	_, _, e = unix.RawSyscall(unix.SYS_CLOCK_GETTIME, clock(0, 2), uintptr(unsafe.Pointer(&ts)), 0)
	report("clock_own_pid0", e)
	_, _, e = unix.RawSyscall(unix.SYS_CLOCK_GETTIME, clock(unix.Gettid(), 4|2), uintptr(unsafe.Pointer(&ts)), 0)
	report("clock_own_thread", e)
	_, _, e = unix.RawSyscall(unix.SYS_CLOCK_GETTIME, clock(int(ppid), 2), uintptr(unsafe.Pointer(&ts)), 0)
	report("clock_parent", e)
	_, _, e = unix.RawSyscall(unix.SYS_CLOCK_GETRES, clock(int(ppid), 2), uintptr(unsafe.Pointer(&ts)), 0)
	report("clock_getres_parent", e)
	var timer int32
	_, _, e = unix.RawSyscall(unix.SYS_TIMER_CREATE, clock(int(ppid), 2), 0, uintptr(unsafe.Pointer(&timer)))
	report("timer_create_parent", e)
	_, _, e = unix.RawSyscall(unix.SYS_GETSID, 0, 0, 0)
	report("getsid_self", e)
	_, _, e = unix.RawSyscall(unix.SYS_GETSID, ppid, 0, 0)
	report("getsid_parent", e)
	_, _, e = unix.RawSyscall(unix.SYS_GETPGID, ppid, 0, 0)
	report("getpgid_parent", e)

	runtime.KeepAlive(argv)
	runtime.KeepAlive(envv)
	runtime.KeepAlive(tmp)
	return 0
}

// threadIDs returns the ids of the threads of this process.
func threadIDs() map[int]bool {
	ents, _ := os.ReadDir("/proc/self/task")
	ids := make(map[int]bool, len(ents))
	for _, e := range ents {
		if id, err := strconv.Atoi(e.Name()); err == nil {
			ids[id] = true
		}
	}
	return ids
}

// probeWant checks the errno a probe reported.
type probeWant struct {
	name  string
	check func(t *testing.T, got syscall.Errno)
}

func is(want syscall.Errno) func(*testing.T, syscall.Errno) {
	return func(t *testing.T, got syscall.Errno) {
		require.Equalf(t, want, got, "want %q (%d), got %q (%d)", errName(want), int(want), errName(got), int(got))
	}
}

// notEPERM accepts any result the filter did not produce itself.
func notEPERM(t *testing.T, got syscall.Errno) {
	require.NotEqualf(t, unix.EPERM, got, "got EPERM")
}

func errName(e syscall.Errno) string {
	if e == 0 {
		return "success"
	}
	return unix.ErrnoName(e)
}

func kernelExpectations(allowNetwork bool) []probeWant {
	want := []probeWant{
		{"getpid", is(0)},
		{"execve", is(unix.EPERM)},
		{"clone_fork", is(unix.EPERM)},
		{"clone3", is(unix.ENOSYS)},
		{"thread_create", is(0)},
		{"socket_unix", is(unix.EPERM)},
		{"socket_netlink", is(unix.EPERM)},
		{"socketpair", is(0)},
		{"ptrace_attach", is(unix.EPERM)},
		{"pidfd_open_parent", is(unix.EPERM)},
		{"unshare", is(unix.EPERM)},
		{"mount", is(unix.EPERM)},
		{"bpf", is(unix.EPERM)},
		{"io_uring_setup", is(unix.EPERM)},
		{"keyctl", is(unix.EPERM)},
		{"setuid", is(unix.EPERM)},
		{"fchmodat", is(unix.EPERM)},
		{"fchmod", is(unix.EPERM)},
		{"ioctl_tiocsti", is(unix.EPERM)},
		{"ioctl_tcgets", is(unix.ENOTTY)}, // stdin is /dev/null: the call reached the kernel
		{"prlimit64_other", is(unix.EPERM)},
		{"prlimit64_self", is(0)},
		{"personality_set", is(unix.EPERM)},
		{"personality_query", is(0)},
		{"utimensat_path", is(unix.EPERM)},
		{"utimensat_fd", is(unix.EPERM)},
		{"file_setattr", is(unix.EPERM)},
		{"syscall_470", is(unix.EPERM)},
		{"syscall_471", is(unix.EPERM)},
		{"syscall_500", is(unix.EPERM)},
		{"syscall_520", is(unix.EPERM)},
		{"syscall_1000", is(unix.EPERM)},
		{"syscall_4095", is(unix.EPERM)},
		{"io_setup", is(unix.EPERM)},
		{"listmount", is(unix.EPERM)},
		{"ioctl_fs_ioc_setflags", is(unix.EPERM)},
		{"ioctl_fs_ioc_setflags_high", is(unix.EPERM)},
		{"fcntl_setlease", is(unix.EPERM)},
		{"fcntl_getfd", is(0)},
		{"fcntl_getfd_high", is(0)},
		{"socketpair_cloexec", is(0)},
		{"socketpair_dgram", is(unix.EPERM)},
		{"socketpair_seqpacket", is(unix.EPERM)},
		{"socketpair_netlink", is(unix.EPERM)},
		{"socketpair_vsock", is(unix.EPERM)},
		{"socketpair_inet", is(unix.EPERM)},
		{"prctl_set_pdeathsig", is(unix.EPERM)},
		{"prctl_get_pdeathsig", is(0)},
		{"prctl_set_seccomp", is(unix.EPERM)},
		{"prctl_set_dumpable", is(unix.EPERM)},
		{"seccomp_strict", is(unix.EPERM)},
		{"kill_sig0", is(unix.ESRCH)},
		{"kill_sigterm", is(unix.ESRCH)},
		{"kill_sigrtmin", is(unix.EPERM)},
		{"kill_sig64_high", is(unix.EPERM)},
		{"kill_negative", is(unix.EPERM)},
		{"tgkill_sigrtmin1", is(unix.EPERM)},
		{"tgkill_sigurg", is(unix.ESRCH)},
		{"tkill", is(unix.EPERM)},
		{"fallocate_0", is(0)},
		{"fallocate_punch_hole", notEPERM}, // EOPNOTSUPP on a file system without holes
		{"fallocate_keep_size", is(unix.EOPNOTSUPP)},
		{"fallocate_zero_range_keep_size", is(unix.EOPNOTSUPP)},
		{"clock_process_cputime", is(0)},
		{"clock_thread_cputime", is(0)},
		{"clock_own_pid0", is(0)},
		{"clock_own_thread", is(0)},
		{"clock_parent", is(unix.EPERM)},
		{"clock_getres_parent", is(unix.EPERM)},
		{"timer_create_parent", is(unix.EPERM)},
		{"getsid_self", is(0)},
		{"getsid_parent", is(unix.EPERM)},
		{"getpgid_parent", is(unix.EPERM)},
	}
	if allowNetwork {
		want = append(want,
			probeWant{"bind_abstract", is(0)}, // the network's calls: see the package doc
			probeWant{"socket_inet", is(0)},
			probeWant{"socket_inet6", notEPERM}, // EAFNOSUPPORT is fine without IPv6
		)
	} else {
		want = append(want,
			probeWant{"bind_abstract", is(unix.EPERM)},
			probeWant{"socket_inet", is(unix.EPERM)},
			probeWant{"socket_inet6", is(unix.EPERM)},
		)
	}
	if nativeTable.x32 {
		want = append(want, probeWant{"getpid_x32", is(unix.EPERM)})
	}
	for _, name := range []string{"fork", "vfork"} {
		if _, ok := nativeTable.lookup(name); ok {
			want = append(want, probeWant{name, is(unix.EPERM)})
		}
	}
	if _, ok := nativeTable.lookup("chmod"); ok {
		want = append(want, probeWant{"chmod", is(unix.EPERM)})
	}
	return want
}

// TestKernelFilter installs each policy variant in a re-executed copy of the
// test binary and checks what real system calls return under it.
func TestKernelFilter(t *testing.T) {
	if _, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); errors.Is(err, unix.EINVAL) {
		t.Skip("seccomp is not available in this kernel (PR_GET_SECCOMP: EINVAL)")
	}
	for _, v := range []struct {
		variant      string
		allowNetwork bool
	}{
		{"deny", false},
		{"allow", true},
	} {
		t.Run(v.variant, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(os.Args[0], "-test.run=^TestKernelFilter$", "-test.count=1")
			cmd.Env = append(os.Environ(), childEnv+"="+v.variant)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			require.NoError(t, err, "child failed\nstdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())

			got := map[string]syscall.Errno{}
			sc := bufio.NewScanner(&stdout)
			for sc.Scan() {
				fields := strings.Fields(sc.Text())
				require.Len(t, fields, 2, "bad child output line %q", sc.Text())
				n, err := strconv.Atoi(fields[1])
				require.NoError(t, err, sc.Text())
				require.NotContains(t, got, fields[0], "probe reported twice")
				got[fields[0]] = syscall.Errno(n)
			}
			want := kernelExpectations(v.allowNetwork)
			require.Len(t, got, len(want), "child output:\n%s", stdout.String())
			for _, w := range want {
				t.Run(w.name, func(t *testing.T) {
					e, ok := got[w.name]
					require.True(t, ok, "probe %s missing from child output:\n%s", w.name, stdout.String())
					w.check(t, e)
				})
			}
		})
	}
}
