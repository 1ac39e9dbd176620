//go:build linux && arm64

package seccomp

import "golang.org/x/sys/unix"

// nativeTable is the AArch64 policy. Every number comes from
// golang.org/x/sys/unix (include/uapi/asm-generic/unistd.h). The generic
// table has no fork, vfork, utime, utimes, futimesat, chmod, chown, lchown,
// mknod or x86-only calls, and no x32-style alias range.
var nativeTable = &archTable{
	goarch:    "arm64",
	auditArch: unix.AUDIT_ARCH_AARCH64,
	auditName: "AUDIT_ARCH_AARCH64",
	x32:       false,

	clone:       unix.SYS_CLONE,
	clone3:      unix.SYS_CLONE3,
	socket:      unix.SYS_SOCKET,
	ioctl:       unix.SYS_IOCTL,
	prlimit64:   unix.SYS_PRLIMIT64,
	personality: unix.SYS_PERSONALITY,

	// The template opens pidfds of its children; a job may not (arm64 has
	// no fork system call: clone is handled by the job layer).
	jobDeny: []sysEntry{
		{"pidfd_open", unix.SYS_PIDFD_OPEN},
	},

	deny: append([]sysEntry{
		{"utimensat", unix.SYS_UTIMENSAT},
		// Process creation and program execution (clone and clone3 are handled above).
		{"execve", unix.SYS_EXECVE},
		{"execveat", unix.SYS_EXECVEAT},
		// Inspecting or manipulating other processes.
		{"ptrace", unix.SYS_PTRACE},
		{"process_vm_readv", unix.SYS_PROCESS_VM_READV},
		{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV},
		{"pidfd_getfd", unix.SYS_PIDFD_GETFD},
		{"pidfd_send_signal", unix.SYS_PIDFD_SEND_SIGNAL},
		{"kcmp", unix.SYS_KCMP},
		{"process_madvise", unix.SYS_PROCESS_MADVISE},
		{"process_mrelease", unix.SYS_PROCESS_MRELEASE},
		// Kernel attack surface: BPF, perf, userfaultfd, io_uring, keyrings.
		{"bpf", unix.SYS_BPF},
		{"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
		{"userfaultfd", unix.SYS_USERFAULTFD},
		{"io_uring_setup", unix.SYS_IO_URING_SETUP},
		{"io_uring_enter", unix.SYS_IO_URING_ENTER},
		{"io_uring_register", unix.SYS_IO_URING_REGISTER},
		{"keyctl", unix.SYS_KEYCTL},
		{"add_key", unix.SYS_ADD_KEY},
		{"request_key", unix.SYS_REQUEST_KEY},
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
		{"unshare", unix.SYS_UNSHARE},
		{"setns", unix.SYS_SETNS},
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
		// Clocks.
		{"settimeofday", unix.SYS_SETTIMEOFDAY},
		{"clock_settime", unix.SYS_CLOCK_SETTIME},
		{"clock_adjtime", unix.SYS_CLOCK_ADJTIME},
		{"adjtimex", unix.SYS_ADJTIMEX},
		// Credentials and capabilities.
		{"capset", unix.SYS_CAPSET},
		{"setuid", unix.SYS_SETUID},
		{"setgid", unix.SYS_SETGID},
		{"setreuid", unix.SYS_SETREUID},
		{"setregid", unix.SYS_SETREGID},
		{"setresuid", unix.SYS_SETRESUID},
		{"setresgid", unix.SYS_SETRESGID},
		{"setfsuid", unix.SYS_SETFSUID},
		{"setfsgid", unix.SYS_SETFSGID},
		{"setgroups", unix.SYS_SETGROUPS},
		// NUMA page migration of other processes and filesystem-wide monitoring.
		{"migrate_pages", unix.SYS_MIGRATE_PAGES},
		{"move_pages", unix.SYS_MOVE_PAGES},
		{"fanotify_init", unix.SYS_FANOTIFY_INIT},
		// File modes and ownership, in every form: Landlock does not mediate metadata.
		{"fchmodat", unix.SYS_FCHMODAT},
		{"fchmod", unix.SYS_FCHMOD},
		{"fchmodat2", unix.SYS_FCHMODAT2},
		{"fchown", unix.SYS_FCHOWN},
		{"fchownat", unix.SYS_FCHOWNAT},
		// Extended attributes.
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
		// Obsolete entry points (reserved or removed from the kernel).
		{"nfsservctl", unix.SYS_NFSSERVCTL},
	}, sharedDeny...),
}
