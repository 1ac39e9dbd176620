//go:build linux && (amd64 || arm64)

package seccomp

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

var (
	eperm  = ActionErrno | uint32(unix.EPERM)
	enosys = ActionErrno | uint32(unix.ENOSYS)
)

// call returns seccomp_data for a native system call.
func call(nr uint32, args ...uint64) Data {
	d := Data{Nr: int32(nr), Arch: nativeTable.auditArch, InstructionPointer: 0x7f0000001234}
	copy(d.Args[:], args)
	return d
}

// requiredDenied is every system call the policy must always deny with EPERM,
// independent of the table in the arch file. Names that do not exist on an
// architecture are listed in absentOn.
var requiredDenied = []string{
	"fork", "vfork", "execve", "execveat",
	"utime", "utimes", "futimesat",
	"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd",
	"pidfd_send_signal", "kcmp", "process_madvise", "process_mrelease",
	"bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
	"io_uring_register", "keyctl", "add_key", "request_key",
	"mount", "umount2", "fsopen", "fsconfig", "fsmount", "fspick", "open_tree",
	"move_mount", "mount_setattr", "open_tree_attr", "unshare", "setns", "chroot",
	"pivot_root", "open_by_handle_at", "name_to_handle_at",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"reboot", "swapon", "swapoff", "settimeofday", "clock_settime", "clock_adjtime",
	"adjtimex", "syslog", "acct", "quotactl", "quotactl_fd", "lookup_dcookie",
	"vhangup", "iopl", "ioperm", "modify_ldt", "uselib",
	"capset", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid",
	"setfsuid", "setfsgid", "setgroups", "migrate_pages", "move_pages", "fanotify_init",
	"chmod", "fchmod", "utimensat", "fchmodat", "fchmodat2", "chown", "lchown", "fchown", "fchownat",
	"setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
	"setxattrat", "removexattrat", "memfd_secret",
	"nfsservctl", "create_module", "get_kernel_syms", "query_module", "_sysctl",
	"afs_syscall", "tuxcall", "security", "vserver",
	"sethostname", "setdomainname", "mknod", "mknodat",
	"shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl",
	"semget", "semop", "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend",
	"mq_timedreceive", "mq_notify", "mq_getsetattr", "ioprio_set",
	"inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_mark",
	// Issue 9: reached through the deny list, or kernel surface no job needs.
	"file_setattr", "file_getattr", "io_setup", "io_destroy", "io_submit", "io_cancel",
	"io_getevents", "io_pgetevents", "listmount", "statmount", "listns", "seccomp",
	"rt_sigqueueinfo", "rt_tgsigqueueinfo", "setpgid", "get_robust_list", "vmsplice",
	"lsm_get_self_attr", "lsm_set_self_attr", "lsm_list_modules", "sync", "syncfs",
	"mlock", "mlockall",
	// Issue 9, second review: a real-time signal by any thread id.
	"tkill",
}

// netOnly is what the job layer denies without the network only.
var netOnly = []string{"sendmsg", "sendmmsg", "connect", "bind", "listen", "accept", "accept4"}

var absentOn = map[string][]string{
	"amd64": {},
	"arm64": {
		"fork", "vfork", "utime", "utimes", "futimesat", "iopl", "ioperm", "modify_ldt", "inotify_init",
		"uselib", "chmod", "chown", "lchown", "create_module", "get_kernel_syms",
		"query_module", "_sysctl", "afs_syscall", "tuxcall", "security", "vserver", "mknod",
	},
}

// Spot checks of numbers against the kernel's syscall tables, independent of
// x/sys.
var knownNumbers = map[string]map[string]uint32{
	"amd64": {
		"fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101,
		"chmod": 90, "fchmodat2": 452, "setxattrat": 463, "removexattrat": 466,
		"open_tree_attr": 467, "clone": 56, "clone3": 435, "socket": 41, "ioctl": 16,
		"prlimit64": 302, "personality": 135, "utimensat": 280, "bpf": 321,
		"file_setattr": 469, "io_setup": 206, "listmount": 458, "socketpair": 53, "fcntl": 72,
		"prctl": 157,
	},
	"arm64": {
		"execve": 221, "execveat": 281, "ptrace": 117, "fchmodat": 53, "fchmodat2": 452,
		"setxattrat": 463, "removexattrat": 466, "open_tree_attr": 467, "clone": 220,
		"clone3": 435, "socket": 198, "ioctl": 29, "prlimit64": 261, "personality": 92,
		"utimensat": 88, "bpf": 280, "file_setattr": 469, "io_setup": 0, "listmount": 458,
		"socketpair": 199, "fcntl": 25, "prctl": 167,
	},
}

func policies() []struct {
	name string
	p    Policy
} {
	return []struct {
		name string
		p    Policy
	}{
		{"deny-network", Policy{AllowNetwork: false}},
		{"allow-network", Policy{AllowNetwork: true}},
	}
}

func TestBuildProgramShape(t *testing.T) {
	for _, pol := range policies() {
		t.Run(pol.name, func(t *testing.T) {
			l, err := Build(pol.p)
			require.NoError(t, err)
			for _, prog := range []Program{l.Template, l.Job} {
				require.NotEmpty(t, prog)
				require.Less(t, len(prog), unix.BPF_MAXINSNS)
				require.NoError(t, prog.validate())
			}
			// The job layer is what every spare pays to attach: it stays short.
			require.Less(t, len(l.Job), 40)
			t.Logf("%s: template layer %d instructions, job layer %d", pol.name, len(l.Template), len(l.Job))
		})
	}
}

func TestBuildUnsupportedArch(t *testing.T) {
	_, err := buildFor("riscv64", Policy{})
	require.ErrorContains(t, err, "riscv64")
	_, err = buildFor("mips64le", Policy{AllowNetwork: true})
	require.ErrorContains(t, err, "mips64le")
	_, err = tableFor(runtime.GOARCH)
	require.NoError(t, err)
}

func TestTableCoversRequiredSyscalls(t *testing.T) {
	absent := absentOn[runtime.GOARCH]
	for _, name := range requiredDenied {
		t.Run(name, func(t *testing.T) {
			_, ok := nativeTable.lookup(name)
			if slices.Contains(absent, name) {
				require.False(t, ok, "%s does not exist on %s", name, runtime.GOARCH)
				return
			}
			require.True(t, ok, "%s missing from the %s deny list", name, runtime.GOARCH)
		})
	}
	for name, nr := range knownNumbers[runtime.GOARCH] {
		got, ok := nativeTable.lookup(name)
		require.True(t, ok, name)
		require.Equal(t, nr, got, name)
	}
	// Every named denial must be one of the required names, and none of
	// them may be on the allow list.
	for _, e := range slices.Concat(nativeTable.deny, nativeTable.jobDeny) {
		require.Contains(t, requiredDenied, e.name)
	}
	for _, e := range nativeTable.allow {
		require.NotContains(t, requiredDenied, e.name)
		require.NotContains(t, netOnly, e.name)
	}
	for _, e := range nativeTable.netOnly {
		require.Contains(t, netOnly, e.name)
	}
}

type vmCase struct {
	name string
	d    Data
	want uint32
}

// policyCases returns the expected action of every class of system call under p.
func policyCases(t *testing.T, p Policy) []vmCase {
	t.Helper()
	threadFlags := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
		unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID |
		unix.CLONE_CHILD_CLEARTID)
	inet := eperm
	if p.AllowNetwork {
		inet = ActionAllow
	}
	cases := []vmCase{
		// Plain allowed system calls.
		{"read", call(unix.SYS_READ, 0, 0x1000, 10), ActionAllow},
		{"write", call(unix.SYS_WRITE, 1, 0x1000, 10), ActionAllow},
		{"mmap", call(unix.SYS_MMAP, 0, 4096, 3, 0x22, ^uint64(0), 0), ActionAllow},
		{"futex", call(unix.SYS_FUTEX, 0x1000, 0, 1), ActionAllow},
		{"getpid", call(unix.SYS_GETPID), ActionAllow},
		{"openat", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, 0), ActionAllow},
		{"openat O_CREAT 0666", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, unix.O_CREAT|unix.O_WRONLY, 0o666), ActionAllow},
		{"openat O_CREAT 01777", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, unix.O_CREAT|unix.O_WRONLY, 0o1777), ActionAllow},
		{"openat O_CREAT 04755", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, unix.O_CREAT|unix.O_WRONLY, 0o4755), eperm},
		{"openat O_TMPFILE 02755", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, unix.O_TMPFILE|unix.O_RDWR, 0o2755), eperm},
		{"openat 04755, high bits", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, unix.O_CREAT, 0o4755|1<<32), eperm},
		{"openat 0644, S_ISUID in the high bits", call(unix.SYS_OPENAT, uint64(0xffffff9c), 0x1000, unix.O_CREAT, 0o644|0o4000<<32), ActionAllow},
		{"openat2", call(unix.SYS_OPENAT2, uint64(0xffffff9c), 0x1000, 0x2000, 24), enosys},
		{"exit_group", call(unix.SYS_EXIT_GROUP, 0), ActionAllow},
		{"fchmod", call(unix.SYS_FCHMOD, 3, 0o600), eperm},
		{"umask 022", call(unix.SYS_UMASK, 0o022), ActionAllow},
		{"umask 077", call(unix.SYS_UMASK, 0o077), ActionAllow},
		{"umask 0", call(unix.SYS_UMASK, 0), eperm},
		{"umask 002", call(unix.SYS_UMASK, 0o002), eperm},
		{"umask 020", call(unix.SYS_UMASK, 0o020), eperm},
		{"umask 0, 022 in the high bits", call(unix.SYS_UMASK, 0o022<<32), eperm},
		{"landlock_create_ruleset", call(unix.SYS_LANDLOCK_CREATE_RULESET, 0x1000, 16, 0), ActionAllow},
		{"landlock_add_rule", call(unix.SYS_LANDLOCK_ADD_RULE, 3, 1, 0x1000, 0), ActionAllow},
		{"landlock_restrict_self", call(unix.SYS_LANDLOCK_RESTRICT_SELF, 3, 0), ActionAllow},
		{"landlock numbers are 444-446", call(444), ActionAllow},
		{"landlock 446", call(446), ActionAllow},
		{"landlock 447 is not landlock", call(447), eperm},
		{"seccomp (the job layer's)", call(unix.SYS_SECCOMP, 1, 0, 0x1000), eperm},
		{"memfd_create", call(unix.SYS_MEMFD_CREATE, 0x1000, 0), ActionAllow},
		{"getrandom", call(unix.SYS_GETRANDOM, 0x1000, 16, 0), ActionAllow},
		{"statx", call(unix.SYS_STATX, uint64(0xffffff9c), 0x1000, 0, 0x7ff, 0x2000), ActionAllow},

		// Default deny: numbers nobody listed, newer than the table, or
		// beyond any the kernel knows.
		{"file_setattr (469)", call(469, 3, 0, 0x1000, 24, 0), eperm},
		{"listns (470)", call(470), eperm},
		{"syscall 471", call(471), eperm},
		{"syscall 520", call(520), eperm},
		{"unknown syscall 1000", call(1000), eperm},
		{"syscall 0x3fffffff", call(0x3fffffff), eperm},
		{"io_setup", call(unix.SYS_IO_SETUP, 1, 0x1000), eperm},
		{"listmount", call(unix.SYS_LISTMOUNT, 0x1000, 0x2000, 16, 0), eperm},

		// socketpair: an AF_UNIX stream pair only.
		{"socketpair stream", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM, 0, 0x1000), ActionAllow},
		{"socketpair stream cloexec nonblock", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0, 0x1000), ActionAllow},
		{"socketpair stream, high bits", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX|0xffffffff00000000, unix.SOCK_STREAM|0xdead00000000, 0, 0x1000), ActionAllow},
		{"socketpair dgram", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_DGRAM, 0, 0x1000), eperm},
		{"socketpair dgram cloexec", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0, 0x1000), eperm},
		{"socketpair seqpacket", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_SEQPACKET, 0, 0x1000), eperm},
		{"socketpair stream|other flag", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM|0x100, 0, 0x1000), eperm},
		{"socketpair AF_NETLINK", call(unix.SYS_SOCKETPAIR, unix.AF_NETLINK, unix.SOCK_STREAM, 0, 0x1000), eperm},
		{"socketpair AF_VSOCK", call(unix.SYS_SOCKETPAIR, unix.AF_VSOCK, unix.SOCK_STREAM, 0, 0x1000), eperm},
		{"socketpair AF_INET", call(unix.SYS_SOCKETPAIR, unix.AF_INET, unix.SOCK_STREAM, 0, 0x1000), eperm},

		// fcntl.
		{"fcntl F_GETFD", call(unix.SYS_FCNTL, 3, unix.F_GETFD), ActionAllow},
		{"fcntl F_SETFL", call(unix.SYS_FCNTL, 3, unix.F_SETFL, unix.O_NONBLOCK), ActionAllow},
		{"fcntl F_DUPFD_CLOEXEC", call(unix.SYS_FCNTL, 3, unix.F_DUPFD_CLOEXEC, 64), ActionAllow},
		{"fcntl F_SETLKW", call(unix.SYS_FCNTL, 3, unix.F_SETLKW, 0x1000), ActionAllow},
		{"fcntl F_OFD_SETLK", call(unix.SYS_FCNTL, 3, unix.F_OFD_SETLK, 0x1000), ActionAllow},
		{"fcntl F_ADD_SEALS", call(unix.SYS_FCNTL, 3, unix.F_ADD_SEALS, 1), ActionAllow},
		{"fcntl F_GETFD, high bits", call(unix.SYS_FCNTL, 3, unix.F_GETFD|0xffffffff00000000), ActionAllow},
		{"fcntl F_SETLEASE", call(unix.SYS_FCNTL, 3, unix.F_SETLEASE, unix.F_RDLCK), eperm},
		{"fcntl F_SETLEASE, high bits", call(unix.SYS_FCNTL, 3, unix.F_SETLEASE|0x100000000, unix.F_RDLCK), eperm},
		{"fcntl F_GETLEASE", call(unix.SYS_FCNTL, 3, unix.F_GETLEASE), eperm},
		{"fcntl F_NOTIFY", call(unix.SYS_FCNTL, 3, unix.F_NOTIFY, 0xffffffff), eperm},
		{"fcntl F_SETOWN", call(unix.SYS_FCNTL, 3, unix.F_SETOWN, 1), eperm},
		{"fcntl F_SETOWN_EX", call(unix.SYS_FCNTL, 3, unix.F_SETOWN_EX, 0x1000), eperm},
		{"fcntl F_SETSIG", call(unix.SYS_FCNTL, 3, unix.F_SETSIG, 9), eperm},
		{"fcntl F_SETPIPE_SZ", call(unix.SYS_FCNTL, 3, unix.F_SETPIPE_SZ, 1<<20), eperm},

		// prctl.
		{"prctl PR_GET_PDEATHSIG", call(unix.SYS_PRCTL, unix.PR_GET_PDEATHSIG, 0x1000), ActionAllow},
		{"prctl PR_SET_NAME", call(unix.SYS_PRCTL, unix.PR_SET_NAME, 0x1000), ActionAllow},
		{"prctl PR_SET_NO_NEW_PRIVS", call(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1), ActionAllow},
		{"prctl PR_GET_SECCOMP", call(unix.SYS_PRCTL, unix.PR_GET_SECCOMP), ActionAllow},
		{"prctl PR_CAPBSET_READ", call(unix.SYS_PRCTL, unix.PR_CAPBSET_READ, 21), ActionAllow},
		{"prctl PR_SET_PDEATHSIG 0", call(unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG, 0), eperm},
		{"prctl PR_SET_PDEATHSIG, high bits", call(unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG|0xffffffff00000000, 0), eperm},
		{"prctl PR_SET_SECCOMP", call(unix.SYS_PRCTL, unix.PR_SET_SECCOMP, 2, 0x1000), eperm},
		{"prctl PR_SET_DUMPABLE", call(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, 1), eperm},
		{"prctl PR_SET_MM", call(unix.SYS_PRCTL, unix.PR_SET_MM, 1, 0x1000), eperm},
		{"prctl PR_SET_CHILD_SUBREAPER", call(unix.SYS_PRCTL, unix.PR_SET_CHILD_SUBREAPER, 1), eperm},
		{"prctl PR_SET_PTRACER", call(unix.SYS_PRCTL, unix.PR_SET_PTRACER, 0xffffffffffffffff), eperm},
		{"prctl PR_CAP_AMBIENT", call(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, 2, 21), eperm},

		// The socket calls only the network needs.
		{"connect", call(unix.SYS_CONNECT, 3, 0x1000, 16), inet},
		{"bind", call(unix.SYS_BIND, 3, 0x1000, 16), inet},
		{"listen", call(unix.SYS_LISTEN, 3, 5), inet},
		{"accept4", call(unix.SYS_ACCEPT4, 3, 0, 0, 0), inet},
		{"sendto", call(unix.SYS_SENDTO, 3, 0x1000, 1, 0, 0x2000, 16), ActionAllow},
		{"recvmsg", call(unix.SYS_RECVMSG, 3, 0x1000, 0), ActionAllow},

		// clone.
		{"clone thread", call(unix.SYS_CLONE, threadFlags), ActionAllow},
		{"clone thread, junk in high 32 bits", call(unix.SYS_CLONE, threadFlags|0xffffffff00000000), ActionAllow},
		{"clone SIGCHLD (fork)", call(unix.SYS_CLONE, uint64(unix.SIGCHLD)), eperm},
		{"clone 0", call(unix.SYS_CLONE, 0), eperm},
		{"clone CLONE_VM|CLONE_VFORK", call(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_VFORK|uint64(unix.SIGCHLD)), eperm},
		{"clone CLONE_THREAD only in high bits", call(unix.SYS_CLONE, uint64(unix.CLONE_THREAD)<<32), eperm},
		{"clone3", call(unix.SYS_CLONE3, 0x1000, 88), enosys},
		{"clone3 NULL", call(unix.SYS_CLONE3, 0, 0), enosys},

		// socket.
		{"socket AF_INET", call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, 0), inet},
		{"socket AF_INET6", call(unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_DGRAM, 0), inet},
		{"socket AF_INET high bits", call(unix.SYS_SOCKET, unix.AF_INET|0x100000000, unix.SOCK_STREAM, 0), inet},
		{"socket AF_UNIX", call(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM, 0), eperm},
		{"socket AF_NETLINK", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, 0), eperm},
		{"socket AF_PACKET", call(unix.SYS_SOCKET, unix.AF_PACKET, unix.SOCK_RAW, 0), eperm},
		{"socket AF_VSOCK", call(unix.SYS_SOCKET, 40, unix.SOCK_STREAM, 0), eperm},
		{"socket AF_UNSPEC", call(unix.SYS_SOCKET, 0, unix.SOCK_STREAM, 0), eperm},

		// ioctl.
		{"ioctl TCGETS", call(unix.SYS_IOCTL, 0, unix.TCGETS, 0x1000), ActionAllow},
		{"ioctl TCGETS, high bits", call(unix.SYS_IOCTL, 0, unix.TCGETS|0xffffffff00000000, 0x1000), ActionAllow},
		{"ioctl TIOCGWINSZ", call(unix.SYS_IOCTL, 1, unix.TIOCGWINSZ, 0x1000), ActionAllow},
		{"ioctl FIONREAD", call(unix.SYS_IOCTL, 0, 0x541B, 0x1000), ActionAllow},
		{"ioctl FIONBIO", call(unix.SYS_IOCTL, 0, 0x5421, 0x1000), ActionAllow},
		{"ioctl FIOCLEX", call(unix.SYS_IOCTL, 0, 0x5451), ActionAllow},
		{"ioctl FIONCLEX", call(unix.SYS_IOCTL, 0, 0x5450), ActionAllow},
		{"ioctl FS_IOC_SETFLAGS", call(unix.SYS_IOCTL, 3, unix.FS_IOC_SETFLAGS, 0x1000), eperm},
		{"ioctl FS_IOC_FSSETXATTR", call(unix.SYS_IOCTL, 3, 0x401c5820 /* FS_IOC_FSSETXATTR */, 0x1000), eperm},
		{"ioctl FS_IOC_GETFLAGS", call(unix.SYS_IOCTL, 3, unix.FS_IOC_GETFLAGS, 0x1000), eperm},
		{"ioctl TCSETS", call(unix.SYS_IOCTL, 0, unix.TCSETS, 0x1000), eperm},
		{"ioctl SIOCGIFCONF", call(unix.SYS_IOCTL, 3, unix.SIOCGIFCONF, 0x1000), eperm},
		{"ioctl FICLONE", call(unix.SYS_IOCTL, 3, unix.FICLONE, 4), eperm},
		{"ioctl 0", call(unix.SYS_IOCTL, 3, 0, 0), eperm},
		{"ioctl TIOCSTI", call(unix.SYS_IOCTL, 0, unix.TIOCSTI, 0x1000), eperm},
		{"ioctl TIOCLINUX", call(unix.SYS_IOCTL, 0, unix.TIOCLINUX, 0x1000), eperm},
		{"ioctl TIOCSTI with high bits", call(unix.SYS_IOCTL, 0, unix.TIOCSTI|0xdead00000000, 0x1000), eperm},
		{"ioctl TIOCLINUX with high bits", call(unix.SYS_IOCTL, 0, unix.TIOCLINUX|0xffffffff00000000, 0x1000), eperm},

		// prlimit64.
		{"prlimit64 self", call(unix.SYS_PRLIMIT64, 0, unix.RLIMIT_NOFILE, 0, 0x1000), ActionAllow},
		{"prlimit64 other pid", call(unix.SYS_PRLIMIT64, 1234, unix.RLIMIT_NOFILE, 0, 0x1000), eperm},
		{"prlimit64 pid in high half", call(unix.SYS_PRLIMIT64, 1<<32, unix.RLIMIT_NOFILE, 0, 0x1000), eperm},
		// Scheduling: only the calling process.
		{"setpriority self", call(unix.SYS_SETPRIORITY, unix.PRIO_PROCESS, 0, 10), ActionAllow},
		{"setpriority other pid", call(unix.SYS_SETPRIORITY, unix.PRIO_PROCESS, 1, 10), eperm},
		{"setpriority whole uid", call(unix.SYS_SETPRIORITY, unix.PRIO_USER, 0, 19), eperm},
		{"sched_setaffinity self", call(unix.SYS_SCHED_SETAFFINITY, 0, 8, 0x1000), ActionAllow},
		{"sched_setaffinity other", call(unix.SYS_SCHED_SETAFFINITY, 1, 8, 0x1000), eperm},
		{"sched_setscheduler other", call(unix.SYS_SCHED_SETSCHEDULER, 1, 0, 0x1000), eperm},
		// kill and tgkill: no real-time signal (the uid's queued-signal
		// count), compared as the kernel's int.
		{"kill SIGKILL", call(unix.SYS_KILL, 5, uint64(unix.SIGKILL)), ActionAllow},
		{"kill 0 (existence)", call(unix.SYS_KILL, 5, 0), ActionAllow},
		{"kill 31", call(unix.SYS_KILL, 5, 31), ActionAllow},
		{"kill SIGRTMIN", call(unix.SYS_KILL, 5, 32), eperm},
		{"kill 64", call(unix.SYS_KILL, 0, 64), eperm},
		{"kill -1", call(unix.SYS_KILL, 5, 0xffffffff), eperm},
		{"kill SIGRTMIN, high bits", call(unix.SYS_KILL, 5, 32|1<<32), eperm},
		{"kill SIGTERM, high bits", call(unix.SYS_KILL, 5, uint64(unix.SIGTERM)|0xffffffff00000000), ActionAllow},
		{"tgkill SIGURG", call(unix.SYS_TGKILL, 5, 6, uint64(unix.SIGURG)), ActionAllow},
		{"tgkill SIGRTMIN", call(unix.SYS_TGKILL, 5, 6, 32), eperm},
		{"tgkill SIGRTMIN+1", call(unix.SYS_TGKILL, 5, 6, 33), eperm},
		{"tgkill -2", call(unix.SYS_TGKILL, 5, 6, 0xfffffffffffffffe), eperm},
		{"tkill", call(unix.SYS_TKILL, 5, uint64(unix.SIGTERM)), eperm},
		// The send and receive calls: any flags but MSG_OOB.
		{"sendto MSG_DONTWAIT", call(unix.SYS_SENDTO, 3, 0, 1, unix.MSG_DONTWAIT), ActionAllow},
		{"sendto MSG_OOB", call(unix.SYS_SENDTO, 3, 0, 1, unix.MSG_OOB), eperm},
		{"recvfrom MSG_OOB|MSG_PEEK", call(unix.SYS_RECVFROM, 3, 0, 1, unix.MSG_OOB|unix.MSG_PEEK), eperm},
		{"sendmsg 0", call(unix.SYS_SENDMSG, 3, 0, 0), inet},
		{"sendmsg MSG_OOB", call(unix.SYS_SENDMSG, 3, 0, unix.MSG_OOB), eperm},
		{"sendmsg MSG_OOB, high bits", call(unix.SYS_SENDMSG, 3, 0, unix.MSG_OOB|1<<32), eperm},
		{"sendmsg MSG_OOB only in the high bits", call(unix.SYS_SENDMSG, 3, 0, unix.MSG_OOB<<32), inet},
		{"sendmmsg 0", call(unix.SYS_SENDMMSG, 3, 0, 1, 0), inet},
		{"recvmsg MSG_CMSG_CLOEXEC", call(unix.SYS_RECVMSG, 3, 0, unix.MSG_CMSG_CLOEXEC), ActionAllow},
		{"recvmsg MSG_OOB", call(unix.SYS_RECVMSG, 3, 0, unix.MSG_OOB), eperm},
		{"sendmmsg MSG_OOB", call(unix.SYS_SENDMMSG, 3, 0, 1, unix.MSG_OOB), eperm},
		{"recvmmsg MSG_OOB", call(unix.SYS_RECVMMSG, 3, 0, 1, unix.MSG_OOB), eperm},
		{"recvmmsg MSG_WAITFORONE", call(unix.SYS_RECVMMSG, 3, 0, 1, unix.MSG_WAITFORONE), ActionAllow},
		// madvise: not the advices that evict the shared page cache or
		// merge pages (EINVAL); posix_fadvise: DONTNEED is a no-op;
		// preadv2 and pwritev2: never RWF_NOWAIT (review 33).
		{"madvise DONTNEED", call(unix.SYS_MADVISE, 0x1000, 4096, unix.MADV_DONTNEED), ActionAllow},
		{"madvise HUGEPAGE", call(unix.SYS_MADVISE, 0x1000, 4096, unix.MADV_HUGEPAGE), ActionAllow},
		{"madvise MERGEABLE", call(unix.SYS_MADVISE, 0x1000, 4096, unix.MADV_MERGEABLE), ActionErrno | uint32(unix.EINVAL)},
		{"madvise PAGEOUT", call(unix.SYS_MADVISE, 0x1000, 4096, unix.MADV_PAGEOUT), ActionErrno | uint32(unix.EINVAL)},
		{"madvise COLD", call(unix.SYS_MADVISE, 0x1000, 4096, unix.MADV_COLD), ActionErrno | uint32(unix.EINVAL)},
		{"fadvise SEQUENTIAL", call(unix.SYS_FADVISE64, 3, 0, 0, unix.FADV_SEQUENTIAL), ActionAllow},
		{"fadvise DONTNEED", call(unix.SYS_FADVISE64, 3, 0, 0, unix.FADV_DONTNEED), ActionErrno},
		{"preadv2 0", call(unix.SYS_PREADV2, 3, 0, 1, 0, 0, 0), ActionAllow},
		{"preadv2 RWF_HIPRI", call(unix.SYS_PREADV2, 3, 0, 1, 0, 0, unix.RWF_HIPRI), ActionAllow},
		{"preadv2 RWF_NOWAIT", call(unix.SYS_PREADV2, 3, 0, 1, 0, 0, unix.RWF_NOWAIT), ActionErrno | uint32(unix.EOPNOTSUPP)},
		{"pwritev2 RWF_NOWAIT", call(unix.SYS_PWRITEV2, 3, 0, 1, 0, 0, unix.RWF_NOWAIT), ActionErrno | uint32(unix.EOPNOTSUPP)},
		// fallocate: mode 0 and PUNCH_HOLE|KEEP_SIZE only.
		{"fallocate 0", call(unix.SYS_FALLOCATE, 3, 0, 0, 1<<20), ActionAllow},
		{"fallocate PUNCH_HOLE|KEEP_SIZE", call(unix.SYS_FALLOCATE, 3, 3, 0, 1<<20), ActionAllow},
		{"fallocate 0, high bits", call(unix.SYS_FALLOCATE, 3, 0xffffffff00000000, 0, 1<<20), ActionAllow},
		{"fallocate KEEP_SIZE", call(unix.SYS_FALLOCATE, 3, 1, 0, 64<<20), ActionErrno | uint32(unix.EOPNOTSUPP)},
		{"fallocate ZERO_RANGE|KEEP_SIZE", call(unix.SYS_FALLOCATE, 3, 0x11, 0, 64<<20), ActionErrno | uint32(unix.EOPNOTSUPP)},
		{"fallocate ZERO_RANGE", call(unix.SYS_FALLOCATE, 3, 0x10, 0, 64<<20), ActionErrno | uint32(unix.EOPNOTSUPP)},
		{"fallocate PUNCH_HOLE alone", call(unix.SYS_FALLOCATE, 3, 2, 0, 64<<20), ActionErrno | uint32(unix.EOPNOTSUPP)},
		{"fallocate INSERT_RANGE", call(unix.SYS_FALLOCATE, 3, 0x20, 0, 64<<20), ActionErrno | uint32(unix.EOPNOTSUPP)},
		// Clocks: static ones, and the caller's own CPU clocks.
		{"clock_gettime REALTIME", call(unix.SYS_CLOCK_GETTIME, 0, 0x1000), ActionAllow},
		{"clock_gettime PROCESS_CPUTIME_ID", call(unix.SYS_CLOCK_GETTIME, 2, 0x1000), ActionAllow},
		{"clock_gettime THREAD_CPUTIME_ID", call(unix.SYS_CLOCK_GETTIME, 3, 0x1000), ActionAllow},
		{"clock_gettime TAI", call(unix.SYS_CLOCK_GETTIME, 11, 0x1000), ActionAllow},
		{"clock_gettime own process clock (pid 0)", call(unix.SYS_CLOCK_GETTIME, 0xfffffffa, 0x1000), ActionAllow},
		{"clock_gettime own thread clock (tid 0)", call(unix.SYS_CLOCK_GETTIME, 0xfffffffe, 0x1000), ActionAllow},
		{"clock_gettime a thread's clock (tid 7)", call(unix.SYS_CLOCK_GETTIME, 0xffffffc6, 0x1000), ActionAllow},
		{"clock_gettime pid 1's clock", call(unix.SYS_CLOCK_GETTIME, 0xfffffff2, 0x1000), eperm},
		{"clock_gettime pid 1's clock, high bits", call(unix.SYS_CLOCK_GETTIME, 0xfffffffffffffff2, 0x1000), eperm},
		{"clock_gettime pid 3's PROF clock", call(unix.SYS_CLOCK_GETTIME, 0xffffffe0, 0x1000), eperm},
		{"clock_gettime fd 0's dynamic clock", call(unix.SYS_CLOCK_GETTIME, 0xfffffffb, 0x1000), eperm},
		{"clock_gettime fd 3's dynamic clock", call(unix.SYS_CLOCK_GETTIME, 0xffffffe3, 0x1000), eperm},
		{"clock_getres pid 1's clock", call(unix.SYS_CLOCK_GETRES, 0xfffffff2, 0x1000), eperm},
		{"clock_getres MONOTONIC", call(unix.SYS_CLOCK_GETRES, 1, 0x1000), ActionAllow},
		{"clock_nanosleep pid 1's clock", call(unix.SYS_CLOCK_NANOSLEEP, 0xfffffff2, 0, 0x1000, 0), eperm},
		{"clock_nanosleep MONOTONIC", call(unix.SYS_CLOCK_NANOSLEEP, 1, 0, 0x1000, 0), ActionAllow},
		{"timer_create pid 1's clock", call(unix.SYS_TIMER_CREATE, 0xfffffff2, 0, 0x1000), eperm},
		{"timer_create MONOTONIC", call(unix.SYS_TIMER_CREATE, 1, 0, 0x1000), ActionAllow},
		{"timer_create own process clock", call(unix.SYS_TIMER_CREATE, 2, 0, 0x1000), ActionAllow},
		// Sessions and groups: the caller's own.
		{"getsid 0", call(unix.SYS_GETSID, 0), ActionAllow},
		{"getsid 1", call(unix.SYS_GETSID, 1), eperm},
		{"getsid pid in high half", call(unix.SYS_GETSID, 1<<32), eperm},
		{"getpgid 0", call(unix.SYS_GETPGID, 0), ActionAllow},
		{"getpgid 1", call(unix.SYS_GETPGID, 1), eperm},
		// System V IPC and POSIX message queues.
		{"shmget", call(unix.SYS_SHMGET, 0, 4096, 0o1600), eperm},
		{"msgget", call(unix.SYS_MSGGET, 0, 0o1600), eperm},
		{"semget", call(unix.SYS_SEMGET, 0, 1, 0o1600), eperm},
		{"mq_open", call(unix.SYS_MQ_OPEN, 0x1000, 0o100), eperm},

		// personality.
		{"personality query", call(unix.SYS_PERSONALITY, 0xffffffff), ActionAllow},
		{"personality query, high bits", call(unix.SYS_PERSONALITY, 0xffffffffffffffff), ActionAllow},
		{"personality PER_LINUX", call(unix.SYS_PERSONALITY, 0), eperm},
		{"personality PER_LINUX32", call(unix.SYS_PERSONALITY, 0x0008), eperm},
		{"personality ADDR_NO_RANDOMIZE", call(unix.SYS_PERSONALITY, 0x0040000), eperm},

		// utimensat.
		{"utimensat futimens form", call(unix.SYS_UTIMENSAT, 3, 0, 0x1000, 0), eperm},
		{"utimensat with path", call(unix.SYS_UTIMENSAT, uint64(0xffffff9c), 0x7ffd1000, 0, 0), eperm},
		{"utimensat path in high half", call(unix.SYS_UTIMENSAT, 3, 1<<32, 0, 0), eperm},

		// Architecture.
		{"i386 getpid", Data{Nr: 20, Arch: unix.AUDIT_ARCH_I386}, ActionKillProcess},
		{"i386 read", Data{Nr: 3, Arch: unix.AUDIT_ARCH_I386}, ActionKillProcess},
		{"arch 0", Data{Nr: 0, Arch: 0}, ActionKillProcess},
		{"AArch32", Data{Nr: 20, Arch: unix.AUDIT_ARCH_ARM}, ActionKillProcess},
	}
	if nativeTable.auditArch == unix.AUDIT_ARCH_X86_64 {
		cases = append(cases,
			vmCase{"aarch64 arch on amd64", Data{Nr: 0, Arch: unix.AUDIT_ARCH_AARCH64}, ActionKillProcess})
	} else {
		cases = append(cases,
			vmCase{"x86_64 arch on arm64", Data{Nr: 0, Arch: unix.AUDIT_ARCH_X86_64}, ActionKillProcess})
	}
	if nativeTable.x32 {
		cases = append(cases,
			vmCase{"x32 getpid", call(unix.SYS_GETPID | x32SyscallBit), eperm},
			vmCase{"x32 execve (59)", call(unix.SYS_EXECVE | x32SyscallBit), eperm},
			vmCase{"x32 execve (520)", call(520 | x32SyscallBit), eperm},
			vmCase{"x32 read", call(unix.SYS_READ | x32SyscallBit), eperm},
			vmCase{"nr 0xffffffff", call(0xffffffff), eperm},
		)
	}
	// Every always-denied system call, with arbitrary arguments.
	for _, name := range requiredDenied {
		nr, ok := nativeTable.lookup(name)
		if !ok {
			continue
		}
		cases = append(cases,
			vmCase{name, call(nr), eperm},
			vmCase{name + " with args", call(nr, 0xffffffffffffffff, 1, 2, 3, 4, 5), eperm})
	}
	return cases
}

func TestPolicyVM(t *testing.T) {
	for _, pol := range policies() {
		t.Run(pol.name, func(t *testing.T) {
			prog, err := Build(pol.p)
			require.NoError(t, err)
			for _, tc := range policyCases(t, pol.p) {
				t.Run(tc.name, func(t *testing.T) {
					got, err := prog.Run(tc.d)
					require.NoError(t, err)
					require.Equalf(t, tc.want, got, "want %s, got %s", retName(tc.want), retName(got))
				})
			}
		})
	}
}

// TestPolicyVMExhaustive compares the program against a direct Go model of
// the policy for every syscall number up to 1024 and a few beyond, with
// several argument sets, the interesting values in the low and in the high
// halves.
func TestPolicyVMExhaustive(t *testing.T) {
	testenv.Slow(t)
	allowed := make(map[uint32]bool)
	for _, e := range nativeTable.allow {
		allowed[e.nr] = true
	}
	jobDenied := make(map[uint32]bool)
	for _, e := range nativeTable.jobDeny {
		jobDenied[e.nr] = true
	}
	netOnly := make(map[uint32]bool)
	for _, e := range nativeTable.netOnly {
		netOnly[e.nr] = true
	}
	model := func(p Policy, nr uint32, args [6]uint64) uint32 {
		lo := func(i int) uint32 { return uint32(args[i]) }
		in := func(v uint32, set []uint32) bool { return slices.Contains(set, v) }
		switch {
		case nativeTable.x32 && nr >= x32SyscallBit:
			return eperm
		case nr == unix.SYS_OPENAT2:
			return enosys
		case slices.ContainsFunc(nativeTable.openModeCalls(), func(c oobCall) bool { return c.nr == nr }):
			calls := nativeTable.openModeCalls()
			i := slices.IndexFunc(calls, func(c oobCall) bool { return c.nr == nr })
			if lo(int(calls[i].arg))&setIDModeBits != 0 {
				return eperm
			}
			return ActionAllow
		case slices.ContainsFunc(oobCalls, func(c oobCall) bool { return c.nr == nr }):
			i := slices.IndexFunc(oobCalls, func(c oobCall) bool { return c.nr == nr })
			if lo(int(oobCalls[i].arg))&unix.MSG_OOB != 0 || (netOnly[nr] && !p.AllowNetwork) {
				return eperm
			}
			return ActionAllow
		case allowed[nr]:
			return ActionAllow
		case jobDenied[nr]:
			return eperm
		case netOnly[nr]:
			if p.AllowNetwork {
				return ActionAllow
			}
			return eperm
		case nr == nativeTable.clone3:
			return enosys
		case nr == nativeTable.clone:
			if lo(0)&unix.CLONE_THREAD == 0 || lo(0)&cloneNamespaceFlags != 0 {
				return eperm
			}
		case nr == nativeTable.socket:
			if !p.AllowNetwork || (lo(0) != unix.AF_INET && lo(0) != unix.AF_INET6) {
				return eperm
			}
		case nr == nativeTable.socketpair:
			if lo(0) != unix.AF_UNIX || lo(1)&^(unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC) != unix.SOCK_STREAM {
				return eperm
			}
		case nr == nativeTable.ioctl:
			if !in(lo(1), []uint32{unix.TCGETS, unix.TIOCGWINSZ, 0x541B, 0x5421, 0x5450, 0x5451}) {
				return eperm
			}
		case nr == nativeTable.fcntl:
			if !in(lo(1), allowedFcntls) {
				return eperm
			}
		case nr == nativeTable.prctl:
			if !in(lo(0), allowedPrctls) || lo(0) == unix.PR_SET_PDEATHSIG || lo(0) == unix.PR_SET_SECCOMP {
				return eperm
			}
		case nr == nativeTable.prlimit64:
			if args[0] != 0 {
				return eperm
			}
		case nr == nativeTable.personality:
			if lo(0) != 0xffffffff {
				return eperm
			}
		case nr == unix.SYS_SETPRIORITY:
			if args[0] != 0 || args[1] != 0 {
				return eperm
			}
		case nr == unix.SYS_KILL:
			if lo(1) >= 32 {
				return eperm
			}
		case nr == unix.SYS_TGKILL:
			if lo(2) >= 32 {
				return eperm
			}
		case nr == unix.SYS_FALLOCATE:
			if lo(1) != 0 && lo(1) != unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE {
				return ActionErrno | uint32(unix.EOPNOTSUPP)
			}
		case nr == unix.SYS_CLOCK_GETTIME, nr == unix.SYS_CLOCK_GETRES, nr == unix.SYS_CLOCK_NANOSLEEP,
			nr == unix.SYS_TIMER_CREATE:
			// A clockid_t: static clocks are >= 0; a negative id is
			// ((~pid) << 3) | bits, bit 2 marking a thread's clock and
			// bits 3 (with bit 2 clear) a descriptor's dynamic clock.
			id := int32(lo(0))
			ownProcess := id >= -8 && id <= -6
			thread := id < 0 && id&4 != 0
			if id < 0 && !ownProcess && !thread {
				return eperm
			}
		case nr == unix.SYS_MADVISE:
			// Not MERGEABLE 12, UNMERGEABLE 13, COLD 20, PAGEOUT 21,
			// HWPOISON 100, SOFT_OFFLINE 101, nor an unknown advice.
			if !in(lo(2), []uint32{0, 1, 2, 3, 4, 8, 9, 10, 11, 14, 15, 16, 17, 18, 19, 22, 23, 24, 25, 102, 103}) {
				return ActionErrno | uint32(unix.EINVAL)
			}
		case nr == unix.SYS_FADVISE64:
			if lo(3) == unix.FADV_DONTNEED || lo(3) > 5 {
				return ActionErrno // a no-op
			}
		case nr == unix.SYS_PREADV2, nr == unix.SYS_PWRITEV2:
			if lo(5)&unix.RWF_NOWAIT != 0 {
				return ActionErrno | uint32(unix.EOPNOTSUPP)
			}
		case nr == unix.SYS_UMASK:
			if lo(0)&0o022 != 0o022 {
				return eperm
			}
		case nr == unix.SYS_GETSID, nr == unix.SYS_GETPGID:
			if args[0] != 0 {
				return eperm
			}
		case nr == unix.SYS_SCHED_SETAFFINITY, nr == unix.SYS_SCHED_SETSCHEDULER,
			nr == unix.SYS_SCHED_SETPARAM, nr == unix.SYS_SCHED_SETATTR:
			if args[0] != 0 {
				return eperm
			}
		default:
			return eperm
		}
		return ActionAllow
	}
	argSets := [][6]uint64{
		{},
		{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)},
		{unix.CLONE_THREAD | unix.CLONE_VM | unix.CLONE_SIGHAND, unix.TIOCSTI},
		{unix.AF_INET6, unix.TIOCLINUX},
		{unix.AF_UNIX, unix.SOCK_STREAM | unix.SOCK_CLOEXEC},
		{unix.AF_UNIX | 1<<32, unix.SOCK_DGRAM},
		{unix.PR_SET_PDEATHSIG, unix.F_SETLEASE},
		{unix.PR_GET_PDEATHSIG | 1<<40, unix.F_GETFD | 1<<40},
		{unix.PR_SET_SECCOMP, unix.FS_IOC_SETFLAGS},
		{unix.PR_SET_NAME, unix.TCGETS | 0xffffffff00000000},
		{3, unix.F_NOTIFY},
		// The modes of open (arg 2), creat (arg 1) and openat (arg 3).
		{0xffffff9c, 0o4755, 0o2755, 0o4755},
		{0xffffff9c, 0o755 | 0o4000<<32, 0o6000 << 32, 0o644 | 0o4000<<32},
		// The flags of the send and receive calls (arg 2 or 3).
		{3, 0, unix.MSG_OOB, unix.MSG_OOB},
		{3, 0, unix.MSG_DONTWAIT | unix.MSG_OOB<<32, unix.MSG_PEEK | unix.MSG_OOB<<32},
		// Signals (kill's arg 1, tgkill's arg 2), fallocate modes (arg 1)
		// and clock ids (arg 0).
		{0, 31, 31},
		{1, 32, 32},
		{1, 64, 64 | 1<<32},
		{0xffffffff, 0xffffffff, 0xffffffff},
		{1 << 32, 1 << 32, 1<<32 | 5},
		{2, unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE},
		{0xfffffff8, unix.FALLOC_FL_KEEP_SIZE},
		{0xfffffff9, unix.FALLOC_FL_ZERO_RANGE},
		{0xfffffffa, unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE},
		{0xfffffffb},
		{0xfffffffe},
		{0xfffffffd},
		{0xfffffff7},
		{0xfffffff6},
		{0xfffffff2},
		{0xffffffe2 | 1<<32},
		{11},
		{0x7fffffff},
		{0x80000000},
		// madvise advices (arg 2), fadvise advices (arg 3), preadv2 and
		// pwritev2 flags (arg 5).
		{0, 0, unix.MADV_MERGEABLE, unix.FADV_DONTNEED, 0, unix.RWF_NOWAIT},
		{0, 0, unix.MADV_PAGEOUT, unix.FADV_WILLNEED, 0, unix.RWF_HIPRI},
		{0, 0, unix.MADV_DONTNEED, unix.FADV_NOREUSE, 0, unix.RWF_NOWAIT | 1<<32},
		{0, 0, unix.MADV_COLD | 1<<32, 6, 0, unix.RWF_NOWAIT << 32},
		{0, 0, 25, unix.FADV_DONTNEED | 1<<32, 0, unix.RWF_APPEND},
		{0, 0, 100, 0, 0, 0},
	}
	nrs := []uint32{x32SyscallBit, x32SyscallBit | unix.SYS_READ, 0x7fffffff, 0x80000000, 0xffffffff}
	for nr := uint32(0); nr <= 1024; nr++ {
		nrs = append(nrs, nr)
	}
	for _, pol := range policies() {
		prog, err := Build(pol.p)
		require.NoError(t, err)
		for _, nr := range nrs {
			for _, args := range argSets {
				d := call(nr)
				d.Args = args
				got, err := prog.Run(d)
				require.NoError(t, err)
				require.Equal(t, model(pol.p, nr, args), got, "%s: nr %d args %x", pol.name, nr, args)
			}
		}
	}
}

// TestBeyondTheTable checks that every number above the highest the table
// names, up to 4096 and at the edges of the 32-bit range, is denied:
// the filter lets nothing through that was written after it.
func TestBeyondTheTable(t *testing.T) {
	top := nativeTable.maxNr()
	require.GreaterOrEqual(t, top, uint32(469), "the table should know file_setattr (469)")
	for _, pol := range policies() {
		l, err := Build(pol.p)
		require.NoError(t, err)
		for nr := top + 1; nr <= 4096; nr++ {
			for _, args := range [][6]uint64{{}, {^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}} {
				d := call(nr)
				d.Args = args
				got, err := l.Run(d)
				require.NoError(t, err)
				require.Equal(t, eperm, got, "%s: nr %d", pol.name, nr)
				got, err = l.Template.Run(d)
				require.NoError(t, err)
				require.Equal(t, eperm, got, "%s: template layer alone, nr %d", pol.name, nr)
			}
		}
	}
}

func TestBuildChunkedAllowList(t *testing.T) {
	// A synthetic table with more allowed calls than fit in one 8-bit
	// jump range exercises the JA trampolines between chunks.
	tbl := *nativeTable
	tbl.allow, tbl.jobDeny, tbl.netOnly, tbl.deny = nil, nil, nil, nil
	special := map[uint32]bool{}
	for _, e := range tbl.special() {
		special[e.nr] = true
	}
	for _, e := range tbl.selfOnly() {
		special[e.nr] = true
	}
	for _, e := range tbl.argFiltered() {
		special[e.nr] = true
	}
	special[unix.SYS_SETNS] = true // filtered by nstype
	for _, c := range oobCalls {
		special[c.nr] = true // filtered by MSG_OOB
	}
	for _, c := range tbl.openModeCalls() {
		special[c.nr] = true // filtered by mode
	}
	special[unix.SYS_OPENAT2] = true // ENOSYS
	for nr := uint32(0); len(tbl.allow) < 3*maxChunk+17; nr++ {
		if !special[nr] && nr%3 != 0 {
			tbl.allow = append(tbl.allow, sysEntry{fmt.Sprintf("sys%d", nr), nr})
		}
	}
	prog, err := build(&tbl, Policy{})
	require.NoError(t, err)
	require.Less(t, len(prog.Template), unix.BPF_MAXINSNS)
	for _, e := range tbl.allow {
		got, err := prog.Run(call(e.nr))
		require.NoError(t, err)
		require.Equal(t, ActionAllow, got, e.name)
	}
	for nr := uint32(0); nr < 800; nr += 3 {
		if special[nr] {
			continue
		}
		got, err := prog.Run(call(nr))
		require.NoError(t, err)
		require.Equal(t, eperm, got, "nr %d", nr)
	}
}

func TestBuildRejectsDuplicates(t *testing.T) {
	tbl := *nativeTable
	tbl.deny = append(slices.Clone(tbl.deny), sysEntry{"clone-again", tbl.clone})
	_, err := build(&tbl, Policy{})
	require.ErrorContains(t, err, "listed twice")
	// A system call both allowed and named as denied is refused too.
	tbl = *nativeTable
	tbl.deny = append(slices.Clone(tbl.deny), sysEntry{"read-again", unix.SYS_READ})
	_, err = build(&tbl, Policy{})
	require.ErrorContains(t, err, "listed twice")
}

func ins(code uint16, jt, jf uint8, k uint32) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

const (
	ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	retK  = unix.BPF_RET | unix.BPF_K
	jeqK  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
)

func TestVMRejectsInvalidPrograms(t *testing.T) {
	long := make(Program, unix.BPF_MAXINSNS+1)
	for i := range long {
		long[i] = ins(retK, 0, 0, ActionAllow)
	}
	tests := []struct {
		name string
		prog Program
		msg  string
	}{
		{"empty", Program{}, "empty"},
		{"too long", long, "more than"},
		{"conditional jump out of range", Program{ins(ldAbs, 0, 0, 0), ins(jeqK, 5, 0, 1), ins(retK, 0, 0, 0)}, "jump out of range"},
		{"jf out of range", Program{ins(jeqK, 0, 1, 1), ins(retK, 0, 0, 0)}, "jump out of range"},
		{"ja out of range", Program{ins(unix.BPF_JMP|unix.BPF_JA, 0, 0, 1), ins(retK, 0, 0, 0)}, "jump out of range"},
		{"ja huge", Program{ins(unix.BPF_JMP|unix.BPF_JA, 0, 0, 0xffffffff), ins(retK, 0, 0, 0)}, "jump out of range"},
		{"load at 64", Program{ins(ldAbs, 0, 0, 64), ins(retK, 0, 0, 0)}, "outside seccomp_data"},
		{"load at 1000", Program{ins(ldAbs, 0, 0, 1000), ins(retK, 0, 0, 0)}, "outside seccomp_data"},
		{"unaligned load", Program{ins(ldAbs, 0, 0, 2), ins(retK, 0, 0, 0)}, "unaligned"},
		{"byte load", Program{ins(unix.BPF_LD|unix.BPF_B|unix.BPF_ABS, 0, 0, 0), ins(retK, 0, 0, 0)}, "unsupported opcode"},
		{"indirect load", Program{ins(unix.BPF_LD|unix.BPF_W|unix.BPF_IND, 0, 0, 0), ins(retK, 0, 0, 0)}, "unsupported opcode"},
		{"ret X", Program{ins(unix.BPF_RET|unix.BPF_X, 0, 0, 0)}, "unsupported opcode"},
		{"garbage opcode", Program{ins(0xffff, 0, 0, 0), ins(retK, 0, 0, 0)}, "unsupported opcode"},
		{"no ret at end", Program{ins(ldAbs, 0, 0, 0)}, "does not end with a return"},
		{"falls off the end", Program{ins(retK, 0, 0, 0), ins(ldAbs, 0, 0, 0)}, "does not end with a return"},
		{"shift by 32", Program{ins(unix.BPF_ALU|unix.BPF_LSH|unix.BPF_K, 0, 0, 32), ins(retK, 0, 0, 0)}, "shift"},
		{"scratch index 16", Program{ins(unix.BPF_ST, 0, 0, 16), ins(retK, 0, 0, 0)}, "scratch memory index"},
		{"scratch load before store", Program{ins(unix.BPF_LD|unix.BPF_MEM, 0, 0, 3), ins(retK, 0, 0, 0)}, "before any store"},
		{"scratch store on one path only", Program{
			ins(ldAbs, 0, 0, 0),
			ins(jeqK, 0, 1, 1),
			ins(unix.BPF_ST, 0, 0, 2),
			ins(unix.BPF_LD|unix.BPF_MEM, 0, 0, 2),
			ins(unix.BPF_RET|unix.BPF_A, 0, 0, 0),
		}, "before any store"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.prog.Run(call(0))
			require.Error(t, err)
			require.ErrorIs(t, err, errInvalid)
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestVMSemantics(t *testing.T) {
	tests := []struct {
		name string
		prog Program
		d    Data
		want uint32
	}{
		{"ret K", Program{ins(retK, 0, 0, 0x1234)}, Data{}, 0x1234},
		{"ret A after ld nr", Program{ins(ldAbs, 0, 0, 0), ins(unix.BPF_RET|unix.BPF_A, 0, 0, 0)}, Data{Nr: 77}, 77},
		{"ld arch", Program{ins(ldAbs, 0, 0, 4), ins(unix.BPF_RET|unix.BPF_A, 0, 0, 0)}, Data{Arch: 0xc000003e}, 0xc000003e},
		{"ld ip high", Program{ins(ldAbs, 0, 0, 12), ins(unix.BPF_RET|unix.BPF_A, 0, 0, 0)}, Data{InstructionPointer: 0xaabbccdd11223344}, 0xaabbccdd},
		{"ld args[5] low", Program{ins(ldAbs, 0, 0, 56), ins(unix.BPF_RET|unix.BPF_A, 0, 0, 0)}, Data{Args: [6]uint64{5: 0x1111222233334444}}, 0x33334444},
		{"ld args[5] high at 60", Program{ins(ldAbs, 0, 0, 60), ins(unix.BPF_RET|unix.BPF_A, 0, 0, 0)}, Data{Args: [6]uint64{5: 0x1111222233334444}}, 0x11112222},
		{"ld len", Program{ins(unix.BPF_LD|unix.BPF_W|unix.BPF_LEN, 0, 0, 0), ins(unix.BPF_RET|unix.BPF_A, 0, 0, 0)}, Data{}, 64},
		{"alu", Program{
			ins(unix.BPF_LD|unix.BPF_IMM, 0, 0, 0xf0),
			ins(unix.BPF_ALU|unix.BPF_OR|unix.BPF_K, 0, 0, 0x0f),
			ins(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, 0, 0, 0x3c),
			ins(unix.BPF_ALU|unix.BPF_ADD|unix.BPF_K, 0, 0, 4),
			ins(unix.BPF_ALU|unix.BPF_SUB|unix.BPF_K, 0, 0, 1),
			ins(unix.BPF_ALU|unix.BPF_LSH|unix.BPF_K, 0, 0, 8),
			ins(unix.BPF_ALU|unix.BPF_RSH|unix.BPF_K, 0, 0, 4),
			ins(unix.BPF_RET|unix.BPF_A, 0, 0, 0),
		}, Data{}, ((0x3c + 3) << 8) >> 4},
		{"sub wraps", Program{
			ins(unix.BPF_LD|unix.BPF_IMM, 0, 0, 0),
			ins(unix.BPF_ALU|unix.BPF_SUB|unix.BPF_K, 0, 0, 1),
			ins(unix.BPF_RET|unix.BPF_A, 0, 0, 0),
		}, Data{}, 0xffffffff},
		{"scratch and tax/txa", Program{
			ins(ldAbs, 0, 0, 0),
			ins(unix.BPF_ST, 0, 0, 15),
			ins(unix.BPF_MISC|unix.BPF_TAX, 0, 0, 0),
			ins(unix.BPF_STX, 0, 0, 0),
			ins(unix.BPF_LD|unix.BPF_IMM, 0, 0, 0),
			ins(unix.BPF_LDX|unix.BPF_MEM, 0, 0, 0),
			ins(unix.BPF_LD|unix.BPF_MEM, 0, 0, 15),
			ins(unix.BPF_ALU|unix.BPF_ADD|unix.BPF_K, 0, 0, 1),
			ins(unix.BPF_LDX|unix.BPF_IMM, 0, 0, 9),
			ins(unix.BPF_MISC|unix.BPF_TXA, 0, 0, 0),
			ins(unix.BPF_RET|unix.BPF_A, 0, 0, 0),
		}, Data{Nr: 5}, 9},
		{"jgt/jge/jset", Program{
			ins(ldAbs, 0, 0, 0),
			ins(unix.BPF_JMP|unix.BPF_JGT|unix.BPF_K, 0, 3, 10), // nr > 10 ?
			ins(unix.BPF_JMP|unix.BPF_JGE|unix.BPF_K, 0, 1, 20), // nr >= 20 ?
			ins(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, 1, 2, 1), // odd ?
			ins(retK, 0, 0, 1),
			ins(retK, 0, 0, 2),
			ins(retK, 0, 0, 3),
		}, Data{Nr: 21}, 2},
		{"ja", Program{ins(unix.BPF_JMP|unix.BPF_JA, 0, 0, 1), ins(retK, 0, 0, 1), ins(retK, 0, 0, 2)}, Data{}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.prog.Run(tc.d)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestDataLayout(t *testing.T) {
	require.Equal(t, uintptr(seccompDataSize), unsafe.Sizeof(Data{}))
	d := Data{Nr: -1, Arch: 2, InstructionPointer: 3, Args: [6]uint64{4, 5, 6, 7, 8, 0x900000009}}
	b := d.bytes()
	// Data has the same layout as struct seccomp_data, so its memory image
	// must equal the serialized form.
	require.Equal(t, b[:], unsafe.Slice((*byte)(unsafe.Pointer(&d)), unsafe.Sizeof(d)))
}

func TestBytes(t *testing.T) {
	for _, pol := range policies() {
		t.Run(pol.name, func(t *testing.T) {
			l, err := Build(pol.p)
			require.NoError(t, err)
			prog := l.Template
			b := prog.Bytes()
			require.Len(t, b, 8*len(prog))
			first := unix.SockFilter{
				Code: binary.NativeEndian.Uint16(b[0:]),
				Jt:   b[2],
				Jf:   b[3],
				K:    binary.NativeEndian.Uint32(b[4:]),
			}
			require.Equal(t, prog[0], first)
			require.Equal(t, unix.SockFilter{Code: ldAbs, K: offArch}, first)
			// The bytes must be exactly the memory image of []unix.SockFilter,
			// which is what the kernel reads.
			require.Equal(t, unsafe.Sizeof(unix.SockFilter{}), uintptr(8))
			require.Equal(t, unsafe.Slice((*byte)(unsafe.Pointer(&prog[0])), len(b)), b)
		})
	}
	require.Empty(t, Program(nil).Bytes())
}

func TestString(t *testing.T) {
	for _, pol := range policies() {
		t.Run(pol.name, func(t *testing.T) {
			l, err := Build(pol.p)
			require.NoError(t, err)
			s := l.Template.String() + l.Job.String()
			lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
			require.Len(t, lines, len(l.Template)+len(l.Job))
			for _, want := range []string{
				"clone3", "clone", "socket", "socketpair", "ioctl", "fcntl", "prctl", "read", "landlock_restrict_self",
				"KILL_PROCESS", "ERRNO(EPERM)", "ERRNO(ENOSYS)", "ALLOW",
				"args[0] (low)", "args[1] (high)",
			} {
				require.Contains(t, s, want)
			}
			require.Contains(t, lines[1], nativeTable.auditName)
			if nativeTable.x32 {
				require.Contains(t, s, "__X32_SYSCALL_BIT")
			}
			// Syscall names appear only where the accumulator holds nr: the
			// comparison against AF_INET (2) must not be named after syscall 2.
			for _, line := range lines {
				if strings.Contains(line, "jeq #0x2 ") {
					require.NotContains(t, line, ";", line)
				}
			}
		})
	}
}

// TestLayersSplit checks what each layer does alone: the template process
// lives under the template layer only and must be able to fork (clone) and
// open pidfds of its children, and nothing else the policy denies; the
// job layer alone is what makes a spare unable to do either.
func TestLayersSplit(t *testing.T) {
	for _, pol := range policies() {
		l, err := Build(pol.p)
		require.NoError(t, err)
		fork := call(unix.SYS_CLONE, uint64(unix.SIGCHLD))
		for _, tc := range []struct {
			name string
			prog Program
			d    Data
			want uint32
		}{
			{"template: fork", l.Template, fork, ActionAllow},
			{"template: socketpair", l.Template, call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM, 0, 0x1000), ActionAllow},
			{"template: execve", l.Template, call(unix.SYS_EXECVE, 0x1000, 0x2000, 0x3000), eperm},
			{"template: PR_SET_PDEATHSIG", l.Template, call(unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG, 9), ActionAllow},
			{"template: PR_SET_SECCOMP", l.Template, call(unix.SYS_PRCTL, unix.PR_SET_SECCOMP, 2, 0x1000), ActionAllow},
			{"template: setsid", l.Template, call(unix.SYS_SETSID), ActionAllow},
			{"template: wait4", l.Template, call(unix.SYS_WAIT4, 1234, 0x1000, 0, 0), ActionAllow},
			{"template: sendmsg", l.Template, call(unix.SYS_SENDMSG, 3, 0x1000, 0), ActionAllow},
			{"template: file_setattr", l.Template, call(469), eperm},
			{"job: PR_SET_PDEATHSIG", l.Job, call(unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG, 0), eperm},
			{"job: PR_SET_SECCOMP", l.Job, call(unix.SYS_PRCTL, unix.PR_SET_SECCOMP, 2, 0x1000), eperm},
			{"job: PR_GET_PDEATHSIG", l.Job, call(unix.SYS_PRCTL, unix.PR_GET_PDEATHSIG, 0x1000), ActionAllow},
			{"template: ptrace", l.Template, call(unix.SYS_PTRACE, 16, 1), eperm},
			{"template: clone3", l.Template, call(unix.SYS_CLONE3, 0x1000, 88), enosys},
			{"template: socket AF_UNIX", l.Template, call(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM, 0), eperm},
			{"template: socket AF_INET", l.Template, call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, 0), ActionAllow},
			{"template: foreign arch", l.Template, Data{Nr: 20, Arch: unix.AUDIT_ARCH_I386}, ActionKillProcess},
			{"job: fork", l.Job, fork, eperm},
			{"template: setns CLONE_NEWUSER", l.Template, call(unix.SYS_SETNS, 3, unix.CLONE_NEWUSER), ActionAllow},
			{"template: setns CLONE_NEWNS", l.Template, call(unix.SYS_SETNS, 3, unix.CLONE_NEWNS), ActionAllow},
			{"template: setns 0 (any type)", l.Template, call(unix.SYS_SETNS, 3, 0), eperm},
			{"template: setns CLONE_NEWNET", l.Template, call(unix.SYS_SETNS, 3, unix.CLONE_NEWNET), eperm},
			{"template: setns CLONE_NEWPID", l.Template, call(unix.SYS_SETNS, 3, unix.CLONE_NEWPID), eperm},
			{"template: setns CLONE_NEWUSER|CLONE_NEWNS", l.Template, call(unix.SYS_SETNS, 3, unix.CLONE_NEWUSER|unix.CLONE_NEWNS), eperm},
			{"job: setns CLONE_NEWNS", l.Job, call(unix.SYS_SETNS, 3, unix.CLONE_NEWNS), eperm},
			{"template: PR_CAPBSET_DROP", l.Template, call(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, 21), ActionAllow},
			{"job: PR_CAPBSET_DROP", l.Job, call(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, 21), eperm},
			{"job: read", l.Job, call(unix.SYS_READ, 0, 0x1000, 1), ActionAllow},
			{"job: foreign arch", l.Job, Data{Nr: 20, Arch: unix.AUDIT_ARCH_I386}, ActionKillProcess},
		} {
			got, err := tc.prog.Run(tc.d)
			require.NoError(t, err)
			require.Equalf(t, tc.want, got, "%s %s: want %s, got %s", pol.name, tc.name, retName(tc.want), retName(got))
		}
		for _, e := range nativeTable.jobDeny {
			d := call(e.nr)
			if e.nr == unix.SYS_SETNS {
				d = call(e.nr, 3, unix.CLONE_NEWNS)
			}
			got, err := l.Template.Run(d)
			require.NoError(t, err)
			require.Equal(t, ActionAllow, got, "template: %s", e.name)
			got, err = l.Job.Run(d)
			require.NoError(t, err)
			require.Equal(t, eperm, got, "job: %s", e.name)
		}
		inet, err := l.Job.Run(call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, 0))
		require.NoError(t, err)
		if pol.p.AllowNetwork {
			require.Equal(t, ActionAllow, inet)
		} else {
			require.Equal(t, eperm, inet)
		}
	}
}

// TestLayersPrecedence checks Layers.Run against the kernel's rule: the
// lowest action wins, compared as a signed number, and of equal actions the
// newer (job) layer's data.
func TestLayersPrecedence(t *testing.T) {
	ret := func(k uint32) Program { return Program{{Code: unix.BPF_RET | unix.BPF_K, K: k}} }
	eacces := ActionErrno | uint32(unix.EACCES)
	for _, tc := range []struct {
		tpl, job, want uint32
	}{
		{ActionAllow, ActionAllow, ActionAllow},
		{ActionAllow, eperm, eperm},
		{eperm, ActionAllow, eperm},
		{ActionKillProcess, eperm, ActionKillProcess},
		{eperm, ActionKillProcess, ActionKillProcess},
		{eacces, eperm, eperm}, // equal actions: the job layer's errno
		{eperm, eacces, eacces},
	} {
		got, err := Layers{Template: ret(tc.tpl), Job: ret(tc.job)}.Run(call(unix.SYS_READ))
		require.NoError(t, err)
		require.Equal(t, tc.want, got, "template %s, job %s", retName(tc.tpl), retName(tc.job))
	}
}
