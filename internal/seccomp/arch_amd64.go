//go:build linux && amd64

package seccomp

import (
	"slices"

	"golang.org/x/sys/unix"
)

// nativeTable is the x86-64 policy. Every number comes from
// golang.org/x/sys/unix (arch/x86/entry/syscalls/syscall_64.tbl).
var nativeTable = &archTable{
	goarch:    "amd64",
	auditArch: unix.AUDIT_ARCH_X86_64,
	auditName: "AUDIT_ARCH_X86_64",
	x32:       true,

	clone:       unix.SYS_CLONE,
	clone3:      unix.SYS_CLONE3,
	socket:      unix.SYS_SOCKET,
	socketpair:  unix.SYS_SOCKETPAIR,
	ioctl:       unix.SYS_IOCTL,
	fcntl:       unix.SYS_FCNTL,
	prctl:       unix.SYS_PRCTL,
	prlimit64:   unix.SYS_PRLIMIT64,
	personality: unix.SYS_PERSONALITY,

	ioctls: allowedIoctls,

	// The x86-64 entry points the generic table replaced with *at and
	// other newer forms.
	allow: slices.Concat(sharedAllow, []sysEntry{
		{"open", unix.SYS_OPEN},
		{"creat", unix.SYS_CREAT},
		{"stat", unix.SYS_STAT},
		{"lstat", unix.SYS_LSTAT},
		{"access", unix.SYS_ACCESS},
		{"readlink", unix.SYS_READLINK},
		{"getdents", unix.SYS_GETDENTS},
		{"mkdir", unix.SYS_MKDIR},
		{"rmdir", unix.SYS_RMDIR},
		{"unlink", unix.SYS_UNLINK},
		{"rename", unix.SYS_RENAME},
		{"link", unix.SYS_LINK},
		{"symlink", unix.SYS_SYMLINK},
		{"dup2", unix.SYS_DUP2},
		{"pipe", unix.SYS_PIPE},
		{"poll", unix.SYS_POLL},
		{"select", unix.SYS_SELECT},
		{"epoll_create", unix.SYS_EPOLL_CREATE},
		{"epoll_wait", unix.SYS_EPOLL_WAIT},
		{"eventfd", unix.SYS_EVENTFD},
		{"signalfd", unix.SYS_SIGNALFD},
		{"alarm", unix.SYS_ALARM},
		{"pause", unix.SYS_PAUSE},
		{"time", unix.SYS_TIME},
		{"getpgrp", unix.SYS_GETPGRP},
		{"arch_prctl", unix.SYS_ARCH_PRCTL},
	}),

	// The template forks (glibc through clone, musl through fork); a job
	// may not.
	jobDeny: slices.Concat(sharedJobDeny, []sysEntry{{"fork", unix.SYS_FORK}}),
	netOnly: sharedNetOnly,

	deny: slices.Concat(sharedDeny, []sysEntry{
		{"vfork", unix.SYS_VFORK},
		{"inotify_init", unix.SYS_INOTIFY_INIT},
		{"utime", unix.SYS_UTIME},
		{"utimes", unix.SYS_UTIMES},
		{"futimesat", unix.SYS_FUTIMESAT},
		{"iopl", unix.SYS_IOPL},
		{"ioperm", unix.SYS_IOPERM},
		{"modify_ldt", unix.SYS_MODIFY_LDT},
		{"uselib", unix.SYS_USELIB},
		{"chmod", unix.SYS_CHMOD},
		{"chown", unix.SYS_CHOWN},
		{"lchown", unix.SYS_LCHOWN},
		{"mknod", unix.SYS_MKNOD},
		{"create_module", unix.SYS_CREATE_MODULE},
		{"get_kernel_syms", unix.SYS_GET_KERNEL_SYMS},
		{"query_module", unix.SYS_QUERY_MODULE},
		{"_sysctl", unix.SYS__SYSCTL},
		{"afs_syscall", unix.SYS_AFS_SYSCALL},
		{"tuxcall", unix.SYS_TUXCALL},
		{"security", unix.SYS_SECURITY},
		{"vserver", unix.SYS_VSERVER},
	}),
}
