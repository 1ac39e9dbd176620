// Package sandbox holds the Landlock half of pynox's confinement policy as
// plain data: which access rights the kernel can handle at a given ABI, what
// a read, write or runtime grant allows, and the rule list of one job. The
// Python runner applies exactly what this package computes; nothing here
// touches the calling process.
package sandbox

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Landlock access rights and scopes, from golang.org/x/sys/unix (the
// kernel's <linux/landlock.h>). The pool's own domain is enforced through
// go-landlock (see the pynox package); the jobs' rules are applied by the
// single-threaded Python runner with exactly these values.
const (
	accessFSExecute    uint64 = unix.LANDLOCK_ACCESS_FS_EXECUTE
	accessFSWriteFile  uint64 = unix.LANDLOCK_ACCESS_FS_WRITE_FILE
	accessFSReadFile   uint64 = unix.LANDLOCK_ACCESS_FS_READ_FILE
	accessFSReadDir    uint64 = unix.LANDLOCK_ACCESS_FS_READ_DIR
	accessFSRemoveDir  uint64 = unix.LANDLOCK_ACCESS_FS_REMOVE_DIR
	accessFSRemoveFile uint64 = unix.LANDLOCK_ACCESS_FS_REMOVE_FILE
	accessFSMakeChar   uint64 = unix.LANDLOCK_ACCESS_FS_MAKE_CHAR
	accessFSMakeDir    uint64 = unix.LANDLOCK_ACCESS_FS_MAKE_DIR
	accessFSMakeReg    uint64 = unix.LANDLOCK_ACCESS_FS_MAKE_REG
	accessFSMakeSock   uint64 = unix.LANDLOCK_ACCESS_FS_MAKE_SOCK
	accessFSMakeFifo   uint64 = unix.LANDLOCK_ACCESS_FS_MAKE_FIFO
	accessFSMakeBlock  uint64 = unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK
	accessFSMakeSym    uint64 = unix.LANDLOCK_ACCESS_FS_MAKE_SYM
	accessFSRefer      uint64 = unix.LANDLOCK_ACCESS_FS_REFER
	accessFSTruncate   uint64 = unix.LANDLOCK_ACCESS_FS_TRUNCATE
	accessFSIoctlDev   uint64 = unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
)

// accessFSResolveUnix (ABI 9, Linux 7.1) controls connect and sendmsg to
// pathname unix sockets: handled and never granted, a job reaches no
// socket that a process outside its domain bound, whatever its grants.
const accessFSResolveUnix uint64 = unix.LANDLOCK_ACCESS_FS_RESOLVE_UNIX

const (
	accessNetBindTCP    uint64 = unix.LANDLOCK_ACCESS_NET_BIND_TCP
	accessNetConnectTCP uint64 = unix.LANDLOCK_ACCESS_NET_CONNECT_TCP

	scopeAbstractUnixSocket uint64 = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
	scopeSignal             uint64 = unix.LANDLOCK_SCOPE_SIGNAL

	createRulesetVersion = unix.LANDLOCK_CREATE_RULESET_VERSION
)

// MinABI is the oldest Landlock ABI pynox accepts. ABI 1 (Linux 5.13)
// mediates the filesystem; newer ABIs add rename/link across directories
// (2), truncation (3), TCP (4), device ioctls (5), signal and
// abstract-socket scoping (6), and connecting to pathname unix sockets
// (9, Linux 7.1). Older kernels get the missing pieces from seccomp where
// possible (it allows no unix socket but an AF_UNIX stream socketpair,
// which reaches no path) and the difference is reported in each result.
const MinABI = 1

var (
	abiOnce sync.Once
	abiVal  int
	abiErr  error
)

// ABI returns the Landlock ABI version of the running kernel, probed once
// and cached. It returns an error naming the minimum kernel when Landlock
// is missing or disabled.
func ABI() (int, error) {
	abiOnce.Do(func() {
		r, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, createRulesetVersion)
		v := int(r)
		var err error
		if errno != 0 {
			err = errno
		}
		switch {
		case err != nil:
			abiErr = fmt.Errorf("landlock is unavailable (%v): pynox needs Linux 5.13 or newer with Landlock enabled (lsm=landlock)", err)
		case v < MinABI:
			abiErr = fmt.Errorf("landlock ABI %d is older than the minimum %d", v, MinABI)
		default:
			abiVal = v
		}
	})
	return abiVal, abiErr
}

// File rights are the ones the kernel accepts on a rule whose path is not
// a directory.
const fileRights = accessFSExecute | accessFSWriteFile | accessFSReadFile |
	accessFSTruncate | accessFSIoctlDev | accessFSResolveUnix

// HandledFS returns the filesystem rights a ruleset handles at abi: every
// right the kernel knows, so anything not granted by a rule is denied.
func HandledFS(abi int) uint64 {
	r := (accessFSExecute | accessFSWriteFile | accessFSReadFile |
		accessFSReadDir | accessFSRemoveDir | accessFSRemoveFile |
		accessFSMakeChar | accessFSMakeDir | accessFSMakeReg |
		accessFSMakeSock | accessFSMakeFifo | accessFSMakeBlock |
		accessFSMakeSym)
	if abi >= 2 {
		r |= accessFSRefer
	}
	if abi >= 3 {
		r |= accessFSTruncate
	}
	if abi >= 5 {
		r |= accessFSIoctlDev
	}
	if abi >= 9 {
		r |= accessFSResolveUnix
	}
	return r
}

// HandledNet returns the network rights a ruleset handles: TCP bind and
// connect (denied, since no port rule is ever added) when the network is
// not granted and the kernel supports it (ABI 4), nothing otherwise.
func HandledNet(abi int, allowNetwork bool) uint64 {
	if allowNetwork || abi < 4 {
		return 0
	}
	return accessNetBindTCP | accessNetConnectTCP
}

// Scoped returns the IPC scopes a ruleset restricts at abi: signals and
// abstract unix sockets may not cross the job's Landlock domain (ABI 6).
func Scoped(abi int) uint64 {
	if abi < 6 {
		return 0
	}
	return scopeAbstractUnixSocket | scopeSignal
}

// RuntimeAccess is what the interpreter's own paths allow: read and
// execute.
func RuntimeAccess(abi int) uint64 {
	return (accessFSExecute | accessFSReadFile | accessFSReadDir) & HandledFS(abi)
}

// ReadAccess is what an allow_read or package_dirs grant allows.
func ReadAccess(abi int) uint64 {
	return (accessFSReadFile | accessFSReadDir) & HandledFS(abi)
}

// WriteAccess is what an allow_write grant allows: read, write, create,
// remove, rename and link within the grant, truncate. Device nodes cannot
// be created (the job has no CAP_MKNOD either), and no pathname unix
// socket within the grant may be connected to (ABI 9): a host service's
// socket in a shared directory stays out of reach.
func WriteAccess(abi int) uint64 {
	return HandledFS(abi) &^ (accessFSExecute | accessFSMakeChar | accessFSMakeBlock | accessFSResolveUnix)
}

// RemoveDirAccess is the right to remove a directory from the one it is
// granted on, and nothing else.
func RemoveDirAccess(abi int) uint64 { return accessFSRemoveDir & HandledFS(abi) }

// DeviceAccess is what the few device files every job may use
// (/dev/null and friends) allow.
func DeviceAccess(abi int, write bool) uint64 {
	r := accessFSReadFile
	if write {
		r |= accessFSWriteFile
	}
	return r & HandledFS(abi)
}

// ForFile masks access to the rights the kernel accepts on a non-directory.
func ForFile(access uint64) uint64 { return access & fileRights }

// Rule grants Access beneath Path.
type Rule struct {
	Path   string
	Access uint64
}

// Ruleset is the complete Landlock policy of one job.
type Ruleset struct {
	ABI        int
	HandledFS  uint64
	HandledNet uint64
	Scoped     uint64
	Rules      []Rule
}

// String renders the ruleset for logs and tests, one rule per line.
func (r Ruleset) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "landlock abi=%d handled_fs=%s handled_net=%s scoped=%s\n",
		r.ABI, FSRights(r.HandledFS), netRights(r.HandledNet), scopes(r.Scoped))
	rules := append([]Rule(nil), r.Rules...)
	sort.Slice(rules, func(i, j int) bool { return rules[i].Path < rules[j].Path })
	for _, rule := range rules {
		fmt.Fprintf(&b, "  %s %s\n", rule.Path, FSRights(rule.Access))
	}
	return b.String()
}

var fsNames = []string{"execute", "write_file", "read_file", "read_dir", "remove_dir",
	"remove_file", "make_char", "make_dir", "make_reg", "make_sock", "make_fifo",
	"make_block", "make_sym", "refer", "truncate", "ioctl_dev", "resolve_unix"}

// FSRights names the filesystem rights in a mask, joined by '|'.
func FSRights(m uint64) string { return names(m, fsNames) }

func netRights(m uint64) string { return names(m, []string{"bind_tcp", "connect_tcp"}) }

func scopes(m uint64) string { return names(m, []string{"abstract_unix_socket", "signal"}) }

func names(m uint64, all []string) string {
	if m == 0 {
		return "none"
	}
	var out []string
	for i, n := range all {
		if m&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return strings.Join(out, "|")
}
