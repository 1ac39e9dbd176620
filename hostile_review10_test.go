package pynox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// A tenth outside review: what a job can reach beyond the paths,
// system calls and descriptors the earlier reviews probed. Real python3
// under the real sandbox; each probe asserts the safe outcome and that
// the pool serves the next job.

// crashPrelude reports the process's dumpable flag and whether it can
// set it back, then names the process comm (the name the kernel prints
// when it hands a crash to the host's core handler).
const crashPrelude = `import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.restype = ctypes.c_int
print("dumpable", libc.prctl(3, 0, 0, 0, 0))
r = libc.prctl(4, 1, 0, 0, 0)
print("set_dumpable", "ok" if r == 0 else os.strerror(ctypes.get_errno()))
print("dumpable_after", libc.prctl(3, 0, 0, 0, 0), flush=True)
libc.prctl(15, sys.argv[1].encode(), 0, 0, 0)
`

// uniqueComm returns a process name no other process on the machine is
// likely to have (at most 15 bytes, the kernel's TASK_COMM_LEN).
func uniqueComm(t *testing.T) string {
	var b [5]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return "rt10" + hex.EncodeToString(b[:])
}

// kmsgMentions reports whether the kernel log names comm in a core
// dump line, or "" when the log cannot be read.
func kmsgMentions(t *testing.T, comm string) (bool, string) {
	out, err := exec.Command("dmesg").CombinedOutput()
	if err != nil {
		return false, "dmesg: " + err.Error()
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "("+comm+")") && strings.Contains(strings.ToLower(l), "core") {
			return true, l
		}
	}
	return false, ""
}

// Probe 1: a crashing job (SIGABRT, SIGSEGV, seccomp's SIGSYS on a
// foreign-architecture system call) never reaches the host's core
// handler. RLIMIT_CORE=0 stops core files only: with a core_pattern that
// pipes to a program (systemd-coredump, apport; "|/x" on the machine this
// was found on) the kernel ignores RLIMIT_CORE and runs that program as
// root in the initial namespaces, outside every sandbox, with the crashed
// job's memory on its stdin, once per crash. Before, every job was
// dumpable (PR_GET_DUMPABLE 1) and each crash logged "coredump:
// N(<comm>): |/x pipe failed". Now the template makes itself, and so
// every spare, job and session, non-dumpable, and seccomp denies
// PR_SET_DUMPABLE, so a job cannot undo it.
func TestHostileReview10NoCoreDumps(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	pattern, _ := os.ReadFile("/proc/sys/kernel/core_pattern")
	piped := strings.HasPrefix(string(pattern), "|") || strings.HasPrefix(string(pattern), "@")
	crashes := map[string]string{
		"abort":  "os.abort()",
		"segv":   "ctypes.string_at(0)",
		"sigsys": "import signal\nsignal.signal(signal.SIGSYS, signal.SIG_DFL)\nos.kill(os.getpid(), signal.SIGSYS)",
	}
	for name, crash := range crashes {
		t.Run(name, func(t *testing.T) {
			comm := uniqueComm(t)
			res := run(t, p, Job{Code: crashPrelude + crash + "\nprint('survived')", Args: []string{comm}})
			require.Contains(t, res.Stdout, "dumpable 0\n")
			require.Contains(t, res.Stdout, "set_dumpable Operation not permitted\n")
			require.Contains(t, res.Stdout, "dumpable_after 0\n")
			require.NotContains(t, res.Stdout, "survived")
			requireErrorType(t, res, "SignalError")
			if piped {
				found, line := kmsgMentions(t, comm)
				require.False(t, found, "the crash reached the host's core handler (%q): %s", strings.TrimSpace(string(pattern)), line)
			}
		})
	}
	// A session's process, forked the same way.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(context.Background())
	comm := uniqueComm(t)
	ev, err := co.Feed(ctx, Step{Code: "import sys\nsys.argv = ['x', " + "'" + comm + "']\n" + crashPrelude + "os.abort()"})
	require.NoError(t, err)
	require.NotNil(t, ev.Result)
	require.Contains(t, ev.Result.Stdout, "dumpable 0\n")
	requireErrorType(t, ev.Result, "SignalError")
	if piped {
		found, line := kmsgMentions(t, comm)
		require.False(t, found, "a session's crash reached the host's core handler: %s", line)
	}
	advServes(t, p)
}

// Probe 1b: a job in a mount namespace (a user namespace entered with
// setns, which changes credentials) is not dumpable either.
func TestHostileReview10NoCoreDumpsInNamespace(t *testing.T) {
	testenv.Slow(t)
	p, data, _ := nsPool(t)
	comm := uniqueComm(t)
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Args: []string{comm},
		Code: crashPrelude + "os.abort()"})
	require.Contains(t, res.Stdout, "dumpable 0\n")
	require.Contains(t, res.Stdout, "dumpable_after 0\n")
	requireErrorType(t, res, "SignalError")
	advServes(t, p)
}

// Probe 2: out-of-band data. A job may make an AF_UNIX stream
// socketpair and holds its control socket, both unix stream sockets,
// whose MSG_OOB code is kernel surface no job needs and through which a
// use-after-free was reached from Chrome's renderer sandbox
// (CVE-2025-38236). Before, send and recv with MSG_OOB worked on the
// pair and on descriptor 3. Now every send and receive call with
// MSG_OOB fails with EPERM (seccomp's template layer), with or without
// the network, while ordinary sends and receives work.
func TestHostileReview10NoOutOfBandData(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 1, Limits: Limits{AllowNetwork: true}})
	body := `
import socket, array
a, b = socket.socketpair()
attempt("pair_send", lambda: a.send(b"x"))
attempt("pair_recv", lambda: b.recv(1))
attempt("pair_send_oob", lambda: a.send(b"y", socket.MSG_OOB))
sc("pair_sendto_oob", SYS_SENDTO, a.fileno(), b"y", 1, socket.MSG_OOB, 0, 0)
attempt("pair_sendmsg_oob", lambda: a.sendmsg([b"y"], [], socket.MSG_OOB))
attempt("pair_recv_oob", lambda: b.recv(1, socket.MSG_OOB | socket.MSG_DONTWAIT))
attempt("pair_recvmsg_oob", lambda: b.recvmsg(1, 0, socket.MSG_OOB | socket.MSG_DONTWAIT))
ctl = socket.socket(fileno=3)
attempt("ctl_send_oob", lambda: ctl.send(b"\x00", socket.MSG_OOB))
ctl.detach()
`
	for _, network := range []bool{false, true} {
		code := strings.ReplaceAll(advCode(body), "SYS_SENDTO", strconv.Itoa(unix.SYS_SENDTO))
		res := run(t, p, Job{AllowNetwork: network, Code: code})
		requireOK(t, res)
		got := advProbes(t, res)
		ok, eperm := []string{"ok"}, []string{"EPERM"}
		advExpect(t, got, map[string][]string{
			"pair_send": ok, "pair_recv": ok,
			"pair_send_oob": eperm, "pair_sendto_oob": eperm, "pair_sendmsg_oob": eperm,
			"pair_recv_oob": eperm, "pair_recvmsg_oob": eperm, "ctl_send_oob": eperm,
		})
	}
	advServes(t, p)
}

// Probe 3: descriptors in flight. Descriptors sent with SCM_RIGHTS and
// not yet received are counted per uid across the whole machine, and a
// process without CAP_SYS_RESOURCE may pass more only while that count
// is within its own descriptor limit: a session holding ~4,000 in flight
// on its own socketpair (review 7) made every other process of the pool's
// uid with a lower limit fail to pass descriptors, and each such message
// feeds the unix sockets' garbage collector, a long source of kernel
// bugs (CVE-2021-0920 was exploited in the wild). Before, a job without
// the network could do it: its sendmsg worked. Now sendmsg and sendmmsg,
// the only calls that carry descriptors, need the network like connect
// and bind (seccomp's job layer); plain sends on the pair still work.
// With the network the limit of SECURITY.md stays.
func TestHostileReview10NoDescriptorsInFlight(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 1, Limits: Limits{AllowNetwork: true}})
	body := `
import array, socket
a, b = socket.socketpair()
attempt("send", lambda: a.send(b"x"))
attempt("recv", lambda: b.recv(1))
attempt("sendmsg_plain", lambda: a.sendmsg([b"y"]))
attempt("sendmsg_rights", lambda: a.sendmsg([b"z"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0] * 253))]))
attempt("sendmmsg", lambda: sc("sendmmsg_raw", SYS_SENDMMSG, a.fileno(), 0, 0, 0))
ctl = socket.socket(fileno=3)
attempt("ctl_sendmsg_rights", lambda: ctl.sendmsg([b""], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))]))
ctl.detach()
`
	code := strings.ReplaceAll(advCode(body), "SYS_SENDMMSG", strconv.Itoa(unix.SYS_SENDMMSG))
	res := run(t, p, Job{Code: code})
	requireOK(t, res)
	ok, eperm := []string{"ok"}, []string{"EPERM"}
	advExpect(t, advProbes(t, res), map[string][]string{
		"send": ok, "recv": ok, "sendmsg_plain": eperm, "sendmsg_rights": eperm,
		"sendmmsg": ok, "sendmmsg_raw": eperm, "ctl_sendmsg_rights": eperm,
	})

	// A session, stopped between steps, holds nothing in flight either.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(context.Background())
	ev, err := co.Feed(ctx, Step{Code: `
import array, socket
a, b = socket.socketpair()
n = 0
try:
    for i in range(20):
        a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0] * 253))])
        n += 253
except PermissionError:
    pass
print("in flight", n)
`})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "in flight 0\n", ev.Result.Stdout)

	// A job granted the network may still use sendmsg (UDP resolvers do).
	res = run(t, p, Job{AllowNetwork: true, Code: code})
	requireOK(t, res)
	got := advProbes(t, res)
	require.Equal(t, "ok", got["sendmsg_plain"])
	require.Equal(t, "ok", got["sendmsg_rights"])
	advServes(t, p)
}

// Probe 4: set-user-ID files. The job runs as the pool's uid (root, on
// CI and many servers) without CAP_FSETID, and may not chmod; but open's
// own mode was not filtered, and os.open("x", O_CREAT, 0o4755) in a write
// grant made an empty set-user-ID root file on the host. The kernel
// clears the bit at the job's first write or truncation, not at a write
// by a process holding CAP_FSETID: a root program on the host writing
// over that name (shutil.copyfile truncates and keeps the mode) leaves a
// set-user-ID root program behind, which every local user who reaches
// the directory may run. Now open, creat and openat with S_ISUID or
// S_ISGID in their mode fail with EPERM, and openat2 (whose mode seccomp
// cannot read) with ENOSYS, as before Linux 5.6.
func TestHostileReview10NoSetIDFiles(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 1})
	dir := p.Config().Dir
	code := strings.ReplaceAll(advCode(`
attempt("create_0644", lambda: os.close(os.open("plain", os.O_CREAT | os.O_WRONLY, 0o644)))
attempt("create_01755", lambda: os.close(os.open("sticky", os.O_CREAT | os.O_WRONLY, 0o1755)))
attempt("create_04755", lambda: os.close(os.open("suid", os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt("create_02755", lambda: os.close(os.open("sgid", os.O_CREAT | os.O_WRONLY, 0o2755)))
attempt("create_06777", lambda: os.close(os.open("both", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o6777)))
attempt("tmpfile_04755", lambda: os.close(os.open(".", os.O_TMPFILE | os.O_RDWR, 0o4755)))
sc("openat2", SYS_OPENAT2, -100, b"plain", 0, 0)
attempt("builtin_open", lambda: open("text", "w").write("ok"))
attempt("mkdir_06755", lambda: os.mkdir("d", 0o6755))
`), "SYS_OPENAT2", strconv.Itoa(unix.SYS_OPENAT2))
	res := run(t, p, Job{AllowWrite: []string{"."}, Code: code})
	requireOK(t, res)
	ok, eperm := []string{"ok"}, []string{"EPERM"}
	advExpect(t, advProbes(t, res), map[string][]string{
		"create_0644": ok, "create_01755": ok, "builtin_open": ok, "mkdir_06755": ok,
		"create_04755": eperm, "create_02755": eperm, "create_06777": eperm, "tmpfile_04755": eperm,
		"openat2": {"ENOSYS"},
	})
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		fi, err := os.Lstat(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		require.Zero(t, fi.Mode()&(os.ModeSetuid|os.ModeSetgid), "%s is %v on the host", e.Name(), fi.Mode())
	}
	for _, name := range []string{"suid", "sgid", "both"} {
		_, err := os.Lstat(filepath.Join(dir, name))
		require.ErrorIs(t, err, os.ErrNotExist, name)
	}
	advServes(t, p)
}

// Probe 5 (held): what a job reaches that the earlier reviews did not
// try. It can get a pidfd of the process at the other end of its control
// socket (SO_PEERPIDFD; SO_PASSPIDFD would bring the pool's with each
// frame), but nothing takes one: signalling, waiting, entering its
// namespaces, its ioctls (PIDFD_GET_INFO) and taking its descriptors all
// fail. A hard link to a set-user-ID program of the runtime (/usr/bin/su)
// fails with EXDEV (Landlock's refer right); alarm timers (CAP_WAKE_ALARM),
// poisoning pages (MADV_HWPOISON), moving other processes' pages
// (MPOL_MF_MOVE_ALL), SCHED_DEADLINE and raising the hard descriptor or
// core limits fail.
func TestHostileReview10HeldKernelSurface(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	nr := map[string]int{
		"SYS_PIDFD_SEND_SIGNAL": unix.SYS_PIDFD_SEND_SIGNAL, "SYS_WAITID": unix.SYS_WAITID,
		"SYS_SETNS": unix.SYS_SETNS, "SYS_IOCTL": unix.SYS_IOCTL, "SYS_PIDFD_GETFD": unix.SYS_PIDFD_GETFD,
		"SYS_TIMERFD_CREATE": unix.SYS_TIMERFD_CREATE, "SYS_MADVISE": unix.SYS_MADVISE,
		"SYS_MBIND": unix.SYS_MBIND, "SYS_SCHED_SETATTR": unix.SYS_SCHED_SETATTR,
	}
	code := advCode(`
import mmap, resource, socket, struct
ctl = socket.socket(fileno=3)
pidfd = -1
def peer():
    global pidfd
    pidfd = struct.unpack("i", ctl.getsockopt(socket.SOL_SOCKET, 77, 4))[0]
attempt("peer_pidfd", peer)
ctl.detach()
if pidfd >= 0:
    sc("pidfd_send_signal", SYS_PIDFD_SEND_SIGNAL, pidfd, 0, 0, 0)
    sc("waitid_pidfd", SYS_WAITID, 3, pidfd, ctypes.create_string_buffer(128), 4 | 1, 0)
    sc("setns_pidfd", SYS_SETNS, pidfd, 0)
    sc("pidfd_get_info", SYS_IOCTL, pidfd, 0xc050ff0b, ctypes.create_string_buffer(128))
    sc("pidfd_getfd", SYS_PIDFD_GETFD, pidfd, 0, 0)
attempt("link_su", lambda: os.link("/usr/bin/su", "su"))
sc("timerfd_alarm", SYS_TIMERFD_CREATE, 8, 0)
m = mmap.mmap(-1, 4096)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
sc("madv_hwpoison", SYS_MADVISE, addr, 4096, 100)
sc("mbind_move_all", SYS_MBIND, addr, 4096, 0, 0, 0, 4)
attr = struct.pack("IIQiIQQQ", 48, 6, 0, 0, 0, 10**6, 10**7, 10**7)
sc("sched_deadline", SYS_SCHED_SETATTR, 0, ctypes.create_string_buffer(attr), 0)
attempt("raise_nofile", lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1 << 20, 1 << 20)))
attempt("raise_core", lambda: resource.setrlimit(resource.RLIMIT_CORE, (1 << 20, 1 << 20)))
`)
	for k, v := range nr {
		code = strings.ReplaceAll(code, k, strconv.Itoa(v))
	}
	res := run(t, p, Job{AllowWrite: []string{"."}, Code: code})
	requireOK(t, res)
	eperm := []string{"EPERM"}
	advExpect(t, advProbes(t, res), map[string][]string{
		"peer_pidfd":        {"ok", "ENOPROTOOPT"}, // SO_PEERPIDFD is Linux 6.5
		"pidfd_send_signal": eperm, "waitid_pidfd": {"ECHILD"}, "setns_pidfd": eperm,
		"pidfd_get_info": eperm, "pidfd_getfd": eperm,
		"link_su":        {"EXDEV", "ENOENT"},
		"timerfd_alarm":  eperm,
		"madv_hwpoison":  {"EPERM", "EINVAL"}, // EINVAL without CONFIG_MEMORY_FAILURE
		"mbind_move_all": eperm,
		"sched_deadline": eperm,
		"raise_nofile":   {"ValueError", "EPERM"},
		"raise_core":     {"ValueError", "EPERM"},
	})
	advServes(t, p)
}

// auditEnabled asks the kernel's audit subsystem (AUDIT_GET over
// netlink) whether it is enabled; ok is false when it cannot tell.
func auditEnabled() (enabled, ok bool) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_AUDIT)
	if err != nil {
		return false, false
	}
	defer unix.Close(fd)
	const auditGet = 1000
	req := make([]byte, unix.NLMSG_HDRLEN)
	*(*uint32)(unsafe.Pointer(&req[0])) = unix.NLMSG_HDRLEN
	*(*uint16)(unsafe.Pointer(&req[4])) = auditGet
	*(*uint16)(unsafe.Pointer(&req[6])) = unix.NLM_F_REQUEST
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, false
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil || n < unix.NLMSG_HDRLEN {
			return false, false
		}
		typ := *(*uint16)(unsafe.Pointer(&buf[4]))
		if typ == unix.NLMSG_ERROR {
			if n >= unix.NLMSG_HDRLEN+4 && *(*int32)(unsafe.Pointer(&buf[unix.NLMSG_HDRLEN])) != 0 {
				return false, false
			}
			continue // an acknowledgement
		}
		if typ == auditGet && n >= unix.NLMSG_HDRLEN+8 {
			// struct audit_status: mask, then enabled.
			return *(*uint32)(unsafe.Pointer(&buf[unix.NLMSG_HDRLEN+4])) != 0, true
		}
	}
}

// Probe 6: the host's audit log. Since Landlock audits denials (ABI 7,
// Linux 6.15), a domain logs the accesses it denies to the process that
// made it ("same exec"), by default, wherever audit is enabled (auditd
// runs on many servers): every PermissionError of a job was an audit
// record of the host, as many as the job liked, enough to overflow the
// audit backlog and lose the host's own records (or, under `auditctl
// -f 2`, panic the kernel). A job's domain is now made with
// LANDLOCK_RESTRICT_SELF_LOG_SAME_EXEC_OFF and _LOG_SUBDOMAINS_OFF.
// Jobs run with the flags (they would fail closed if the kernel refused
// them); the kernel log (where records go when no audit daemon takes
// them) is read only where audit is enabled: not on the machine this was
// written on, so the records themselves were not seen there.
func TestHostileReview10NoAuditRecords(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	comm := uniqueComm(t)
	res := run(t, p, Job{Args: []string{comm}, Code: `
import ctypes, sys
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
n = 0
for i in range(200):
    try:
        open("/etc/shadow")
    except PermissionError:
        n += 1
print(n)
`})
	requireOK(t, res)
	require.Equal(t, "200\n", res.Stdout)
	advServes(t, p)
	enabled, ok := auditEnabled()
	if !ok || !enabled {
		t.Skipf("audit is not enabled here (known: %v): no Landlock record can show; the jobs ran with the log flags", ok)
	}
	out, err := exec.Command("dmesg").CombinedOutput()
	require.NoError(t, err)
	for _, l := range strings.Split(string(out), "\n") {
		require.False(t, strings.Contains(l, "type=1423") && strings.Contains(l, comm), "a job's denial was audited: %s", l)
	}
}

// Probe 7: a session's scratch directory across its processes. What a
// process writes to its scratch (a tmpfs by default) is charged to its
// own memory cgroup, which goes with the process. A session's checkout
// outlives its process: the next step after an exit, a crash, a timeout
// or a failed dump runs in a replacement (Result.Restarted; the MCP
// server and the library's callers go on this way), and an idle session
// kept in a file (session_idle_dump) gets a new process at its next
// step. The scratch directory went on to the next process with its
// files, charged to no live limit: a session under "memory": "64m" that
// wrote 60 MiB and exited, four times, held 240 MiB of host memory, and
// would have gone on for ever. Now the next process starts with an empty
// scratch directory (its outputs directory made again), as with empty
// variables; within one process a session keeps its files across steps.
func TestHostileReview10SessionScratchAcrossProcesses(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	fill := `
import os
d = os.environ["TMPDIR"]
block = b"x" * (1 << 20)
with open(os.path.join(d, "f%d" % len(os.listdir(d))), "wb") as f:
    for i in range(40):
        f.write(block)
print(sorted(os.listdir(d)), os.path.isdir(os.environ["PYNOX_OUTPUTS"]))
`
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	feed := func(co *Checkout, code string) *Result {
		t.Helper()
		ev, err := co.Feed(ctx, Step{Code: code})
		require.NoError(t, err)
		require.NotNil(t, ev.Result)
		return ev.Result
	}
	t.Run("exit and failed dump", func(t *testing.T) {
		p := newTestPool(t, Config{Workers: 1})
		co, err := p.Checkout(ctx, Job{Memory: 64 << 20})
		require.NoError(t, err)
		defer co.Finish(context.Background())
		res := feed(co, fill)
		requireOK(t, res)
		require.Equal(t, "['f1', 'outputs'] True\n", res.Stdout)
		res = feed(co, fill) // the same process keeps its files
		requireOK(t, res)
		require.Equal(t, "['f1', 'f2', 'outputs'] True\n", res.Stdout)
		res = feed(co, "import os\nos._exit(0)")
		require.True(t, res.SessionEnded)
		for i := 0; i < 3; i++ {
			res = feed(co, fill+"\nclass Boom:\n    def __reduce__(self):\n        os._exit(3)\nboom = Boom()\n")
			requireOK(t, res)
			require.True(t, res.Restarted)
			require.Equal(t, "['f1', 'outputs'] True\n", res.Stdout, "the ended process's files reached its replacement")
			_, err := co.Dump(ctx)
			require.Error(t, err) // __reduce__ ends the process
		}
	})
	t.Run("idle session kept in a file", func(t *testing.T) {
		dumps := t.TempDir()
		p := newTestPool(t, Config{Workers: 1, SessionIdle: 300 * time.Millisecond, SessionIdleDump: dumps})
		co, err := p.Checkout(ctx, Job{Memory: 64 << 20})
		require.NoError(t, err)
		defer co.Finish(context.Background())
		for i := 0; i < 3; i++ {
			res := feed(co, fill+"\nkept = True\n")
			requireOK(t, res)
			require.Equal(t, "['f1', 'outputs'] True\n", res.Stdout, "round %d: an earlier process's files reached the restored one", i)
			require.Equal(t, i > 0, res.Restored)
			require.Eventually(t, func() bool {
				kept, _ := filepath.Glob(filepath.Join(dumps, "*.dump"))
				return len(kept) == 1
			}, 30*time.Second, 20*time.Millisecond, "the session was not kept in the idle-dump directory")
		}
		res := feed(co, "print(kept)")
		requireOK(t, res)
		require.Equal(t, "True\n", res.Stdout)
	})
}
