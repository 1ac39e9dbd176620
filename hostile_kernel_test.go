package pynox

// Adversarial suite (helpers in hostile_test.go): the kernel surface,
// system calls and interfaces the sandbox shuts.

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHostileKernelSurface(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	dir := p.cfg.Dir
	require.NoError(t, os.Mkdir(filepath.Join(dir, "out"), 0o755))
	node := filepath.Join(dir, "out", "node")
	code := advCode(`import resource, struct, signal
ppid = os.getppid()
AT_FDCWD = -100
buf = ctypes.create_string_buffer(4096)

# Other processes: the template is the parent.
sc("ptrace attach parent", 101, 16, ppid, 0, 0)
sc("ptrace seize parent", 101, 0x4206, ppid, 0, 0)
sc("ptrace traceme", 101, 0, 0, 0, 0)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local = iovec(ctypes.addressof(buf), 16)
remote = iovec(id(None), 16)  # the same address in the parent: fork keeps the layout
sc("process_vm_readv parent", 310, ppid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
empty = iovec(ctypes.addressof(buf), 0)
sc("process_vm_writev parent", 311, ppid, ctypes.byref(empty), 1, ctypes.byref(empty), 1, 0)
sc("pidfd_open parent", 434, ppid, 0)
sc("pidfd_getfd", 438, 0, 0, 0)
sc("pidfd_send_signal", 424, 0, 0, 0, 0)
sc("kcmp", 312, os.getpid(), ppid, 0, 0, 0)
sc("process_madvise", 440, 0, ctypes.byref(local), 1, 0, 0)
sc("process_mrelease", 448, 0, 0)
sc("migrate_pages parent", 256, ppid, 64, buf, buf)
sc("move_pages parent", 279, ppid, 0, 0, 0, 0, 0)
old = (ctypes.c_ulong * 2)()
sc("prlimit64 parent get", 302, ppid, 9, 0, ctypes.byref(old))
sc("prlimit64 parent pid with high bits", 302, (1 << 32) | ppid, 9, 0, ctypes.byref(old))
sc("prlimit64 own pid by number", 302, os.getpid(), 9, 0, ctypes.byref(old))
sc("control prlimit64 self get", 302, 0, 9, 0, ctypes.byref(old))
inf = (ctypes.c_ulong * 2)(2**64 - 1, 2**64 - 1)
sc("prlimit64 self raise RLIMIT_AS", 302, 0, 9, ctypes.byref(inf), 0)

# Kernel attack surface.
sc("bpf prog load", 321, 5, buf, 128)
sc("bpf map create", 321, 0, buf, 72)
pattr = ctypes.create_string_buffer(128)
struct.pack_into("<II", pattr, 0, 1, 128)  # PERF_TYPE_SOFTWARE, size
sc("perf_event_open", 298, pattr, 0, -1, -1, 0)
sc("userfaultfd", 323, 0)
sc("io_uring_setup", 425, 4, ctypes.create_string_buffer(120))
sc("io_uring_enter", 426, 0, 0, 0, 0, 0, 0)
sc("io_uring_register", 427, 0, 0, 0, 0)
sc("keyctl get session keyring", 250, 0, -3, 1)
sc("add_key", 248, b"user", b"pynox", b"secret", 6, -2)
sc("request_key", 249, b"user", b"pynox", 0, 0)
sc("memfd_secret", 447, 0)
sc("fanotify_init", 300, 0, 0)

# Namespaces, mounts, root.
sc("unshare CLONE_NEWUSER", 272, 0x10000000)
sc("unshare CLONE_NEWNET", 272, 0x40000000)
sc("unshare CLONE_NEWNS", 272, 0x00020000)
sc("setns", 308, 0, 0)
sc("mount tmpfs", 165, b"none", b"/tmp", b"tmpfs", 0, 0)
sc("umount2", 166, b"/tmp", 2)
sc("fsopen", 430, b"tmpfs", 0)
sc("fspick", 433, AT_FDCWD, b"/", 0)
sc("open_tree", 428, AT_FDCWD, b"/", 1)
sc("move_mount", 429, AT_FDCWD, b"/", AT_FDCWD, b"/tmp", 0)
sc("mount_setattr", 442, AT_FDCWD, b"/", 0, buf, 32)
sc("chroot", 161, b"/")
sc("pivot_root", 155, b"/", b"/")
handle = ctypes.create_string_buffer(136)
struct.pack_into("<Ii", handle, 0, 128, 0)
mnt = ctypes.c_int(0)
sc("name_to_handle_at", 303, AT_FDCWD, b"/etc/shadow", handle, ctypes.byref(mnt), 0)
sc("open_by_handle_at", 304, AT_FDCWD, handle, 0)

# Kernel, modules, logs, clocks, hardware.
sc("init_module", 175, buf, 16, b"")
sc("finit_module", 313, 0, b"", 0)
sc("delete_module", 176, b"pynox", 0)
sc("kexec_load", 246, 0, 0, 0, 0)
sc("kexec_file_load", 320, -1, -1, 0, b"", 0)
sc("syslog read all", 103, 3, buf, 4096)
sc("syslog size", 103, 10, 0, 0)
sc("reboot cad off", 169, 0xfee1dead, 0x28121969, 0, 0)
sc("swapon", 167, b"/nonexistent", 0)
sc("acct", 163, 0)
ts = (ctypes.c_long * 2)()
_libc.clock_gettime(0, ts)
sc("clock_settime", 227, 0, ts)
sc("settimeofday", 164, 0, 0)
sc("adjtimex read", 159, ctypes.create_string_buffer(208))
sc("clock_adjtime read", 305, 0, ctypes.create_string_buffer(208))
sc("iopl", 172, 3)
sc("ioperm", 173, 0x80, 1, 1)
sc("modify_ldt read", 154, 0, buf, 16)
sc("sethostname", 170, b"pynox", 5)
sc("vhangup", 153)
sc("uselib", 134, b"/nonexistent")
sc("mknod fifo in write grant", 133, b"out/node", 0o010600, 0)
sc("mknodat char device in write grant", 259, AT_FDCWD, b"out/node", 0o020600, 0x0103)

# personality: only the query is allowed.
sc("personality 0x0008", 135, 0x0008)
sc("personality READ_IMPLIES_EXEC", 135, 0x0400000)
sc("personality ADDR_NO_RANDOMIZE", 135, 0x0040000)
sc("control personality query", 135, 0xffffffff)

# Terminal injection.
ch = ctypes.c_char(b"x")
sc("ioctl TIOCSTI fd 0", 16, 0, 0x5412, ctypes.byref(ch))
sc("ioctl TIOCSTI high bits", 16, 0, 0x5412 | (1 << 32), ctypes.byref(ch))
sc("ioctl TIOCSTI fd 2", 16, 2, 0x5412, ctypes.byref(ch))
sc("ioctl TIOCLINUX", 16, 0, 0x541C, buf)
sc("ioctl TIOCLINUX high bits", 16, 0, 0x541C | (7 << 40), buf)
try:
    tty = os.open("/dev/tty", os.O_RDWR)
    R["open /dev/tty"] = "ok"
    sc("ioctl TIOCSTI /dev/tty", 16, tty, 0x5412, ctypes.byref(ch))
except OSError as e:
    R["open /dev/tty"] = _name(e.errno)
attempt("open /dev/console", lambda: os.open("/dev/console", os.O_RDWR))
attempt("open /dev/ptmx", lambda: os.open("/dev/ptmx", os.O_RDWR))

# Credentials and limits.
class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
hdr = CapHeader(0x20080522, 0)
caps = (CapData * 2)(CapData(0xffffffff, 0xffffffff, 0xffffffff), CapData(0xffffffff, 0xffffffff, 0xffffffff))
sc("capset all", 126, ctypes.byref(hdr), ctypes.byref(caps))
got = (CapData * 2)()
sc("control capget", 125, ctypes.byref(CapHeader(0x20080522, 0)), ctypes.byref(got))
R["capabilities held"] = "none" if not any(d.effective or d.permitted or d.inheritable for d in got) else "SOME"
sc("setuid 0", 105, 0)
sc("setresuid", 117, 0, 0, 0)
sc("setgroups", 116, 0, 0)
sc("prctl set no_new_privs 0", 157, 38, 0, 0, 0, 0)
R["no_new_privs"] = str(_libc.prctl(39, 0, 0, 0, 0))
before = {n: resource.getrlimit(getattr(resource, n)) for n in ("RLIMIT_AS", "RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CPU", "RLIMIT_CORE")}
for n, (soft, hard) in before.items():
    new = resource.RLIM_INFINITY if hard != resource.RLIM_INFINITY else hard
    if hard == resource.RLIM_INFINITY:
        R["raise " + n + " hard limit"] = "unlimited already"
        continue
    attempt("raise " + n + " hard limit", lambda n=n: resource.setrlimit(getattr(resource, n), (new, new)))
after = {n: resource.getrlimit(getattr(resource, n)) for n in before}
R["rlimits unchanged"] = "yes" if after == before else "NO: %r -> %r" % (before, after)
`)
	r := run(t, p, Job{Code: code, AllowWrite: []string{"out"}})
	requireOK(t, r)
	eperm := []string{"EPERM"}
	advExpect(t, advProbes(t, r), map[string][]string{
		"ptrace attach parent":                eperm,
		"ptrace seize parent":                 eperm,
		"ptrace traceme":                      eperm,
		"process_vm_readv parent":             eperm,
		"process_vm_writev parent":            eperm,
		"pidfd_open parent":                   eperm,
		"pidfd_getfd":                         eperm,
		"pidfd_send_signal":                   eperm,
		"kcmp":                                eperm,
		"process_madvise":                     eperm,
		"process_mrelease":                    eperm,
		"migrate_pages parent":                eperm,
		"move_pages parent":                   eperm,
		"prlimit64 parent get":                eperm,
		"prlimit64 parent pid with high bits": eperm,
		"prlimit64 own pid by number":         eperm,
		"control prlimit64 self get":          {"ok"},
		"prlimit64 self raise RLIMIT_AS":      eperm,
		"bpf prog load":                       eperm,
		"bpf map create":                      eperm,
		"perf_event_open":                     eperm,
		"userfaultfd":                         eperm,
		"io_uring_setup":                      eperm,
		"io_uring_enter":                      eperm,
		"io_uring_register":                   eperm,
		"keyctl get session keyring":          eperm,
		"add_key":                             eperm,
		"request_key":                         eperm,
		"memfd_secret":                        eperm,
		"fanotify_init":                       eperm,
		"unshare CLONE_NEWUSER":               eperm,
		"unshare CLONE_NEWNET":                eperm,
		"unshare CLONE_NEWNS":                 eperm,
		"setns":                               eperm,
		"mount tmpfs":                         eperm,
		"umount2":                             eperm,
		"fsopen":                              eperm,
		"fspick":                              eperm,
		"open_tree":                           eperm,
		"move_mount":                          eperm,
		"mount_setattr":                       eperm,
		"chroot":                              eperm,
		"pivot_root":                          eperm,
		"name_to_handle_at":                   eperm,
		"open_by_handle_at":                   eperm,
		"init_module":                         eperm,
		"finit_module":                        eperm,
		"delete_module":                       eperm,
		"kexec_load":                          eperm,
		"kexec_file_load":                     eperm,
		"syslog read all":                     eperm,
		"syslog size":                         eperm,
		"reboot cad off":                      eperm,
		"swapon":                              eperm,
		"acct":                                eperm,
		"clock_settime":                       eperm,
		"settimeofday":                        eperm,
		"adjtimex read":                       eperm,
		"clock_adjtime read":                  eperm,
		"iopl":                                eperm,
		"ioperm":                              eperm,
		"modify_ldt read":                     eperm,
		"sethostname":                         eperm,
		"vhangup":                             eperm,
		"uselib":                              eperm,
		"mknod fifo in write grant":           eperm,
		"mknodat char device in write grant":  eperm,
		"personality 0x0008":                  eperm,
		"personality READ_IMPLIES_EXEC":       eperm,
		"personality ADDR_NO_RANDOMIZE":       eperm,
		"control personality query":           {"ok"},
		"ioctl TIOCSTI fd 0":                  eperm,
		"ioctl TIOCSTI high bits":             eperm,
		"ioctl TIOCSTI fd 2":                  eperm,
		"ioctl TIOCLINUX":                     eperm,
		"ioctl TIOCLINUX high bits":           eperm,
		// The job has no controlling terminal and /dev/tty is not granted.
		"open /dev/tty":                  {"EACCES", "ENXIO"},
		"open /dev/console":              {"EACCES"},
		"open /dev/ptmx":                 {"EACCES"},
		"capset all":                     eperm,
		"control capget":                 {"ok"},
		"capabilities held":              {"none"},
		"setuid 0":                       eperm,
		"setresuid":                      eperm,
		"setgroups":                      eperm,
		"prctl set no_new_privs 0":       {"EINVAL", "EPERM"},
		"no_new_privs":                   {"1"},
		"raise RLIMIT_AS hard limit":     {"ValueError"}, // Python's word for EPERM from setrlimit
		"raise RLIMIT_NOFILE hard limit": {"ValueError"},
		"raise RLIMIT_FSIZE hard limit":  {"ValueError"},
		"raise RLIMIT_CPU hard limit":    {"ValueError"},
		"raise RLIMIT_CORE hard limit":   {"ValueError"},
		"rlimits unchanged":              {"yes"},
	})
	require.NoFileExists(t, node)
	advServes(t, p)
}
