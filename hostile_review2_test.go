package pynox

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A job's exception whose class or attributes run code when the runner
// reports it (a metaclass's __name__ property, a SystemExit whose code is
// a property or an int subclass with its own __and__, an exception whose
// __notes__ raises while the spare prints it, a __class__ property) is
// still reported as the job's own error: the runner neither dies with
// exit 70 and no error, nor returns from the forked spare into the
// template's loop (seen as "in loop" in the job's stderr and a SIGINT
// verdict). A str subclass name that hashes unlike "TimeoutError" is
// still qualified.
func TestHostileReview2EvilExceptions(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	for _, tc := range []struct {
		code     string
		exit     int
		typ      string // "" for no error
		exitOnly bool
	}{
		{"class M(type):\n    @property\n    def __name__(cls):\n        raise KeyboardInterrupt\nclass E(Exception, metaclass=M): pass\nraise E('x')", 1, "E", false},
		{"class M(type):\n    @property\n    def __name__(cls):\n        return 'TimeoutError'\nclass E(Exception, metaclass=M): pass\nraise E('x')", 1, "E", false},
		{"class S(str):\n    def __hash__(self): return 1\n    def __eq__(self, o): return False\nclass E(Exception): pass\nE.__name__ = S('TimeoutError')\nraise E('x')", 1, "__main__.E", false},
		{"class S(str):\n    def __add__(self, o): return 'TimeoutError'\nclass TimeoutError(Exception): pass\nTimeoutError.__module__ = S('m')\nraise TimeoutError('x')", 1, "m.TimeoutError", false},
		{"class X(SystemExit):\n    @property\n    def code(self):\n        raise KeyboardInterrupt\nraise X()", 1, "", true},
		{"class N(Exception):\n    @property\n    def __notes__(self):\n        raise KeyboardInterrupt\nclass X(SystemExit):\n    @property\n    def code(self):\n        raise N()\nraise X()\n", 1, "", true},
		{"class I(int):\n    def __and__(self, o): raise KeyboardInterrupt\nraise SystemExit(I(3))", 3, "", true},
		{"class N(Exception):\n    @property\n    def __class__(self): raise KeyboardInterrupt\nraise N()\n", 1, "N", false},
	} {
		r := run(t, p, Job{Code: tc.code, Timeout: 10 * time.Second})
		require.Equal(t, tc.exit, r.Exit, "%s\nerror: %+v\nstderr: %s", tc.code, r.Error, r.Stderr)
		require.NotContains(t, r.Stderr, "in loop", tc.code)
		if tc.exitOnly {
			require.Nil(t, r.Error, tc.code)
			continue
		}
		require.NotNil(t, r.Error, tc.code)
		require.Equal(t, tc.typ, r.Error.Type, "%s\nstderr: %s", tc.code, r.Stderr)
		var e *Error
		require.ErrorAs(t, r.Err(), &e)
		require.Equal(t, KindRuntime, e.Kind, tc.code)
	}
	advServes(t, p)
}

// A job that leaves many directories on a tmpfs in its write grant leaves
// their inodes and dentries charged to its cgroup (kernel memory that no
// reclaim frees while they exist, and that memory.stat's shmem does not
// count). Such a group is not kept for the next job, which would start
// with that charge against its own limit: once released, no job group of
// the pool holds more than a few MiB.
func TestHostileReview2CgroupLeftoverKernelMemory(t *testing.T) {
	requireLong(t, "50,000 directories: 25-45 s")
	dir := t.TempDir()
	if fs, err := os.ReadFile("/proc/self/mounts"); err != nil || !strings.Contains(string(fs), " tmpfs ") {
		t.Skip("no tmpfs mounted")
	}
	p := newCgroupPool(t, Config{Workers: 1, Dir: dir, Limits: Limits{Timeout: 2 * time.Minute}})
	r := run(t, p, Job{Code: "import os\nfor i in range(50000):\n    os.mkdir('d%06d' % i + 'x' * 180)\nprint('ok')",
		Timeout: 120 * time.Second, AllowWrite: []string{dir}}) // over 25 s on a busy machine
	requireOK(t, r)
	usage := func(d string) int64 {
		for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
			if b, err := os.ReadFile(filepath.Join(d, f)); err == nil {
				n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				require.NoError(t, err)
				return n
			}
		}
		return -1
	}
	// The job's group is released once its process is reaped; a few more
	// jobs make sure the pool went through its release.
	for i := 0; i < 3; i++ {
		advServes(t, p)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var over []string
		for _, d := range cgroupJobDirs(t, p) {
			if n := usage(d); n > 16<<20 {
				over = append(over, d+": "+strconv.FormatInt(n, 10))
			}
		}
		if len(over) == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "job groups kept with memory charged: %v", over)
		time.Sleep(100 * time.Millisecond)
	}
}

// The seccomp argument filters and the left-out calls, probed once more
// from a job, with the arguments a reviewer would try: foreign pids and
// clocks, real-time signals also with junk in the high half, fallocate
// modes, socketpair types, ioctl/fcntl/prctl options outside the sets,
// the clock and NUMA calls on other processes; and writes to procfs that
// would change the kernel's view of the job or the machine (Landlock
// grants none of /proc for writing, and uid 0 without capabilities would
// otherwise pass sysctl's mode check).
func TestHostileReview2SeccompArguments(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the probe uses amd64 system call numbers")
	}
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Timeout: 20 * time.Second, Code: advCode(`import signal
me = os.getpid()
buf = ctypes.create_string_buffer(256)
ln = ctypes.c_long(0)
sc("clock_settime", 227, 0, buf)
sc("clock_adjtime", 305, 0, buf)
sc("get_robust_list template", 274, 1, buf, ctypes.byref(ln))
sc("get_robust_list self", 274, 0, buf, ctypes.byref(ln))
sc("migrate_pages template", 256, 1, 64, buf, buf)
sc("move_pages template", 279, 1, 0, 0, 0, 0, 0)
sc("set_mempolicy", 238, 0, 0, 0)
sc("process_madvise", 440, 0, buf, 1, 8, 0)
sc("kcmp", 312, me, 1, 0, 0, 0)
sc("ioprio_get template", 252, 1, 1)
sc("setns", 308, 0, 0)
sc("sched_setattr template", 314, 1, buf, 0)
sc("sched_setattr high pid", 314, 1 << 32, buf, 0)
sc("setpriority high who", 141, 0, 1 << 32, 0)
sc("prlimit64 template", 302, 1, 7, 0, buf)
sc("prlimit64 high pid", 302, 1 << 32, 7, 0, buf)
other = ((~1) << 3) | 2
sc("clock_gettime template cpu", 228, other, buf)
sc("clock_getres template cpu", 229, other, buf)
sc("clock_nanosleep template cpu", 230, other, 0, buf, 0)
sc("timer_create template cpu", 222, other, 0, buf)
sc("clock_gettime fd clock", 228, ((~3) << 3) | 3, buf)
sc("clock_gettime own cpu", 228, ((~0) << 3) | 2, buf)
sc("kill self SIGRTMIN", 62, me, 34)
sc("kill self -1", 62, me, -1)
sc("kill self high RT", 62, me, (1 << 32) | 34)
sc("tgkill self RT", 234, me, me, 33)
sc("rt_sigqueueinfo self", 129, me, 10, buf)
sc("getsid template", 124, 1)
sc("getpgid high", 121, 1 << 32)
fd = os.memfd_create("probe")
sc("fallocate keep_size", 285, fd, 1, 0, 4096)
sc("fallocate zero_range", 285, fd, 0x10, 0, 4096)
sc("fallocate high keep_size", 285, fd, (1 << 32) | 1, 0, 4096)
pair = (ctypes.c_int * 2)()
sc("socketpair dgram", 53, 1, 2, 0, pair)
sc("socketpair seqpacket", 53, 1, 5, 0, pair)
sc("socketpair netlink", 53, 16, 3, 0, pair)
sc("ioctl TIOCSTI", 16, 0, 0x5412, buf)
sc("fcntl F_SETLEASE", 72, fd, 1024, 0)
sc("fcntl F_SETPIPE_SZ", 72, fd, 1031, 1 << 20)
sc("fcntl F_NOTIFY", 72, fd, 1026, 0)
sc("fcntl F_SETOWN", 72, fd, 8, 1)
sc("prctl PR_SET_PDEATHSIG", 157, 1, 0, 0, 0, 0)
sc("prctl PR_SET_DUMPABLE", 157, 4, 1, 0, 0, 0)
sc("prctl PR_SET_MM", 157, 35, 8, 0, 0, 0)
sc("prctl PR_SET_CHILD_SUBREAPER", 157, 36, 1, 0, 0, 0)
sc("prctl PR_SET_PTRACER", 157, 0x59616d61, -1, 0, 0, 0)
sc("prctl PR_SET_SECCOMP", 157, 22, 1, 0, 0, 0)
sc("personality ADDR_NO_RANDOMIZE", 135, 0x0040000)
sc("pidfd_open template", 434, 1, 0)
os.close(fd)
for path, data in (("/proc/self/oom_score_adj", "-1000"), ("/proc/self/coredump_filter", "0x7f"),
                   ("/proc/self/timerslack_ns", "1"), ("/proc/sys/vm/drop_caches", "1"),
                   ("/proc/sys/kernel/core_pattern", "|/bin/false"), ("/proc/1/oom_score_adj", "1000"),
                   ("/proc/sysrq-trigger", "h"), ("/proc/self/attr/current", "x")):
    def w(path=path, data=data):
        with open(path, "w") as f:
            f.write(data)
    attempt("write " + path, w)
`)})
	requireOK(t, r)
	got := advProbes(t, r)
	want := map[string][]string{}
	for name := range got {
		want[name] = []string{"EPERM"}
	}
	for _, name := range []string{"clock_gettime own cpu"} {
		want[name] = []string{"ok"}
	}
	for _, name := range []string{"fallocate keep_size", "fallocate zero_range", "fallocate high keep_size"} {
		want[name] = []string{"EOPNOTSUPP", "ENOTSUP"}
	}
	for name := range got {
		if strings.HasPrefix(name, "write ") {
			want[name] = []string{"EACCES", "EPERM", "ENOENT"}
		}
	}
	advExpect(t, got, want)
	advServes(t, p)
}

// Data a job queues on AF_UNIX stream socketpairs (the one kind of socket
// it may make without the network) is kernel memory that RLIMIT_AS does
// not count; with per-job cgroups it is charged to the job's group, so a
// job that queues as much as it can stops near its memory limit instead of
// pinning gigabytes of the host's memory.
func TestHostileReview2SocketBuffersCharged(t *testing.T) {
	p := newCgroupPool(t, Config{Workers: 1})
	r := run(t, p, Job{Memory: 64 << 20, Timeout: 20 * time.Second, Code: `import socket
pairs, tot, last = [], 0, 0
try:
    for i in range(2000):
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
        a.setblocking(False)
        try:
            while True:
                tot += a.send(b"x" * 65536)
                if tot - last >= 16 << 20:
                    last = tot
                    print("queued", tot >> 20, flush=True)
        except BlockingIOError:
            pass
        pairs.append((a, b))
finally:
    print("queued", tot >> 20, flush=True)
`})
	t.Logf("error %+v\nstdout (tail) %q", r.Error, tail(r.Stdout, 200))
	// The last "queued" line is at most the limit and the margin the pool
	// adds for the template's own memory (well under 1 GiB here).
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	var mib int
	_, err := fmt.Sscanf(lines[len(lines)-1], "queued %d", &mib)
	require.NoError(t, err, r.Stdout)
	require.Less(t, mib, 1024, "a job with 64 MiB queued %d MiB on socketpairs", mib)
	advServes(t, p)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// A job may change its own scheduling (the calls are allowed on pid 0),
// but not raise itself above others: no real-time policy, no negative
// nice value, no raising of RLIMIT_RTPRIO or RLIMIT_NICE (their hard
// limits are what the pool inherited, and without CAP_SYS_NICE or
// CAP_SYS_RESOURCE the kernel refuses).
//
// The pool starts here with RLIMIT_RTPRIO 99 and RLIMIT_NICE 40 (as under
// systemd's LimitRTPRIO=99, docker's --ulimit rtprio=99 or a shell's
// ulimit -r 99): without the runner setting both to 0 a job would inherit
// them and could make itself SCHED_FIFO or nice -20 and starve the
// machine's other processes. Raising them needs CAP_SYS_RESOURCE; where
// the test process lacks it the probe checks what the pool inherited.
func TestHostileReview2SchedulingPriority(t *testing.T) {
	requireSandbox(t)
	for _, res := range []int{unix.RLIMIT_RTPRIO, unix.RLIMIT_NICE} {
		var old unix.Rlimit
		require.NoError(t, unix.Getrlimit(res, &old))
		if err := unix.Setrlimit(res, &unix.Rlimit{Cur: 99, Max: 99}); err != nil {
			// Raising a hard limit needs CAP_SYS_RESOURCE, which some
			// containers withhold even from root: the probe then checks
			// the limits the pool inherited.
			t.Logf("the pool's limit %d is not raised: %v", res, err)
			continue
		}
		t.Cleanup(func() { _ = unix.Setrlimit(res, &old) })
	}
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Timeout: 20 * time.Second, Code: advCode(`import resource
R["rtprio limit"] = "%r" % (resource.getrlimit(resource.RLIMIT_RTPRIO),)
R["nice limit"] = "%r" % (resource.getrlimit(resource.RLIMIT_NICE),)
attempt("raise RLIMIT_RTPRIO", lambda: resource.setrlimit(resource.RLIMIT_RTPRIO, (99, 99)))
attempt("raise RLIMIT_NICE", lambda: resource.setrlimit(resource.RLIMIT_NICE, (40, 40)))
attempt("SCHED_FIFO", lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)))
attempt("SCHED_RR", lambda: os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1)))
attempt("nice -1", lambda: os.setpriority(os.PRIO_PROCESS, 0, -1))
attempt("nice 5", lambda: os.setpriority(os.PRIO_PROCESS, 0, 5))
attempt("SCHED_BATCH", lambda: os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0)))
attr = ctypes.create_string_buffer(56)
ctypes.memmove(attr, (56).to_bytes(4, "little") + (6).to_bytes(4, "little") + bytes(8) + bytes(8) + bytes(4) + (10 ** 6).to_bytes(8, "little") + (10 ** 7).to_bytes(8, "little") + (10 ** 7).to_bytes(8, "little"), 52)
sc("SCHED_DEADLINE", 314, 0, attr, 0)
`)})
	requireOK(t, r)
	got := advProbes(t, r)
	advExpect(t, got, map[string][]string{
		"rtprio limit":        {"(0, 0)"},
		"nice limit":          {"(0, 0)"},
		"raise RLIMIT_RTPRIO": {"EPERM", "ValueError"},
		"raise RLIMIT_NICE":   {"EPERM", "ValueError"},
		"SCHED_FIFO":          {"EPERM"},
		"SCHED_RR":            {"EPERM"},
		"nice -1":             {"EACCES", "EPERM"},
		"nice 5":              {"ok"},
		"SCHED_BATCH":         {"ok"},
		"SCHED_DEADLINE":      {"EPERM", "EBUSY", "EINVAL"},
	})
	advServes(t, p)
}

// mlock and mlockall are left out of the seccomp allow list, but mmap is
// allowed with any flags, MAP_LOCKED included, which locks the mapping's
// pages as mlock would (up to RLIMIT_MEMLOCK, 8 MiB by default, unlimited
// in some containers). The runner sets the job's RLIMIT_MEMLOCK to 0, so
// such a mapping fails and the job holds no locked page.
func TestHostileReview2MapLocked(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Timeout: 20 * time.Second, Code: advCode(`import mmap, resource
R["memlock limit"] = "%r" % (resource.getrlimit(resource.RLIMIT_MEMLOCK),)
MAP_LOCKED = 0x2000
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
ctypes.set_errno(0)
addr = _libc.mmap(None, 1 << 20, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_LOCKED, -1, 0)
R["mmap MAP_LOCKED"] = "ok" if addr not in (None, ctypes.c_void_p(-1).value) else _name(ctypes.get_errno())
sc("mlock", 149, 0, 4096)
sc("mlock2", 325, 0, 4096, 0)
sc("mlockall", 151, 1)
attempt("raise RLIMIT_MEMLOCK", lambda: resource.setrlimit(resource.RLIMIT_MEMLOCK, (1 << 20, 1 << 20)))
`)})
	requireOK(t, r)
	advExpect(t, advProbes(t, r), map[string][]string{
		"memlock limit":        {"(0, 0)"},
		"mmap MAP_LOCKED":      {"EAGAIN", "EPERM"},
		"mlock":                {"EPERM"},
		"mlock2":               {"EPERM"},
		"mlockall":             {"EPERM"},
		"raise RLIMIT_MEMLOCK": {"ValueError", "EPERM"},
	})
	advServes(t, p)
}
