//go:build linux && (amd64 || arm64)

package seccomp

import "golang.org/x/sys/unix"

// The generic descriptor ioctls of include/uapi/asm-generic/ioctls.h,
// which x86-64 and arm64 share; golang.org/x/sys/unix has FIONREAD only
// under its terminal name, TIOCINQ.
const (
	ioctlFIONREAD = unix.TIOCINQ
	ioctlFIONBIO  = 0x5421
	ioctlFIONCLEX = 0x5450
	ioctlFIOCLEX  = 0x5451
)

// allowedIoctls are the ioctl requests a job may make: the terminal
// queries of isatty and os.get_terminal_size, and the generic descriptor
// requests.
var allowedIoctls = []uint32{unix.TCGETS, unix.TIOCGWINSZ, ioctlFIONREAD, ioctlFIONBIO, ioctlFIOCLEX, ioctlFIONCLEX}

// sharedAllow lists the system calls both layers allow with any arguments
// whose names every supported architecture has; each table appends its
// own. It was measured (see the package doc): what CPython, its standard
// library, numpy and pandas, the runner itself, the template and the Go
// test binary that probes the filter in the kernel were seen to call,
// plus the calls of the same families a library may use instead.
var sharedAllow = []sysEntry{
	// Files and descriptors; Landlock decides which paths they reach.
	{"read", unix.SYS_READ},
	{"write", unix.SYS_WRITE},
	{"readv", unix.SYS_READV},
	{"writev", unix.SYS_WRITEV},
	{"pread64", unix.SYS_PREAD64},
	{"pwrite64", unix.SYS_PWRITE64},
	{"preadv", unix.SYS_PREADV},
	{"pwritev", unix.SYS_PWRITEV},
	{"lseek", unix.SYS_LSEEK},
	{"close", unix.SYS_CLOSE},
	{"close_range", unix.SYS_CLOSE_RANGE},
	{"openat", unix.SYS_OPENAT},
	{"openat2", unix.SYS_OPENAT2}, // fails with ENOSYS: its mode is out of the filter's reach (buildTemplate)
	{"newfstatat", unix.SYS_NEWFSTATAT},
	{"fstat", unix.SYS_FSTAT},
	{"statx", unix.SYS_STATX},
	{"statfs", unix.SYS_STATFS},
	{"fstatfs", unix.SYS_FSTATFS},
	{"faccessat", unix.SYS_FACCESSAT},
	{"faccessat2", unix.SYS_FACCESSAT2},
	{"readlinkat", unix.SYS_READLINKAT},
	{"getdents64", unix.SYS_GETDENTS64},
	{"getcwd", unix.SYS_GETCWD},
	{"chdir", unix.SYS_CHDIR},
	{"fchdir", unix.SYS_FCHDIR},
	{"mkdirat", unix.SYS_MKDIRAT},
	{"unlinkat", unix.SYS_UNLINKAT},
	{"renameat", unix.SYS_RENAMEAT},
	{"renameat2", unix.SYS_RENAMEAT2},
	{"linkat", unix.SYS_LINKAT},
	{"symlinkat", unix.SYS_SYMLINKAT},
	{"truncate", unix.SYS_TRUNCATE},
	{"ftruncate", unix.SYS_FTRUNCATE},
	{"fsync", unix.SYS_FSYNC},
	{"fdatasync", unix.SYS_FDATASYNC},
	{"flock", unix.SYS_FLOCK},
	{"dup", unix.SYS_DUP},
	{"dup3", unix.SYS_DUP3},
	{"pipe2", unix.SYS_PIPE2},
	{"sendfile", unix.SYS_SENDFILE},
	{"copy_file_range", unix.SYS_COPY_FILE_RANGE},
	{"getxattr", unix.SYS_GETXATTR},
	{"lgetxattr", unix.SYS_LGETXATTR},
	{"fgetxattr", unix.SYS_FGETXATTR},
	{"listxattr", unix.SYS_LISTXATTR},
	{"llistxattr", unix.SYS_LLISTXATTR},
	{"flistxattr", unix.SYS_FLISTXATTR},
	// Memory. memfd_create is allowed: the memory it holds is bounded by
	// the job's cgroup where the pool has one, not by RLIMIT_AS.
	{"brk", unix.SYS_BRK},
	{"mmap", unix.SYS_MMAP},
	{"munmap", unix.SYS_MUNMAP},
	{"mremap", unix.SYS_MREMAP},
	{"mprotect", unix.SYS_MPROTECT},
	{"msync", unix.SYS_MSYNC},
	{"mbind", unix.SYS_MBIND}, // OpenBLAS (numpy) on its buffers
	{"memfd_create", unix.SYS_MEMFD_CREATE},
	{"map_shadow_stack", unix.SYS_MAP_SHADOW_STACK},
	{"mseal", unix.SYS_MSEAL},
	// The process itself: identity, limits, threads, exit.
	{"getpid", unix.SYS_GETPID},
	{"gettid", unix.SYS_GETTID},
	{"getppid", unix.SYS_GETPPID},
	{"getuid", unix.SYS_GETUID},
	{"geteuid", unix.SYS_GETEUID},
	{"getgid", unix.SYS_GETGID},
	{"getegid", unix.SYS_GETEGID},
	{"getresuid", unix.SYS_GETRESUID},
	{"getresgid", unix.SYS_GETRESGID},
	{"getgroups", unix.SYS_GETGROUPS},
	{"setsid", unix.SYS_SETSID}, // a spare's prepare; a job is a session leader already
	{"capget", unix.SYS_CAPGET},
	{"uname", unix.SYS_UNAME},
	{"sysinfo", unix.SYS_SYSINFO},
	{"getrusage", unix.SYS_GETRUSAGE},
	{"times", unix.SYS_TIMES},
	{"getrlimit", unix.SYS_GETRLIMIT},
	{"setrlimit", unix.SYS_SETRLIMIT}, // the calling process only, by definition
	{"getpriority", unix.SYS_GETPRIORITY},
	{"sched_getaffinity", unix.SYS_SCHED_GETAFFINITY},
	{"sched_yield", unix.SYS_SCHED_YIELD},
	{"sched_getparam", unix.SYS_SCHED_GETPARAM},
	{"sched_getscheduler", unix.SYS_SCHED_GETSCHEDULER},
	{"sched_get_priority_max", unix.SYS_SCHED_GET_PRIORITY_MAX},
	{"sched_get_priority_min", unix.SYS_SCHED_GET_PRIORITY_MIN},
	{"sched_rr_get_interval", unix.SYS_SCHED_RR_GET_INTERVAL},
	{"sched_getattr", unix.SYS_SCHED_GETATTR},
	{"getcpu", unix.SYS_GETCPU},
	{"set_tid_address", unix.SYS_SET_TID_ADDRESS},
	{"set_robust_list", unix.SYS_SET_ROBUST_LIST},
	{"rseq", unix.SYS_RSEQ},
	{"restart_syscall", unix.SYS_RESTART_SYSCALL},
	{"exit", unix.SYS_EXIT},
	{"exit_group", unix.SYS_EXIT_GROUP},
	{"wait4", unix.SYS_WAIT4},
	{"waitid", unix.SYS_WAITID},
	// Signals. Landlock's signal scope (ABI 6) keeps kill and tgkill
	// inside the job's own domain; both are filtered by argument (see
	// argFiltered), and tkill is denied.
	{"rt_sigaction", unix.SYS_RT_SIGACTION},
	{"rt_sigprocmask", unix.SYS_RT_SIGPROCMASK},
	{"rt_sigreturn", unix.SYS_RT_SIGRETURN},
	{"rt_sigpending", unix.SYS_RT_SIGPENDING},
	{"rt_sigtimedwait", unix.SYS_RT_SIGTIMEDWAIT},
	{"rt_sigsuspend", unix.SYS_RT_SIGSUSPEND},
	{"sigaltstack", unix.SYS_SIGALTSTACK},
	// Time and timers (clock_gettime, clock_getres, clock_nanosleep and
	// timer_create are filtered by their clock, see argFiltered).
	{"nanosleep", unix.SYS_NANOSLEEP},
	{"gettimeofday", unix.SYS_GETTIMEOFDAY},
	{"getitimer", unix.SYS_GETITIMER},
	{"setitimer", unix.SYS_SETITIMER},
	{"timer_settime", unix.SYS_TIMER_SETTIME},
	{"timer_gettime", unix.SYS_TIMER_GETTIME},
	{"timer_getoverrun", unix.SYS_TIMER_GETOVERRUN},
	{"timer_delete", unix.SYS_TIMER_DELETE},
	{"timerfd_create", unix.SYS_TIMERFD_CREATE},
	{"timerfd_settime", unix.SYS_TIMERFD_SETTIME},
	{"timerfd_gettime", unix.SYS_TIMERFD_GETTIME},
	// Waiting.
	{"futex", unix.SYS_FUTEX},
	{"ppoll", unix.SYS_PPOLL},
	{"pselect6", unix.SYS_PSELECT6},
	{"epoll_create1", unix.SYS_EPOLL_CREATE1},
	{"epoll_ctl", unix.SYS_EPOLL_CTL},
	{"epoll_pwait", unix.SYS_EPOLL_PWAIT},
	{"epoll_pwait2", unix.SYS_EPOLL_PWAIT2},
	{"eventfd2", unix.SYS_EVENTFD2},
	{"signalfd4", unix.SYS_SIGNALFD4},
	{"getrandom", unix.SYS_GETRANDOM},
	// Sockets the process already holds (socket and socketpair are
	// filtered by argument; connect, bind, listen and accept need the
	// network, see sharedNetOnly).
	{"recvmsg", unix.SYS_RECVMSG},
	{"sendto", unix.SYS_SENDTO},
	{"recvfrom", unix.SYS_RECVFROM},
	{"recvmmsg", unix.SYS_RECVMMSG},
	{"shutdown", unix.SYS_SHUTDOWN},
	{"getsockname", unix.SYS_GETSOCKNAME},
	{"getpeername", unix.SYS_GETPEERNAME},
	{"getsockopt", unix.SYS_GETSOCKOPT},
	{"setsockopt", unix.SYS_SETSOCKOPT},
	// Landlock only ever restricts the caller further; a spare enforces
	// its ruleset under both layers.
	{"landlock_create_ruleset", unix.SYS_LANDLOCK_CREATE_RULESET},
	{"landlock_add_rule", unix.SYS_LANDLOCK_ADD_RULE},
	{"landlock_restrict_self", unix.SYS_LANDLOCK_RESTRICT_SELF},
}

// sharedJobDeny lists what the template layer allows, because the
// template or a spare before its job layer needs it, and the job layer
// denies: pidfd_open (the template opens its children's pidfds) and
// seccomp (the kernel test installs the job layer with it; a job may not
// install filters of its own); setns (only with nstype CLONE_NEWUSER or
// CLONE_NEWNS in the template layer) and capset: a spare whose job has
// a mount namespace enters it, and drops the capabilities it holds in
// its user namespace, before it attaches its job layer (capset can
// never add to the permitted set, which the template emptied).
var sharedJobDeny = []sysEntry{
	{"pidfd_open", unix.SYS_PIDFD_OPEN},
	{"seccomp", unix.SYS_SECCOMP},
	{"setns", unix.SYS_SETNS},
	{"capset", unix.SYS_CAPSET},
}

// sharedNetOnly lists the socket calls the job layer allows only with the
// network: without it a job holds no socket but its socketpair halves,
// and those need none of them (bind would name one in the abstract
// namespace, squatting a name a host service uses). sendmsg and
// sendmmsg are the only way to put descriptors in flight (SCM_RIGHTS):
// a job without the network sends with send and write, and the runner
// sends nothing but bytes once the job layer is on (the template hands
// its spares to the pool with sendmsg, under the template layer alone).
// Descriptors in flight are counted per uid across the machine, against
// every process of the uid that passes descriptors, and reach the unix
// sockets' garbage collector, a source of kernel bugs.
var sharedNetOnly = []sysEntry{
	{"sendmsg", unix.SYS_SENDMSG},
	{"sendmmsg", unix.SYS_SENDMMSG},
	{"connect", unix.SYS_CONNECT},
	{"bind", unix.SYS_BIND},
	{"listen", unix.SYS_LISTEN},
	{"accept", unix.SYS_ACCEPT},
	{"accept4", unix.SYS_ACCEPT4},
}

// sharedDeny names system calls the allow list leaves out on purpose,
// for the tests (each must fail with EPERM) and the disassembly; the
// filter itself denies everything it does not allow.
var sharedDeny = []sysEntry{
	// System V IPC and POSIX message queues live outside the filesystem
	// Landlock sees.
	{"shmget", unix.SYS_SHMGET},
	{"shmat", unix.SYS_SHMAT},
	{"shmctl", unix.SYS_SHMCTL},
	{"shmdt", unix.SYS_SHMDT},
	{"msgget", unix.SYS_MSGGET},
	{"msgsnd", unix.SYS_MSGSND},
	{"msgrcv", unix.SYS_MSGRCV},
	{"msgctl", unix.SYS_MSGCTL},
	{"semget", unix.SYS_SEMGET},
	{"semop", unix.SYS_SEMOP},
	{"semtimedop", unix.SYS_SEMTIMEDOP},
	{"semctl", unix.SYS_SEMCTL},
	{"mq_open", unix.SYS_MQ_OPEN},
	{"mq_unlink", unix.SYS_MQ_UNLINK},
	{"mq_timedsend", unix.SYS_MQ_TIMEDSEND},
	{"mq_timedreceive", unix.SYS_MQ_TIMEDRECEIVE},
	{"mq_notify", unix.SYS_MQ_NOTIFY},
	{"mq_getsetattr", unix.SYS_MQ_GETSETATTR},
	{"ioprio_set", unix.SYS_IOPRIO_SET},
	// inotify is not mediated by Landlock.
	{"inotify_init1", unix.SYS_INOTIFY_INIT1},
	{"inotify_add_watch", unix.SYS_INOTIFY_ADD_WATCH},
	{"fanotify_mark", unix.SYS_FANOTIFY_MARK},
	// Process creation and program execution (clone and clone3 are
	// filtered by argument).
	{"execve", unix.SYS_EXECVE},
	{"execveat", unix.SYS_EXECVEAT},
	// Other processes.
	{"ptrace", unix.SYS_PTRACE},
	{"process_vm_readv", unix.SYS_PROCESS_VM_READV},
	{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV},
	{"pidfd_getfd", unix.SYS_PIDFD_GETFD},
	{"pidfd_send_signal", unix.SYS_PIDFD_SEND_SIGNAL},
	{"kcmp", unix.SYS_KCMP},
	{"process_madvise", unix.SYS_PROCESS_MADVISE},
	{"process_mrelease", unix.SYS_PROCESS_MRELEASE},
	{"rt_sigqueueinfo", unix.SYS_RT_SIGQUEUEINFO},
	{"tkill", unix.SYS_TKILL}, // tgkill does the same with the thread group checked
	{"rt_tgsigqueueinfo", unix.SYS_RT_TGSIGQUEUEINFO},
	{"setpgid", unix.SYS_SETPGID},
	{"get_robust_list", unix.SYS_GET_ROBUST_LIST},
	// Kernel attack surface: BPF, perf, userfaultfd, io_uring, AIO, keys.
	{"bpf", unix.SYS_BPF},
	{"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
	{"userfaultfd", unix.SYS_USERFAULTFD},
	{"io_uring_setup", unix.SYS_IO_URING_SETUP},
	{"io_uring_enter", unix.SYS_IO_URING_ENTER},
	{"io_uring_register", unix.SYS_IO_URING_REGISTER},
	{"io_setup", unix.SYS_IO_SETUP},
	{"io_destroy", unix.SYS_IO_DESTROY},
	{"io_submit", unix.SYS_IO_SUBMIT},
	{"io_cancel", unix.SYS_IO_CANCEL},
	{"io_getevents", unix.SYS_IO_GETEVENTS},
	{"io_pgetevents", unix.SYS_IO_PGETEVENTS},
	{"keyctl", unix.SYS_KEYCTL},
	{"add_key", unix.SYS_ADD_KEY},
	{"request_key", unix.SYS_REQUEST_KEY},
	{"vmsplice", unix.SYS_VMSPLICE},
	{"lsm_get_self_attr", unix.SYS_LSM_GET_SELF_ATTR},
	{"lsm_set_self_attr", unix.SYS_LSM_SET_SELF_ATTR},
	{"lsm_list_modules", unix.SYS_LSM_LIST_MODULES},
	// Mounts, namespaces and the root directory.
	{"mount", unix.SYS_MOUNT},
	{"umount2", unix.SYS_UMOUNT2},
	{"fsopen", unix.SYS_FSOPEN},
	{"fsconfig", unix.SYS_FSCONFIG},
	{"fsmount", unix.SYS_FSMOUNT},
	{"fspick", unix.SYS_FSPICK},
	{"open_tree", unix.SYS_OPEN_TREE},
	{"move_mount", unix.SYS_MOVE_MOUNT},
	{"mount_setattr", unix.SYS_MOUNT_SETATTR},
	{"open_tree_attr", unix.SYS_OPEN_TREE_ATTR},
	{"listmount", unix.SYS_LISTMOUNT},
	{"statmount", unix.SYS_STATMOUNT},
	{"listns", unix.SYS_LISTNS},
	{"unshare", unix.SYS_UNSHARE},
	{"chroot", unix.SYS_CHROOT},
	{"pivot_root", unix.SYS_PIVOT_ROOT},
	// File handles bypass path-based confinement.
	{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT},
	{"name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT},
	// Kernel, module and system administration.
	{"kexec_load", unix.SYS_KEXEC_LOAD},
	{"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
	{"init_module", unix.SYS_INIT_MODULE},
	{"finit_module", unix.SYS_FINIT_MODULE},
	{"delete_module", unix.SYS_DELETE_MODULE},
	{"reboot", unix.SYS_REBOOT},
	{"swapon", unix.SYS_SWAPON},
	{"swapoff", unix.SYS_SWAPOFF},
	{"syslog", unix.SYS_SYSLOG},
	{"acct", unix.SYS_ACCT},
	{"quotactl", unix.SYS_QUOTACTL},
	{"quotactl_fd", unix.SYS_QUOTACTL_FD},
	{"lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE},
	{"vhangup", unix.SYS_VHANGUP},
	{"sethostname", unix.SYS_SETHOSTNAME},
	{"setdomainname", unix.SYS_SETDOMAINNAME},
	{"sync", unix.SYS_SYNC},
	{"syncfs", unix.SYS_SYNCFS},
	// Clocks.
	{"settimeofday", unix.SYS_SETTIMEOFDAY},
	{"clock_settime", unix.SYS_CLOCK_SETTIME},
	{"clock_adjtime", unix.SYS_CLOCK_ADJTIME},
	{"adjtimex", unix.SYS_ADJTIMEX},
	// Credentials and capabilities (a change of credentials would also
	// clear the parent-death signal).
	{"setuid", unix.SYS_SETUID},
	{"setgid", unix.SYS_SETGID},
	{"setreuid", unix.SYS_SETREUID},
	{"setregid", unix.SYS_SETREGID},
	{"setresuid", unix.SYS_SETRESUID},
	{"setresgid", unix.SYS_SETRESGID},
	{"setfsuid", unix.SYS_SETFSUID},
	{"setfsgid", unix.SYS_SETFSGID},
	{"setgroups", unix.SYS_SETGROUPS},
	// NUMA page migration of other processes, memory locking,
	// filesystem-wide monitoring.
	{"migrate_pages", unix.SYS_MIGRATE_PAGES},
	{"move_pages", unix.SYS_MOVE_PAGES},
	{"mlock", unix.SYS_MLOCK},
	{"mlockall", unix.SYS_MLOCKALL},
	{"fanotify_init", unix.SYS_FANOTIFY_INIT},
	// File modes, ownership, timestamps, flags and extended attributes,
	// in every form: Landlock does not mediate metadata.
	{"fchmod", unix.SYS_FCHMOD},
	{"fchmodat", unix.SYS_FCHMODAT},
	{"fchmodat2", unix.SYS_FCHMODAT2},
	{"fchown", unix.SYS_FCHOWN},
	{"fchownat", unix.SYS_FCHOWNAT},
	{"utimensat", unix.SYS_UTIMENSAT},
	{"file_setattr", unix.SYS_FILE_SETATTR},
	{"file_getattr", unix.SYS_FILE_GETATTR},
	{"setxattr", unix.SYS_SETXATTR},
	{"lsetxattr", unix.SYS_LSETXATTR},
	{"fsetxattr", unix.SYS_FSETXATTR},
	{"removexattr", unix.SYS_REMOVEXATTR},
	{"lremovexattr", unix.SYS_LREMOVEXATTR},
	{"fremovexattr", unix.SYS_FREMOVEXATTR},
	{"setxattrat", unix.SYS_SETXATTRAT},
	{"removexattrat", unix.SYS_REMOVEXATTRAT},
	// Device nodes.
	{"mknodat", unix.SYS_MKNODAT},
	// Secret memory.
	{"memfd_secret", unix.SYS_MEMFD_SECRET},
	// Obsolete entry points.
	{"nfsservctl", unix.SYS_NFSSERVCTL},
}
