//go:build linux

// Package seccomp builds the classic-BPF seccomp filter that confines a pynox
// job.
//
// The filter comes in two layers (see Layers), each installed with
// prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &sock_fprog) after
// no_new_privs is set: the long Template layer once by the template
// process, before its first fork, and the short Job layer by every spare it
// forks, which inherits the first. The Go side only produces the programs
// as data (see Program.Bytes); the Python side wraps those bytes in a
// struct sock_fprog and applies them. What follows is the policy of the
// two layers together.
//
// # Default deny
//
// The policy is an allow list: a system call the filter does not name
// fails with EPERM (SECCOMP_RET_ERRNO|EPERM), so that Python sees an
// ordinary PermissionError, and so does every system call number the
// kernel adds after the list was written (file_setattr, 469, is how a deny
// list was shown to fail) and every number beyond the highest the kernel
// knows. The list was measured, not guessed: a workload of numpy and
// pandas (CSV, JSON and pickle round trips, groupby, merge, resample,
// time zones, linear algebra, FFT) and of the standard library (threads,
// asyncio, select, poll and epoll, signals and timers, sqlite3, zipfile,
// tarfile, gzip, tempfile, shutil, fcntl locks, mmap, ssl, uuid, locale)
// was traced with strace -f, alone and inside the pool (the template and
// its spares, under the filter, where every EPERM shows), and once with
// SECCOMP_RET_LOG as the default action; the pool's test suite, the
// hostile corpus and the Go test binary that probes the filter in the
// kernel run under it. Each system call seen was added or left out on
// purpose (see sharedAllow and the tables of each architecture). What the
// list allows with any arguments:
// file and descriptor I/O (open, stat, read, write, directories, links,
// renames, pipes; Landlock decides which paths), memory management
// (memfd_create included: the memory it holds is bounded by the job's
// cgroup where the pool has one), the process's own identity, limits,
// signal handling, threads, timers (clock_gettime and timer_create are
// filtered by clock, kill and tgkill by signal), waiting (futex, poll, select,
// epoll, eventfd, signalfd), getrandom, the operations on sockets the job
// already holds, and Landlock's own calls (which only restrict further).
//
// # Argument filters
//
// Some calls are allowed only for some arguments. Where the kernel reads an
// argument as a 32-bit int or unsigned int (ioctl's request, fcntl's
// command, prctl's option, socket's and socketpair's domain and type,
// the signal of kill and tgkill, fallocate's mode, a clock id) only the
// low 32 bits are compared, exactly the bits the kernel acts on; where it
// reads 64 bits (a pid of prlimit64, the selectors of the scheduling
// calls) all 64 are, and so are the pids of getsid and getpgid (the
// stricter reading: a pid 0 with junk in the high half is refused).
//
//   - A system call made with a foreign audit architecture (for example i386
//     compat calls on amd64 or AArch32 calls on arm64) kills the whole process
//     (SECCOMP_RET_KILL_PROCESS), because the syscall numbers below would not
//     mean the same thing. On amd64 every x32 system call (nr >=
//     __X32_SYSCALL_BIT) fails with EPERM.
//   - Process creation is denied: fork, vfork, execve, execveat and any clone
//     that does not create a thread (CLONE_THREAD clear) or that requests a new
//     namespace. clone3 fails with ENOSYS instead, so that the C library falls
//     back to clone, whose flags the filter can inspect. pidfd_open and
//     seccomp are denied too. (The template, which forks and opens pidfds,
//     has only the first layer: clone, fork, pidfd_open and seccomp are the
//     job layer's.)
//   - socket is denied for every domain, unless Policy.AllowNetwork is set, in
//     which case AF_INET and AF_INET6 sockets are allowed; connect, bind,
//     listen, accept and accept4 need the network too, and so do sendmsg
//     and sendmmsg, the only calls that put descriptors in flight
//     (SCM_RIGHTS): without the network a job passes no descriptor
//     (counted per uid across the machine while in flight, and food for
//     the unix sockets' garbage collector), and sends with send and
//     write. socketpair is
//     allowed only as AF_UNIX with SOCK_STREAM (SOCK_NONBLOCK and
//     SOCK_CLOEXEC aside): a datagram pair could sendto a host socket by
//     path, and after connect(AF_UNSPEC) bind an abstract name; other
//     domains reach netlink, vsock or inet code. (asyncio's self-pipe is
//     such a stream pair.) A job granted the network may still bind an
//     abstract name to a stream pair's half, squatting the name, though
//     it can neither listen nor receive on it: seccomp cannot see the
//     address family of bind's socket.
//   - ioctl is allowed only for TCGETS and TIOCGWINSZ (isatty,
//     os.get_terminal_size), FIONREAD, FIONBIO, FIOCLEX and FIONCLEX:
//     FS_IOC_SETFLAGS, TIOCSTI, TIOCLINUX and every other request fail.
//   - fcntl is allowed only for F_DUPFD, F_DUPFD_CLOEXEC, F_GETFD, F_SETFD,
//     F_GETFL, F_SETFL, the record and open-file-description locks
//     (F_GETLK, F_SETLK, F_SETLKW, F_OFD_*), F_GETPIPE_SZ and the memfd seals
//     (F_ADD_SEALS, F_GET_SEALS). F_SETLEASE (a lease on a file the job may
//     only read blocks its writers), F_NOTIFY, F_SETOWN*, F_SETSIG and
//     F_SETPIPE_SZ fail.
//   - prctl is allowed only for PR_GET_PDEATHSIG, PR_GET_DUMPABLE,
//     PR_SET_NAME, PR_GET_NAME, PR_GET_SECCOMP, PR_CAPBSET_READ,
//     PR_SET_NO_NEW_PRIVS and PR_GET_NO_NEW_PRIVS, and in the template
//     layer also PR_SET_PDEATHSIG and PR_SET_SECCOMP, which a spare needs
//     before its job layer goes on and which the job layer denies: a job
//     can neither clear its parent-death signal nor add filters.
//   - prlimit64 is only allowed on the calling process (pid 0) and
//     personality only as a query (0xffffffff). setpriority (PRIO_PROCESS
//     only), sched_setaffinity, sched_setscheduler, sched_setparam and
//     sched_setattr are only allowed on the calling process, so a job
//     cannot slow down other processes of its uid.
//   - kill and tgkill are allowed only for the signals below SIGRTMIN
//     (the low 32 bits of the signal, unsigned, below 32: a negative
//     number is refused too), and tkill is denied. A real-time signal
//     that the receiver blocks is queued once per kill, and queued
//     signals are counted per uid across the whole machine: a job that
//     filled the count made timer_create fail for every process of the
//     uid. (The runner also sets the job's RLIMIT_SIGPENDING to 64, which
//     bounds the timers it can create.) CPython sends no real-time
//     signal; glibc uses SIGRTMIN and SIGRTMIN+1 for pthread_cancel and
//     the set*id broadcast, neither of which a job can use anyway.
//   - sendto, recvfrom, sendmsg, recvmsg, sendmmsg and recvmmsg fail
//     when their flags hold MSG_OOB: out-of-band data on a unix stream
//     socket (every job's socketpair and control socket) is kernel code
//     no job needs, through which a use-after-free was reached from
//     Chrome's renderer sandbox (CVE-2025-38236); TCP urgent data is
//     refused with it.
//   - open, creat and openat fail when their mode holds S_ISUID or
//     S_ISGID: a job (the pool's uid, often root, without CAP_FSETID)
//     could otherwise leave an empty set-user-ID root file in a write
//     grant, which keeps the bit when a privileged host program writes
//     over it. openat2, whose mode the filter cannot read, fails with
//     ENOSYS (as before Linux 5.6) so that callers fall back to openat.
//   - umask is allowed only with a mask that holds S_IWGRP and S_IWOTH
//     (022): chmod being denied, a file's creation mode is its mode for
//     good, and a job that cleared its umask left root-owned files and
//     directories that every local user could write (0666, 01777) in its
//     write grants. The runner sets the job's umask to at least 022.
//   - fallocate is allowed only with mode 0 (posix_fallocate, bounded by
//     RLIMIT_FSIZE) and FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE (which
//     frees blocks); every other mode, FALLOC_FL_KEEP_SIZE above all
//     (blocks past the end of the file, where RLIMIT_FSIZE does not
//     look), fails with EOPNOTSUPP, as on a file system without the
//     mode, so that callers fall back or skip the hint.
//   - clock_gettime, clock_getres, clock_nanosleep and timer_create are
//     allowed only on the static clocks (a clock id that is not negative
//     as an int), the caller's own process CPU clocks (pid 0: ids -8, -7,
//     -6; CLOCK_PROCESS_CPUTIME_ID is 2) and the CPU clocks of threads
//     (the kernel accepts only the caller's own): the CPU clock of
//     another process, ((~pid) << 3) | which, would tell a job how much
//     CPU its template or a sibling used, and a descriptor's dynamic
//     clock is no job's business. getsid and getpgid are allowed only
//     with pid 0 (os.getsid(0), os.getpgrp). A process CPU clock named
//     by the job's own pid (clock_getcpuclockid(getpid())) fails too.
//
// Left out of the list on purpose, among others (each tested to fail with
// EPERM): changing a file's mode, owner, extended attributes, timestamps
// or flags in any form (chmod, chown, the xattr setters, utimensat,
// file_setattr: Landlock does not mediate metadata); System V IPC, POSIX
// message queues, inotify and fanotify (outside what Landlock sees);
// ptrace, process_vm_*, pidfd_getfd, kcmp; bpf, perf_event_open,
// userfaultfd, io_uring, AIO (io_setup family), the keyctl family; the
// mount family and the new mount API (fsopen, open_tree, listmount,
// statmount); unshare, setns, chroot, pivot_root; open_by_handle_at;
// kexec, modules, reboot, swap, clock setting, syslog, acct, quotactl;
// the setuid family and capset (the template layer allows capset, and
// setns with nstype CLONE_NEWUSER or CLONE_NEWNS only, for a spare that
// enters its job's mount namespace before its job layer); mlock, mlock2 and mlockall (mmap's
// MAP_LOCKED fails too: the runner sets RLIMIT_MEMLOCK to 0); sync and
// syncfs.
package seccomp

import (
	"fmt"
	"runtime"
	"slices"

	"golang.org/x/sys/unix"
)

// Policy selects the variant of the filter.
type Policy struct {
	// AllowNetwork, when true, allows socket() for the AF_INET and AF_INET6
	// domains, and connect, bind, listen, accept, accept4, sendmsg and
	// sendmmsg; when false all of them fail with EPERM. socketpair() is allowed as an AF_UNIX
	// stream pair either way.
	AllowNetwork bool
}

// Program is a classic BPF seccomp program, one unix.SockFilter per
// instruction.
type Program []unix.SockFilter

// Seccomp return actions, to be combined with 16 bits of data (for
// ActionErrno, the errno value).
const (
	// ActionKillProcess kills the whole process as if by an unblockable SIGSYS.
	ActionKillProcess uint32 = unix.SECCOMP_RET_KILL_PROCESS
	// ActionErrno makes the system call fail with the errno held in the low 16 bits.
	ActionErrno uint32 = unix.SECCOMP_RET_ERRNO
	// ActionAllow lets the system call run normally.
	ActionAllow uint32 = unix.SECCOMP_RET_ALLOW
)

// x32SyscallBit is __X32_SYSCALL_BIT from arch/x86/include/uapi/asm/unistd.h.
const x32SyscallBit = 0x40000000

// cloneNamespaceFlags are the clone flags that create a new namespace.
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWTIME

// Offsets into struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offIP   = 8
	offArgs = 16
)

const (
	retKill   = ActionKillProcess
	retAllow  = ActionAllow
	retEPERM  = ActionErrno | uint32(unix.EPERM)
	retENOSYS = ActionErrno | uint32(unix.ENOSYS)
	// retEOPNOTSUPP answers a fallocate mode the filter refuses, as a file
	// system without that mode would: callers fall back (glibc's
	// posix_fallocate emulates mode 0 on it) or skip the hint.
	retEOPNOTSUPP = ActionErrno | uint32(unix.EOPNOTSUPP)
	// retEINVAL answers an madvise advice the filter refuses, as a kernel
	// built without it (KSM, say) would.
	retEINVAL = ActionErrno | uint32(unix.EINVAL)
	// retNoop answers success without running the call: errno 0. For
	// posix_fadvise(POSIX_FADV_DONTNEED), which is advice (callers go on
	// whatever it did).
	retNoop = ActionErrno
)

// oobCall is a send or receive call and the index of its flags argument.
type oobCall struct{ nr, arg uint32 }

// umaskRequired are the bits every umask a job sets must hold (S_IWGRP
// and S_IWOTH): chmod is denied to a job, so the mode a file or directory
// is created with is its mode for good, and Python creates every file
// with 0666 and every directory with 0777, relying on the umask. A job
// (the pool's uid, often root) that cleared its umask left files mode
// 0666 and directories mode 01777 in its write grants, which every local
// user of the host could then write (review 22). The runner sets the
// job's umask to at least 022 (see runner.py, Template.init).
const umaskRequired = unix.S_IWGRP | unix.S_IWOTH

// setIDModeBits are the mode bits no file a job creates may carry:
// S_ISUID and S_ISGID. The job runs as the pool's uid (often root)
// without CAP_FSETID: the kernel clears them at the job's own first write
// or truncation, but not at a write by a process that holds the
// capability, so an empty set-user-ID file left in a write grant becomes
// a set-user-ID root program once a privileged host program writes over
// it by name.
const setIDModeBits = unix.S_ISUID | unix.S_ISGID

// openModeCalls returns the calls that create a file with a mode of
// their argument, and the index of that argument, that the table has
// (open and creat exist on amd64 only).
func (t *archTable) openModeCalls() []oobCall {
	var out []oobCall
	for _, c := range []struct {
		name string
		arg  uint32
	}{{"open", 2}, {"creat", 1}, {"openat", 3}} {
		if nr, ok := t.lookup(c.name); ok {
			out = append(out, oobCall{nr, c.arg})
		}
	}
	return out
}

// oobCalls are the calls whose flags may not hold MSG_OOB: out-of-band
// data on unix stream sockets (the socketpair every job may make, its
// control socket) is code no job needs and has been a way into the
// kernel from sandboxes (CVE-2025-38236, a use-after-free reached with
// MSG_OOB from Chrome's renderer); TCP's urgent data is as rare.
var oobCalls = []oobCall{
	{unix.SYS_SENDTO, 3}, {unix.SYS_RECVFROM, 3},
	{unix.SYS_SENDMSG, 2}, {unix.SYS_RECVMSG, 2},
	{unix.SYS_SENDMMSG, 3}, {unix.SYS_RECVMMSG, 3},
}

// The argument values the filters allow (or, in the job layer, deny).
var (
	// allowedFcntls are the fcntl commands a job may use.
	// allowedMadvise is every madvise advice but those that reach beyond
	// the job's own memory: MADV_MERGEABLE and MADV_UNMERGEABLE (KSM:
	// where the host runs it, merging tells a job whether another
	// process holds the same page), MADV_COLD and MADV_PAGEOUT (they
	// evict the page cache of files every job maps, the runtime's, which
	// jobs share and can tell cached from not: review 33),
	// MADV_HWPOISON and MADV_SOFT_OFFLINE (privileged anyway).
	allowedMadvise = []uint32{
		unix.MADV_NORMAL, unix.MADV_RANDOM, unix.MADV_SEQUENTIAL, unix.MADV_WILLNEED,
		unix.MADV_DONTNEED, unix.MADV_FREE, unix.MADV_REMOVE, unix.MADV_DONTFORK, unix.MADV_DOFORK,
		unix.MADV_HUGEPAGE, unix.MADV_NOHUGEPAGE, unix.MADV_DONTDUMP, unix.MADV_DODUMP,
		unix.MADV_WIPEONFORK, unix.MADV_KEEPONFORK, unix.MADV_POPULATE_READ, unix.MADV_POPULATE_WRITE,
		madvDontneedLocked, madvCollapse, unix.MADV_GUARD_INSTALL, unix.MADV_GUARD_REMOVE,
	}
	// allowedFadvise is every posix_fadvise advice but
	// POSIX_FADV_DONTNEED, which evicts the file's pages from the page
	// cache that all jobs share (review 33); it becomes a no-op
	// (retNoop).
	allowedFadvise = []uint32{
		unix.FADV_NORMAL, unix.FADV_RANDOM, unix.FADV_SEQUENTIAL, unix.FADV_WILLNEED, unix.FADV_NOREUSE,
	}
	allowedFcntls = []uint32{
		unix.F_DUPFD, unix.F_DUPFD_CLOEXEC, unix.F_GETFD, unix.F_SETFD, unix.F_GETFL, unix.F_SETFL,
		unix.F_GETLK, unix.F_SETLK, unix.F_SETLKW, unix.F_OFD_GETLK, unix.F_OFD_SETLK, unix.F_OFD_SETLKW,
		unix.F_GETPIPE_SZ, unix.F_ADD_SEALS, unix.F_GET_SEALS,
	}
	// allowedPrctls are the prctl options the template layer allows.
	allowedPrctls = []uint32{
		unix.PR_SET_PDEATHSIG, unix.PR_GET_PDEATHSIG, unix.PR_GET_DUMPABLE, unix.PR_SET_NAME, unix.PR_GET_NAME,
		unix.PR_GET_SECCOMP, unix.PR_SET_SECCOMP, unix.PR_CAPBSET_READ, unix.PR_SET_NO_NEW_PRIVS,
		unix.PR_GET_NO_NEW_PRIVS, unix.PR_CAPBSET_DROP,
	}
	// setnsTypes are the namespace types setns may enter in the template
	// layer (the job layer denies setns): a spare enters its job's user
	// and mount namespaces (see internal/mountns).
	setnsTypes = []uint32{unix.CLONE_NEWUSER, unix.CLONE_NEWNS}
	// jobDeniedPrctls are the options of allowedPrctls the job layer
	// denies: the spare sets its parent-death signal and attaches the job
	// layer itself, and a job may do neither.
	jobDeniedPrctls = []uint32{unix.PR_SET_PDEATHSIG, unix.PR_SET_SECCOMP, unix.PR_CAPBSET_DROP}
	// socketTypeFlags are the flags socket and socketpair accept in their
	// type argument besides the type itself.
	socketTypeFlags uint32 = unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC
)

// sysEntry names one system call number of an architecture.
type sysEntry struct {
	name string
	nr   uint32
}

// archTable holds everything architecture specific about the policy.
type archTable struct {
	goarch    string
	auditArch uint32
	auditName string
	x32       bool // deny the x32 ABI (nr >= __X32_SYSCALL_BIT)

	// System calls with argument-dependent rules.
	clone, clone3, socket, socketpair, ioctl, fcntl, prctl, prlimit64, personality uint32

	// ioctls are the ioctl requests allowed (their values differ between
	// architecture families).
	ioctls []uint32

	// allow lists the system calls both layers allow with any arguments.
	allow []sysEntry

	// jobDeny lists the system calls the template layer allows (the
	// template or a spare's preparation needs them) and the job layer
	// denies with EPERM.
	jobDeny []sysEntry

	// netOnly lists the system calls the template layer allows and the
	// job layer denies without the network.
	netOnly []sysEntry

	// deny names system calls the filter leaves out on purpose. The
	// filter denies every system call it does not allow, so this list
	// only serves the tests (each entry must fail with EPERM, and none may
	// be allowed) and the disassembly.
	deny []sysEntry
}

// special returns the argument-dependent system calls with their names.
func (t *archTable) special() []sysEntry {
	return []sysEntry{
		{"clone", t.clone},
		{"clone3", t.clone3},
		{"socket", t.socket},
		{"socketpair", t.socketpair},
		{"ioctl", t.ioctl},
		{"fcntl", t.fcntl},
		{"prctl", t.prctl},
		{"prlimit64", t.prlimit64},
		{"personality", t.personality},
	}
}

// selfEntry is a system call allowed only on the calling process: every
// listed argument must be zero (all 64 bits).
type selfEntry struct {
	name string
	nr   uint32
	args []uint32
}

// selfOnly lists the scheduling calls a job may make on itself but not on
// other processes of its uid, which it could otherwise slow down.
// setpriority(which, who, prio) needs which == PRIO_PROCESS and who == 0:
// PRIO_USER with who 0 would renice every process of the uid.
func (t *archTable) selfOnly() []selfEntry {
	return []selfEntry{
		{"setpriority", unix.SYS_SETPRIORITY, []uint32{0, 1}},
		{"sched_setaffinity", unix.SYS_SCHED_SETAFFINITY, []uint32{0}},
		{"sched_setscheduler", unix.SYS_SCHED_SETSCHEDULER, []uint32{0}},
		{"sched_setparam", unix.SYS_SCHED_SETPARAM, []uint32{0}},
		{"sched_setattr", unix.SYS_SCHED_SETATTR, []uint32{0}},
	}
}

// templateAllow is everything the template layer allows with any
// arguments: clone (the template forks with it; the job layer filters
// it), the allow list, and what the job layer denies.
func (t *archTable) templateAllow() []sysEntry {
	return slices.Concat([]sysEntry{{"clone", t.clone}}, t.allow, t.jobDeny, t.netOnly)
}

// The argument values of the filters on signals, fallocate and clocks.
const (
	// firstRTSignal is SIGRTMIN as the kernel numbers it: kill and tgkill
	// are allowed only for the signals below it (0 included).
	firstRTSignal = 32
	// The madvise advices x/sys/unix does not name.
	madvDontneedLocked = 24
	madvCollapse       = 25
	// fallocPunchHoleKeepSize is FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE,
	// the only mode besides 0 that fallocate allows.
	fallocPunchHoleKeepSize = unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE
	// clockSign is the sign bit of a clockid_t (an int).
	clockSign = 0x80000000
	// clockPerThread is CPUCLOCK_PERTHREAD_MASK: a negative clock id with
	// it set is the CPU clock of a thread, which the kernel only accepts
	// for a thread of the caller's own process.
	clockPerThread = 4
	// clockSelfProcess is the lowest clock id of the calling process's
	// own CPU clocks, ((~0) << 3) | which for which 0..2 (-8, -7, -6);
	// clockSelfFD, -5, is ((~0) << 3) | CLOCKFD, the dynamic clock of
	// descriptor 0, which is denied.
	clockSelfProcess = 0xfffffff8
	clockSelfFD      = 0xfffffffb
)

// argFiltered lists the system calls filtered by argument that every
// architecture shares: the signals, fallocate, the clocks and the
// session and group queries (see buildTemplate).
func (t *archTable) argFiltered() []sysEntry {
	return []sysEntry{
		{"kill", unix.SYS_KILL},
		{"tgkill", unix.SYS_TGKILL},
		{"fallocate", unix.SYS_FALLOCATE},
		{"madvise", unix.SYS_MADVISE},
		{"fadvise64", unix.SYS_FADVISE64},
		{"preadv2", unix.SYS_PREADV2},
		{"pwritev2", unix.SYS_PWRITEV2},
		{"clock_gettime", unix.SYS_CLOCK_GETTIME},
		{"clock_getres", unix.SYS_CLOCK_GETRES},
		{"clock_nanosleep", unix.SYS_CLOCK_NANOSLEEP},
		{"timer_create", unix.SYS_TIMER_CREATE},
		{"getsid", unix.SYS_GETSID},
		{"getpgid", unix.SYS_GETPGID},
		{"umask", unix.SYS_UMASK},
	}
}

// entries returns every system call the table names, with its name.
func (t *archTable) entries() []sysEntry {
	all := slices.Concat(t.special(), t.argFiltered(), t.allow, t.jobDeny, t.netOnly, t.deny)
	for _, e := range t.selfOnly() {
		all = append(all, sysEntry{e.name, e.nr})
	}
	return all
}

// syscallNames maps every system call number the policy mentions to its name.
func (t *archTable) syscallNames() map[uint32]string {
	m := make(map[uint32]string, 512)
	for _, e := range t.entries() {
		m[e.nr] = e.name
	}
	return m
}

// lookup returns the number of the named system call if the table names it.
func (t *archTable) lookup(name string) (uint32, bool) {
	for _, e := range t.entries() {
		if e.name == name {
			return e.nr, true
		}
	}
	return 0, false
}

// maxNr returns the highest system call number the table names.
func (t *archTable) maxNr() uint32 {
	var m uint32
	for _, e := range t.entries() {
		m = max(m, e.nr)
	}
	return m
}

// tableFor returns the table for goarch, or an error naming the architecture
// if the policy does not support it.
func tableFor(goarch string) (*archTable, error) {
	if nativeTable == nil || nativeTable.goarch != goarch {
		return nil, fmt.Errorf("seccomp: unsupported architecture %q", goarch)
	}
	return nativeTable, nil
}

// Layers is the filter as the pool installs it: two programs, each
// attached with its own prctl. The kernel runs every filter a process has
// and the most restrictive answer wins (Layers.Run does the same), so a
// spare confined by both gets exactly the policy the package documents.
//
// Attaching a filter costs the kernel time in proportion to its length (it
// converts and JIT-compiles the program, and runs it once for every
// system call number to build its per-syscall action cache). The template
// therefore attaches the long, policy-independent layer once, before its
// first fork, and every spare inherits it; each spare attaches only the
// short job layer.
type Layers struct {
	// Template is everything that the template process itself may live
	// under: the architecture checks, the x32 ABI, the allow list, the
	// argument filters (clone3, socket, socketpair, ioctl, fcntl, the
	// send and receive calls' MSG_OOB, the set-ID bits of open, creat
	// and openat, openat2's ENOSYS, prctl, prlimit64, personality,
	// the scheduling calls, kill and tgkill, umask,
	// fallocate, the clocks and timer_create, getsid and getpgid) and the
	// default EPERM. It also allows what only the template and a spare's
	// preparation need (clone without CLONE_THREAD, fork, pidfd_open,
	// seccomp, prctl's PR_SET_PDEATHSIG and PR_SET_SECCOMP) and the
	// network calls a job with the network needs.
	Template Program
	// Job is what only a job is denied: clone unless it creates a thread
	// in no new namespace, fork (amd64), pidfd_open, seccomp,
	// PR_SET_PDEATHSIG and PR_SET_SECCOMP, and without AllowNetwork every
	// socket, connect, bind, listen, accept, accept4, sendmsg and
	// sendmmsg.
	Job Program
}

// Run returns the action the kernel takes for d under both layers: each
// program runs, and the answer whose action (the high 16 bits, compared as
// a signed number, so that SECCOMP_RET_KILL_PROCESS is the most
// restrictive) is lowest wins; of two equal actions, the newer layer's
// (Job's) answer is kept, as kernel/seccomp.c's seccomp_run_filters does.
func (l Layers) Run(d Data) (uint32, error) {
	ret := ActionAllow
	for _, p := range []Program{l.Job, l.Template} { // newest first
		r, err := p.Run(d)
		if err != nil {
			return 0, err
		}
		if actionOnly(r) < actionOnly(ret) {
			ret = r
		}
	}
	return ret, nil
}

// actionOnly is the kernel's ACTION_ONLY: the action bits as a signed value.
func actionOnly(r uint32) int32 { return int32(r & unix.SECCOMP_RET_ACTION_FULL) }

// Build returns the filter for p on the running architecture; amd64 and arm64
// are supported.
func Build(p Policy) (Layers, error) {
	return buildFor(runtime.GOARCH, p)
}

// buildFor builds the filter for p on goarch.
func buildFor(goarch string, p Policy) (Layers, error) {
	t, err := tableFor(goarch)
	if err != nil {
		return Layers{}, err
	}
	return build(t, p)
}

// maxChunk bounds how many consecutive JEQs share one RET, keeping every
// conditional jump offset within the 8-bit jt/jf fields.
const maxChunk = 200

func build(t *archTable, p Policy) (Layers, error) {
	// Reject tables that would make one rule shadow another, or allow
	// what they say they deny.
	seen := make(map[uint32]string)
	for _, e := range t.entries() {
		if prev, dup := seen[e.nr]; dup {
			return Layers{}, fmt.Errorf("seccomp: %s: syscall %d listed twice (%s, %s)", t.goarch, e.nr, prev, e.name)
		}
		if t.x32 && e.nr >= x32SyscallBit {
			return Layers{}, fmt.Errorf("seccomp: %s: syscall %s number %d has the x32 bit", t.goarch, e.name, e.nr)
		}
		seen[e.nr] = e.name
	}
	tpl, err := buildTemplate(t)
	if err != nil {
		return Layers{}, err
	}
	job, err := buildJob(t, p)
	if err != nil {
		return Layers{}, err
	}
	return Layers{Template: tpl, Job: job}, nil
}

// archCheck emits: kill the process unless the audit architecture is the
// native one, then load the system call number.
func (b *asm) archCheck(t *archTable) {
	b.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArch)
	b.jeq(t.auditArch, 1, 0)
	b.ret(retKill)
	b.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offNr)
}

// buildJob builds the short layer each spare attaches.
func buildJob(t *archTable, p Policy) (Program, error) {
	var b asm
	// The numbers below mean what they say only for the native
	// architecture (the template layer kills any other anyway).
	b.archCheck(t)

	// clone: only a thread (CLONE_THREAD set) in no new namespace.
	{
		skip, deny := b.label(), b.label()
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, t.clone, next, skip)
		b.loadArgLo(0)
		b.jumpL(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, unix.CLONE_THREAD, next, deny)
		b.jumpL(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, cloneNamespaceFlags, deny, next)
		b.ret(retAllow)
		b.bind(deny)
		b.ret(retEPERM)
		b.bind(skip)
	}
	// prctl: the options only the spare's preparation needed.
	b.argNotIn(t.prctl, 0, jobDeniedPrctls)
	// What the template needs and a job may not have, and the socket
	// calls without the network.
	deny := slices.Clone(t.jobDeny)
	if !p.AllowNetwork {
		deny = slices.Concat(deny, []sysEntry{{"socket", t.socket}}, t.netOnly)
	}
	b.nrIn(deny, retEPERM, retAllow)
	return b.finish()
}

// buildTemplate builds the long, policy-independent layer.
func buildTemplate(t *archTable) (Program, error) {
	var b asm

	// 1. Architecture and system call number.
	b.archCheck(t)

	// 2. The x32 ABI.
	if t.x32 {
		b.jump(unix.BPF_JMP|unix.BPF_JGE|unix.BPF_K, x32SyscallBit, 0, 1)
		b.ret(retEPERM)
	}

	// 3. The argument filters, the most frequent first: the kernel caches
	// the answer for a system call allowed whatever its arguments, so
	// these are the only ones a running job evaluates.
	// ioctl(fd, cmd, ...) and fcntl(fd, cmd, ...): the kernel takes cmd
	// as an unsigned int.
	b.argIn(t.ioctl, 1, t.ioctls)
	b.argIn(t.fcntl, 1, allowedFcntls)
	// madvise(addr, len, advice) and posix_fadvise(fd, offset, len,
	// advice): nothing that evicts what other jobs cached, or merges
	// pages with other processes' (advice is an int).
	b.argInRet(unix.SYS_MADVISE, 2, allowedMadvise, retEINVAL)
	b.argInRet(unix.SYS_FADVISE64, 3, allowedFadvise, retNoop)
	// preadv2 and pwritev2 (flags is an int): never RWF_NOWAIT, whose
	// EAGAIN tells, without timing anything, whether a page of a file is
	// in the page cache all jobs share (review 33). EOPNOTSUPP, as from
	// a file that does not support it.
	b.argFlagsClearRet(unix.SYS_PREADV2, 5, unix.RWF_NOWAIT, retEOPNOTSUPP)
	b.argFlagsClearRet(unix.SYS_PWRITEV2, 5, unix.RWF_NOWAIT, retEOPNOTSUPP)
	// send and receive calls (flags is an int): never MSG_OOB.
	for _, c := range oobCalls {
		b.argFlagsClear(c.nr, c.arg, unix.MSG_OOB)
	}
	// open, creat and openat (mode is an unsigned int): no set-user-ID
	// or set-group-ID bit in a new file's mode. openat2 takes its mode in
	// a structure the filter cannot read, so it fails with ENOSYS, as on
	// a kernel before 5.6: callers fall back to openat.
	for _, c := range t.openModeCalls() {
		b.argFlagsClear(c.nr, c.arg, setIDModeBits)
	}
	b.jeq(unix.SYS_OPENAT2, 0, 1)
	b.ret(retENOSYS)
	// prctl(option, ...): option is an int.
	b.argIn(t.prctl, 0, allowedPrctls)
	// clone3 fails with ENOSYS, so that the C library falls back to
	// clone, whose flags the job layer can inspect.
	b.jeq(t.clone3, 0, 1)
	b.ret(retENOSYS)
	// socket(domain, ...): AF_INET and AF_INET6 at most (the job layer
	// denies those too without the network).
	b.argIn(t.socket, 0, []uint32{unix.AF_INET, unix.AF_INET6})
	// socketpair(domain, type, ...): an AF_UNIX stream pair only.
	{
		skip, deny := b.label(), b.label()
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, t.socketpair, next, skip)
		b.loadArgLo(0)
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.AF_UNIX, next, deny)
		b.loadArgLo(1)
		b.stmt(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, ^socketTypeFlags)
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.SOCK_STREAM, next, deny)
		b.ret(retAllow)
		b.bind(deny)
		b.ret(retEPERM)
		b.bind(skip)
	}
	// prlimit64(pid, ...): only pid 0 (all 64 bits).
	b.argsAreZero(t.prlimit64, 0)
	// personality(persona): only the 0xffffffff query.
	b.argIn(t.personality, 0, []uint32{0xffffffff})
	// Scheduling calls only on the calling process.
	for _, e := range t.selfOnly() {
		b.argsAreZero(e.nr, e.args...)
	}
	// kill(pid, sig) and tgkill(tgid, tid, sig): no real-time signal
	// (sig, an int, at least SIGRTMIN; a negative one is huge unsigned).
	// A real-time signal the receiver blocks is queued once per kill, on
	// a count every process of the uid shares machine-wide.
	b.argBelow(unix.SYS_KILL, 1, firstRTSignal)
	b.argBelow(unix.SYS_TGKILL, 2, firstRTSignal)
	// fallocate(fd, mode, ...): mode 0 (posix_fallocate, which
	// RLIMIT_FSIZE bounds) or PUNCH_HOLE|KEEP_SIZE (which frees blocks);
	// KEEP_SIZE allocates past the end of the file, where RLIMIT_FSIZE
	// does not look. EOPNOTSUPP, as from a file system without the mode.
	b.argInRet(unix.SYS_FALLOCATE, 1, []uint32{0, fallocPunchHoleKeepSize}, retEOPNOTSUPP)
	// The clocks: the static ones and the caller's own CPU clocks only.
	for _, nr := range []uint32{unix.SYS_CLOCK_GETTIME, unix.SYS_CLOCK_GETRES, unix.SYS_CLOCK_NANOSLEEP, unix.SYS_TIMER_CREATE} {
		b.ownClock(nr, 0)
	}
	// umask(mask): the group and others never get write permission on
	// what the job creates (mask is an int; the kernel keeps its 0777).
	b.argBitsSet(unix.SYS_UMASK, 0, umaskRequired)
	// setns(fd, nstype): a user or mount namespace only, named exactly.
	b.argIn(unix.SYS_SETNS, 1, setnsTypes)
	// getsid(pid) and getpgid(pid): the caller's own only (pid 0).
	b.argsAreZero(unix.SYS_GETSID, 0)
	b.argsAreZero(unix.SYS_GETPGID, 0)

	// 4. The allow list, and EPERM for everything else.
	b.nrIn(t.templateAllow(), retAllow, retEPERM)
	return b.finish()
}

// argIn emits: if nr == sys { allow iff the low 32 bits of args[i] are one
// of values, else EPERM }. The accumulator must hold nr.
func (b *asm) argIn(sys, i uint32, values []uint32) { b.argMatch(sys, i, values, retAllow, retEPERM) }

// argInRet is argIn with deny as the answer for the other values.
func (b *asm) argInRet(sys, i uint32, values []uint32, deny uint32) {
	b.argMatch(sys, i, values, retAllow, deny)
}

// argFlagsClear emits: if nr == sys { EPERM iff the low 32 bits of
// args[i] have any bit of flags set, else allow }. The accumulator must
// hold nr.
func (b *asm) argFlagsClear(sys, i, flags uint32) { b.argFlagsClearRet(sys, i, flags, retEPERM) }

// argFlagsClearRet is argFlagsClear with deny as the answer when a flag
// is set.
func (b *asm) argFlagsClearRet(sys, i, flags, deny uint32) {
	skip, hit := b.label(), b.label()
	b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, sys, next, skip)
	b.loadArgLo(i)
	b.jumpL(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, flags, hit, next)
	b.ret(retAllow)
	b.bind(hit)
	b.ret(deny)
	b.bind(skip)
}

// argBitsSet emits: if nr == sys { allow iff the low 32 bits of args[i]
// have every bit of bits set, else EPERM }. The accumulator must hold nr.
func (b *asm) argBitsSet(sys, i, bits uint32) {
	skip, deny := b.label(), b.label()
	b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, sys, next, skip)
	b.loadArgLo(i)
	b.stmt(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, bits)
	b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, bits, next, deny)
	b.ret(retAllow)
	b.bind(deny)
	b.ret(retEPERM)
	b.bind(skip)
}

// argNotIn emits: if nr == sys { EPERM iff the low 32 bits of args[i] are
// one of values, else allow }. The accumulator must hold nr.
func (b *asm) argNotIn(sys, i uint32, values []uint32) {
	b.argMatch(sys, i, values, retEPERM, retAllow)
}

// argMatch emits: if nr == sys { return match if the low 32 bits of
// args[i] are one of values, else other }. The accumulator must hold nr.
func (b *asm) argMatch(sys, i uint32, values []uint32, match, other uint32) {
	skip, hit := b.label(), b.label()
	b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, sys, next, skip)
	b.loadArgLo(i)
	for _, v := range values {
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, v, hit, next)
	}
	b.ret(other)
	b.bind(hit)
	b.ret(match)
	b.bind(skip)
}

// argBelow emits: if nr == sys { allow iff the low 32 bits of args[i],
// unsigned, are below limit, else EPERM }. The accumulator must hold nr.
func (b *asm) argBelow(sys, i, limit uint32) {
	skip, deny := b.label(), b.label()
	b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, sys, next, skip)
	b.loadArgLo(i)
	b.jumpL(unix.BPF_JMP|unix.BPF_JGE|unix.BPF_K, limit, deny, next)
	b.ret(retAllow)
	b.bind(deny)
	b.ret(retEPERM)
	b.bind(skip)
}

// ownClock emits: if nr == sys { allow iff the clock id in the low 32
// bits of args[i] is a static clock (not negative), a thread's CPU clock
// (negative with CPUCLOCK_PERTHREAD_MASK set: the kernel accepts only the
// caller's own threads), or one of the caller's own process CPU clocks
// (pid 0: -8, -7, -6), else EPERM }. Denied are the CPU clocks of
// other processes, ((~pid) << 3) | which, and the dynamic clocks of
// descriptors, ((~fd) << 3) | 3. The accumulator must hold nr.
func (b *asm) ownClock(sys, i uint32) {
	skip, allow, deny := b.label(), b.label(), b.label()
	b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, sys, next, skip)
	b.loadArgLo(i)
	b.jumpL(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, clockSign, next, allow)
	b.jumpL(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, clockPerThread, allow, next)
	b.jumpL(unix.BPF_JMP|unix.BPF_JGE|unix.BPF_K, clockSelfProcess, next, deny)
	b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, clockSelfFD, deny, allow)
	b.bind(allow)
	b.ret(retAllow)
	b.bind(deny)
	b.ret(retEPERM)
	b.bind(skip)
}

// nrIn emits the end of a program: return hit if nr is one of entries,
// miss otherwise, in chunks of at most maxChunk comparisons sharing one
// return each. The accumulator must hold nr.
func (b *asm) nrIn(entries []sysEntry, hit, miss uint32) {
	for start := 0; start < len(entries); start += maxChunk {
		end := min(start+maxChunk, len(entries))
		l := b.label()
		for _, e := range entries[start:end] {
			b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, e.nr, l, next)
		}
		if end == len(entries) {
			b.ret(miss)
			b.bind(l)
			b.ret(hit)
			return
		}
		after := b.label()
		b.ja(after)
		b.bind(l)
		b.ret(hit)
		b.bind(after)
	}
	b.ret(miss)
}

// label is a forward jump target inside an asm; next is the instruction
// immediately following the jump.
type label int

const next label = -1

type fixup struct {
	pc    int
	l     label
	field byte // 't', 'f' or 'k'
}

// asm is a tiny assembler for forward-only classic BPF with symbolic labels.
type asm struct {
	prog   Program
	labels []int // label -> pc, -1 while unbound
	fixups []fixup
}

func (b *asm) label() label {
	b.labels = append(b.labels, -1)
	return label(len(b.labels) - 1)
}

func (b *asm) bind(l label) { b.labels[l] = len(b.prog) }

func (b *asm) stmt(code uint16, k uint32) {
	b.prog = append(b.prog, unix.SockFilter{Code: code, K: k})
}

func (b *asm) ret(k uint32) { b.stmt(unix.BPF_RET|unix.BPF_K, k) }

func (b *asm) jump(code uint16, k uint32, jt, jf uint8) {
	b.prog = append(b.prog, unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k})
}

func (b *asm) jeq(k uint32, jt, jf uint8) { b.jump(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, k, jt, jf) }

func (b *asm) jumpL(code uint16, k uint32, jt, jf label) {
	pc := len(b.prog)
	b.jump(code, k, 0, 0)
	if jt != next {
		b.fixups = append(b.fixups, fixup{pc, jt, 't'})
	}
	if jf != next {
		b.fixups = append(b.fixups, fixup{pc, jf, 'f'})
	}
}

func (b *asm) ja(l label) {
	b.fixups = append(b.fixups, fixup{len(b.prog), l, 'k'})
	b.stmt(unix.BPF_JMP|unix.BPF_JA, 0)
}

// loadArgLo loads the low 32 bits of args[i] (little endian).
func (b *asm) loadArgLo(i uint32) {
	b.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArgs+8*i)
}

// loadArgHi loads the high 32 bits of args[i] (little endian).
func (b *asm) loadArgHi(i uint32) {
	b.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArgs+8*i+4)
}

// argsAreZero emits: if nr == sys { allow iff every args[i] == 0 (all 64
// bits), else EPERM }.
func (b *asm) argsAreZero(sys uint32, idx ...uint32) {
	skip, deny := b.label(), b.label()
	b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, sys, next, skip)
	for _, i := range idx {
		b.loadArgLo(i)
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 0, next, deny)
		b.loadArgHi(i)
		b.jumpL(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 0, next, deny)
	}
	b.ret(retAllow)
	b.bind(deny)
	b.ret(retEPERM)
	b.bind(skip)
}

// finish resolves the labels and checks the result with the same rules the
// kernel applies.
func (b *asm) finish() (Program, error) {
	for _, f := range b.fixups {
		target := b.labels[f.l]
		if target < 0 {
			return nil, fmt.Errorf("seccomp: internal error: unbound label %d at pc %d", f.l, f.pc)
		}
		off := target - f.pc - 1
		if off < 0 {
			return nil, fmt.Errorf("seccomp: internal error: backward jump at pc %d", f.pc)
		}
		ins := &b.prog[f.pc]
		switch f.field {
		case 't', 'f':
			if off > 255 {
				return nil, fmt.Errorf("seccomp: internal error: jump at pc %d too far (%d)", f.pc, off)
			}
			if f.field == 't' {
				ins.Jt = uint8(off)
			} else {
				ins.Jf = uint8(off)
			}
		case 'k':
			ins.K = uint32(off)
		}
	}
	if err := b.prog.validate(); err != nil {
		return nil, fmt.Errorf("seccomp: internal error: %w", err)
	}
	return b.prog, nil
}
