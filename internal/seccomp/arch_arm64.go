//go:build linux && arm64

package seccomp

import "golang.org/x/sys/unix"

// nativeTable is the AArch64 policy. Every number comes from
// golang.org/x/sys/unix (include/uapi/asm-generic/unistd.h). The generic
// table has no fork, vfork, open, stat, poll or other calls it replaced
// with *at and newer forms, no x86-only calls, and no x32-style alias
// range.
var nativeTable = &archTable{
	goarch:    "arm64",
	auditArch: unix.AUDIT_ARCH_AARCH64,
	auditName: "AUDIT_ARCH_AARCH64",
	x32:       false,

	clone:       unix.SYS_CLONE,
	clone3:      unix.SYS_CLONE3,
	socket:      unix.SYS_SOCKET,
	socketpair:  unix.SYS_SOCKETPAIR,
	ioctl:       unix.SYS_IOCTL,
	fcntl:       unix.SYS_FCNTL,
	prctl:       unix.SYS_PRCTL,
	prlimit64:   unix.SYS_PRLIMIT64,
	personality: unix.SYS_PERSONALITY,

	ioctls:  allowedIoctls,
	allow:   sharedAllow,
	jobDeny: sharedJobDeny, // arm64 has no fork: clone is the job layer's
	netOnly: sharedNetOnly,
	deny:    sharedDeny,
}
