package pynox

// The seventh review: an outside reviewer's probes, each a job (or a
// session) of hostile Python under the real sandbox. None found a way
// out; each stays as a regression test asserting the specific denial and
// that the pool serves on. One finding is a shared kernel count the pool
// cannot bound (TestHostileReview7PipeQuota, a known limit).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHostileReview7FlagArguments probes system calls that a deny list
// would let through by their flag arguments: namespace flags riding on a
// thread clone, clone3, io_uring, prctl options and personality flags
// beyond the few allowed, process_vm_* and pidfd_open on the template,
// execveat of a memfd, the kernel's attack surface (perf, bpf,
// userfaultfd, keys), zero-copy pipe calls, NUMA policy, terminal
// injection ioctls on every inherited descriptor, and socket families and
// types beyond an AF_UNIX stream pair.
func TestHostileReview7FlagArguments(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("system call numbers are x86-64's")
	}
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Timeout: 20 * time.Second, Code: advCode(`
import socket
CLONE_VM, CLONE_SIGHAND, CLONE_THREAD = 0x100, 0x800, 0x10000
THREAD = CLONE_VM | CLONE_SIGHAND | CLONE_THREAD
# A thread clone that also asks for a namespace: it would return twice
# if allowed, so the child leaves at once (child_exits).
for name, flag in [("newuser", 0x10000000), ("newns", 0x20000), ("newnet", 0x40000000), ("newpid", 0x20000000),
                   ("newtime", 0x80), ("newcgroup", 0x02000000)]:
    sc("clone_thread_" + name, 56, THREAD | flag, 0, 0, 0, 0, child_exits=True)
sc("clone3", 435, 0, 0)
sc("io_uring_setup", 425, 8, 0)
sc("prctl_set_mm", 157, 35, 1, 0, 0, 0)
sc("prctl_set_dumpable", 157, 4, 1, 0, 0, 0)
sc("prctl_set_ptracer_any", 157, 0x59616d61, -1, 0, 0, 0)
sc("prctl_set_child_subreaper", 157, 36, 1, 0, 0, 0)
sc("prctl_set_securebits", 157, 28, 0, 0, 0, 0)
sc("prctl_cap_ambient", 157, 47, 2, 0, 0, 0)
sc("prctl_set_io_flusher", 157, 57, 1, 0, 0, 0)
sc("personality_read_implies_exec", 135, 0x0400000)
sc("personality_addr_no_randomize", 135, 0x0040000)
buf = ctypes.create_string_buffer(64)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 64)
sc("process_vm_readv_template", 310, 1, ctypes.addressof(iov), 1, ctypes.addressof(iov), 1, 0)
sc("process_vm_writev_template", 311, 1, ctypes.addressof(iov), 1, ctypes.addressof(iov), 1, 0)
sc("pidfd_open_template", 434, 1, 0)
sc("ptrace_attach_template", 101, 16, 1, 0, 0)
mfd = sc("memfd_create", 319, b"x", 0)
sc("execveat_memfd", 322, mfd, b"", 0, 0, 0x1000, child_exits=True)
sc("perf_event_open", 298, ctypes.addressof(buf), 0, -1, -1, 0)
sc("bpf", 321, 0, ctypes.addressof(buf), 64)
sc("userfaultfd", 323, 0)
sc("keyctl_join", 250, 1, 0)
sc("add_key", 248, b"user", b"x", b"y", 1, -2)
sc("splice", 275, 0, 0, 1, 0, 1, 0)
sc("tee", 276, 0, 1, 1, 0)
sc("set_mempolicy", 238, 0, 0, 0)
sc("migrate_pages", 256, 1, 64, ctypes.addressof(buf), ctypes.addressof(buf))
for fd in range(5):
    sc("ioctl_tiocsti_%d" % fd, 16, fd, 0x5412, b"x")
sc("ioctl_tiocsctty", 16, 0, 0x540E, 0)
sc("ioctl_tioclinux", 16, 0, 0x541C, ctypes.addressof(buf))
sc("ioctl_fionread_ctl", 16, 3, 0x541B, ctypes.addressof(buf))
for name, dom in [("netlink", 16), ("vsock", 40), ("unix", 1), ("packet", 17), ("alg", 38), ("xdp", 44), ("bluetooth", 31)]:
    sc("socket_" + name, 41, dom, 1, 0)
    sc("socket_dgram_" + name, 41, dom, 2, 0)
sc("socketpair_seqpacket", 53, 1, 5, 0, ctypes.addressof(buf))
sc("socketpair_dgram", 53, 1, 2, 0, ctypes.addressof(buf))
sc("socketpair_netlink", 53, 16, 1, 0, ctypes.addressof(buf))
a, b = socket.socketpair()
attempt("bind_abstract_on_pair", lambda: a.bind(b"\0pynox-review7"))
attempt("connect_abstract_on_pair", lambda: a.connect(b"\0pynox-review7"))
attempt("sendto_path_on_pair", lambda: a.sendto(b"x", "/run/systemd/notify"))
`)})
	got := advProbes(t, r)
	want := map[string][]string{
		"clone3":                        {"ENOSYS"},
		"memfd_create":                  {"ok"},
		"ioctl_fionread_ctl":            {"ok"},
		"bind_abstract_on_pair":         {"EPERM"},
		"connect_abstract_on_pair":      {"EPERM"},
		"sendto_path_on_pair":           {"EISCONN", "EOPNOTSUPP", "EPERM"},
		"personality_addr_no_randomize": {"EPERM"},
		"personality_read_implies_exec": {"EPERM"},
		"process_vm_readv_template":     {"EPERM"},
		"process_vm_writev_template":    {"EPERM"},
		"pidfd_open_template":           {"EPERM"},
		"ptrace_attach_template":        {"EPERM"},
		"execveat_memfd":                {"EPERM"},
		"perf_event_open":               {"EPERM"},
		"bpf":                           {"EPERM"},
		"userfaultfd":                   {"EPERM"},
		"keyctl_join":                   {"EPERM"},
		"add_key":                       {"EPERM"},
		"splice":                        {"EPERM"},
		"tee":                           {"EPERM"},
		"set_mempolicy":                 {"EPERM"},
		"migrate_pages":                 {"EPERM"},
		"io_uring_setup":                {"EPERM"},
		"ioctl_tiocsctty":               {"EPERM"},
		"ioctl_tioclinux":               {"EPERM"},
		"socketpair_seqpacket":          {"EPERM"},
		"socketpair_dgram":              {"EPERM"},
		"socketpair_netlink":            {"EPERM"},
		"prctl_set_mm":                  {"EPERM"},
		"prctl_set_dumpable":            {"EPERM"},
		"prctl_set_ptracer_any":         {"EPERM"},
		"prctl_set_child_subreaper":     {"EPERM"},
		"prctl_set_securebits":          {"EPERM"},
		"prctl_cap_ambient":             {"EPERM"},
		"prctl_set_io_flusher":          {"EPERM"},
		"clone_thread_newuser":          {"EPERM"},
		"clone_thread_newns":            {"EPERM"},
		"clone_thread_newnet":           {"EPERM"},
		"clone_thread_newpid":           {"EPERM"},
		"clone_thread_newtime":          {"EPERM"},
		"clone_thread_newcgroup":        {"EPERM"},
		"ioctl_tiocsti_0":               {"EPERM"},
		"ioctl_tiocsti_1":               {"EPERM"},
		"ioctl_tiocsti_2":               {"EPERM"},
		"ioctl_tiocsti_3":               {"EPERM"},
		"ioctl_tiocsti_4":               {"EPERM"},
	}
	for _, name := range []string{"netlink", "vsock", "unix", "packet", "alg", "xdp", "bluetooth"} {
		want["socket_"+name] = []string{"EPERM"}
		want["socket_dgram_"+name] = []string{"EPERM"}
	}
	advExpect(t, got, want)
	advServes(t, p)
}

// TestHostileReview7OtherProcesses probes the template (PID 1 of the
// job's PID namespace) and every other process through signals and
// /proc: kill, tgkill and a process-group kill of the template, kill(-1)
// (every process the job may signal), the template's /proc links and
// memory, the job's own /proc/self/mem, the cgroup tree and /dev/shm
// (where every job's scratch directory lives). The template must be the
// same process afterwards, and the pool must serve on.
func TestHostileReview7OtherProcesses(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("system call numbers are x86-64's")
	}
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	advServes(t, p)
	before := p.templatePIDs()
	r := run(t, p, Job{Timeout: 20 * time.Second, Code: advCode(`
import signal
R["getpid"] = str(os.getpid())
sc("kill_template_stop", 62, 1, signal.SIGSTOP)
sc("kill_template_kill", 62, 1, signal.SIGKILL)
sc("tgkill_template", 234, 1, 1, signal.SIGKILL)
sc("kill_everyone", 62, -1, signal.SIGKILL)
buf = ctypes.create_string_buffer(256)
for name, path in [("template_exe", "/proc/1/exe"), ("template_cwd", "/proc/1/cwd"), ("template_root", "/proc/1/root"),
                   ("template_fd3", "/proc/1/fd/3"), ("self_fd3", "/proc/self/fd/3")]:
    sc("readlink_" + name, 89, path.encode(), buf, 256)
for name, path in [("template_mem", "/proc/1/mem"), ("template_environ", "/proc/1/environ"), ("template_maps", "/proc/1/maps"),
                   ("self_mem", "/proc/self/mem"), ("self_pagemap", "/proc/self/pagemap"), ("template_shadow", "/proc/1/root/etc/shadow"),
                   ("cgroup_procs", "/sys/fs/cgroup/cgroup.procs"), ("kmsg", "/dev/kmsg"), ("self_fd3_reopen", "/proc/self/fd/3")]:
    attempt("open_" + name, lambda: os.close(os.open(path, os.O_RDWR if name.endswith("mem") else os.O_RDONLY)))
attempt("list_dev_shm", lambda: os.listdir("/dev/shm"))
attempt("list_scratch_root", lambda: os.listdir(os.path.dirname(os.environ["TMPDIR"])))
own = os.path.basename(os.environ["TMPDIR"].rstrip("/"))
sibling = "j1" if own != "j1" else "j0"  # the job's own scratch may be j1
attempt("list_sibling_scratch", lambda: os.listdir(os.path.join(os.path.dirname(os.environ["TMPDIR"]), sibling)))
attempt("shm_open", lambda: os.close(os.open("/dev/shm/pynox-review7", os.O_RDWR | os.O_CREAT, 0o600)))
`)})
	got := advProbes(t, r)
	delete(got, "getpid")
	denied := []string{"EPERM", "EACCES"}
	want := map[string][]string{
		"kill_template_stop": {"EPERM"},
		"kill_template_kill": {"EPERM"},
		"tgkill_template":    {"EPERM"},
		// Nothing in the job's scope but itself, which kill(-1) skips: ESRCH
		// when the namespace holds no other process than the template (PID
		// 1, skipped too), but 0 ("ok") when the template's next spare is
		// already there and refused the signal, since kill(-1) reports
		// success when every target it tried refused with EPERM
		// (kill_something_info). That nothing died is checked below: the
		// template is the same process and the pool serves on.
		"kill_everyone":          {"ESRCH", "ok"},
		"readlink_template_exe":  denied,
		"readlink_template_cwd":  denied,
		"readlink_template_root": denied,
		"readlink_template_fd3":  denied,
		"readlink_self_fd3":      {"ok"}, // its own control socket's name: socket:[inode]
		"open_template_mem":      denied,
		"open_template_environ":  denied,
		"open_template_maps":     denied,
		"open_self_mem":          denied,
		"open_self_pagemap":      denied,
		"open_template_shadow":   denied,
		"open_cgroup_procs":      append(denied, "ENOENT"), // v1 has no cgroup.procs at its root
		"open_kmsg":              denied,
		"open_self_fd3_reopen":   append(denied, "ENXIO"), // a socket cannot be reopened
		"list_dev_shm":           denied,
		"list_scratch_root":      denied,
		"list_sibling_scratch":   append(denied, "ENOENT"),
		"shm_open":               denied,
	}
	advExpect(t, got, want)
	require.Equal(t, before, p.templatePIDs(), "the template was replaced: the job reached it")
	advServes(t, p)
}

// TestHostileReview7ForgedNonFiniteValue: a job reports a last value that
// Python's json writes by default but that is no JSON (NaN, Infinity), and
// one whose string holds a lone surrogate escape. The non-JSON reports end
// the job as a protocol violation (no value passes on); the pool serves on.
func TestHostileReview7ForgedNonFiniteValue(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	for _, v := range []string{"NaN", "Infinity", "-Infinity", "[NaN]", `{"a": Infinity}`} {
		code := forgeReport + "report(b'{\"t\":\"done\",\"step\":1,\"exit\":0,\"error\":null,\"value\":" + v + "}')\ntime.sleep(30)\n"
		r := run(t, p, Job{ID: v, Code: code, Timeout: 20 * time.Second})
		requireErrorType(t, r, "PoolWorkerError")
		require.Empty(t, r.Value, v)
	}
	// An honest value that is not finite is reported by its repr.
	r := run(t, p, Job{Code: "float('nan')"})
	requireOK(t, r)
	require.Empty(t, r.Value)
	require.Equal(t, "nan", r.ValueRepr)
	advServes(t, p)
}

// TestHostileReview7RequestEnvAndNames: a request's environment cannot
// hold what the runner cannot set (a key with '=', an empty key, a NUL),
// nor move the pool's own outputs directory; a TMPDIR pointed elsewhere
// grants nothing there. Each request gets exactly one answer and the pool
// serves on.
func TestHostileReview7RequestEnvAndNames(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	for _, env := range []map[string]string{{"A=B": "x"}, {"": "x"}, {"A": "x\x00y"}, {"A\x00": "x"}} {
		r := run(t, p, Job{Code: "print(1)", Env: env})
		requireErrorType(t, r, "RequestError")
		require.Contains(t, r.Error.Message, "env", "%q", env)
	}
	r := run(t, p, Job{Env: map[string]string{"PYNOX_OUTPUTS": "/etc", "TMPDIR": "/etc", "HOME": "/root"}, Code: `
import os, tempfile
print(os.environ["PYNOX_OUTPUTS"].startswith(os.path.dirname(os.environ["PYNOX_OUTPUTS"])), os.environ["PYNOX_OUTPUTS"] != "/etc")
try:
    tempfile.mkstemp()
    print("wrote", tempfile.gettempdir())
except OSError as e:
    print(type(e).__name__)
`})
	requireOK(t, r)
	// tempfile finds no directory it may write (FileNotFoundError: "No
	// usable temporary directory") or is refused.
	require.Contains(t, []string{"True True\nFileNotFoundError\n", "True True\nPermissionError\n"}, r.Stdout)
	// A file name with a NUL is the job's own compile error, answered once.
	r = run(t, p, Job{Code: "print(1)", Name: "a\x00b"})
	require.NotNil(t, r.Error)
	advServes(t, p)
}

// TestHostileReview7GrantsThroughProc: grants named through /proc's magic
// links resolve to what the pool's own descriptor names, and are judged
// as that: the pool's descriptors (a pipe, its scratch root) and paths
// outside the ceiling are refused; /proc/self/cwd is the ceiling itself.
func TestHostileReview7GrantsThroughProc(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	res := run(t, p, Job{Code: "import os; print(os.path.dirname(os.environ['TMPDIR']))"})
	requireOK(t, res)
	scratchRoot := strings.TrimSpace(res.Stdout)
	for _, tc := range []struct {
		read, write []string
	}{
		{read: []string{"/proc/self/fd/0"}},
		{read: []string{"/proc/self/fd/1"}},
		{read: []string{"/proc/self/root/etc"}},
		{read: []string{"/proc/1/root"}},
		{read: []string{scratchRoot}},
		{read: []string{filepath.Join(scratchRoot, "j1")}},
		{write: []string{"/proc/self/cwd/../"}},
		{write: []string{"/proc/self/exe"}},
		{write: []string{scratchRoot}},
		{read: []string{"/proc/self/cwd"}}, // the pool's own working directory, outside this ceiling
	} {
		r := run(t, p, Job{Code: "print(1)", AllowRead: tc.read, AllowWrite: tc.write})
		requireErrorType(t, r, "RequestError")
	}
	// The ceiling named through the pool's root is the ceiling.
	r := run(t, p, Job{AllowRead: []string{"/proc/self/root" + p.cfg.Dir}, Code: "print(1)"})
	requireOK(t, r)
	require.Equal(t, []string{p.cfg.Dir}, r.Policy.AllowRead)
	advServes(t, p)
}

// TestHostileReview7PipeQuota: pipes count against a per-user budget of
// pipe pages across the whole machine (fs.pipe-user-pages-soft, 16384
// pages) for every process without CAP_SYS_RESOURCE, a job included; past
// it, every new pipe of that user gets 2 pages instead of 16. A session
// holding 2000 pipes (within its 4096 descriptors) so shrinks the pipes
// the template makes for the next jobs, and those of every other process
// of the pool's uid without the capability. It is a known limit (a shared
// kernel count, like queued signals): the probe asserts that the pool
// still serves, and a following job's output of 1 MiB arrives whole.
func TestHostileReview7PipeQuota(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	ev := feed(t, co, `
import os, fcntl
held = []
try:
    while len(held) < 2000:
        held.append(os.pipe())
except OSError as e:
    print("stopped", e)
r, w = os.pipe()
print(len(held), fcntl.fcntl(w, 1032))
`)
	requireOK(t, ev)
	t.Logf("the session holds: %s", strings.TrimSpace(ev.Stdout))
	r := run(t, p, Job{Code: `
import fcntl, os, sys
r, w = os.pipe()
print(fcntl.fcntl(w, 1032), fcntl.fcntl(1, 1032), file=sys.stderr)
sys.stdout.write("x" * (1 << 20))
`})
	requireOK(t, r)
	t.Logf("a following job's new pipe and stdout pipe sizes: %s", strings.TrimSpace(r.Stderr))
	require.Equal(t, strings.Repeat("x", 1<<20), r.Stdout)
	require.NoError(t, co.Finish(context.Background()))
	advServes(t, p)
}

// TestHostileReview7ThreadClonesWithinPids: a raw thread clone bomb stays
// within the job's task limit and the template and the next job are
// unaffected (a fork bomb is impossible: fork and non-thread clones fail).
func TestHostileReview7ThreadClonesWithinPids(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	if p.Cgroups() == "none" {
		t.Skip("no pids cgroup: threads are not bounded for uid 0 (a known limit)")
	}
	before := p.templatePIDs()
	r := run(t, p, Job{Timeout: 20 * time.Second, Code: `
import threading, time
ev = threading.Event()
n = 0
try:
    for i in range(500):
        threading.Thread(target=ev.wait, daemon=True).start()
        n += 1
except RuntimeError as e:
    print("stopped", n, e)
ev.set()
print("threads", n)
`})
	requireOK(t, r)
	require.Contains(t, r.Stdout, "stopped")
	var n int
	_, err := fmt.Sscanf(r.Stdout[strings.Index(r.Stdout, "threads"):], "threads %d", &n)
	require.NoError(t, err)
	require.Less(t, n, 64, "more threads than the task limit")
	require.Equal(t, before, p.templatePIDs())
	advServes(t, p)
}

// TestHostileReview7SessionsShareNoTemplateState: two sessions forked
// from the same template cannot see each other's variables, modules,
// environment or files, even when one changes what it inherited from the
// template (sys.modules, builtins, os.environ, the json module the runner
// reports with) first. Replacing json.dumps breaks that session's own
// report (PoolWorkerError, its process ended): it hurts only itself.
func TestHostileReview7SessionsShareNoTemplateState(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	a := checkout(t, p, Job{})
	b := checkout(t, p, Job{})
	ra := feed(t, a, `
import builtins, os, sys, json
json.dumps = lambda *a, **k: "forged"
os.environ["SECRET"] = "a-secret"
sys.modules["pynox_shared"] = type(sys)("x")
open(os.path.join(os.environ["TMPDIR"], "secret"), "w").write("a-secret")
secret = "a-secret"
builtins.print = lambda *a, **k: None
`)
	// The step's report is formatted without the json module (runner.py's
	// session_loop), so the forged json.dumps no longer breaks it.
	requireOK(t, ra)
	ev := feed(t, b, `
import os, sys, json
print(os.environ.get("SECRET"), "pynox_shared" in sys.modules, json.dumps(1), "secret" in globals(),
      os.listdir(os.environ["TMPDIR"]))
`)
	requireOK(t, ev)
	require.Equal(t, "None False 1 False ['outputs']\n", ev.Stdout)
	advServes(t, p)
}

// TestHostileReview7ReopenOwnChannels: Landlock does not mediate opening
// a pipe through /proc/self/fd (pipefs is internal), so a job can open a
// second read end of its own stdout and of its bell (descriptor 4), and
// drain them from a thread. That steals only its own output and its own
// wake-ups: without the ring of its report, the pool learns of the report
// when the runner, unkilled, exits on its own (5 s later), or ends the job
// at its timeout, whichever comes first; either way within the job's own
// time. The control socket cannot be reopened at all, and the next job's
// output is whole.
func TestHostileReview7ReopenOwnChannels(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Timeout: 1500 * time.Millisecond, Code: `
import os, threading, time
fds = [os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_NONBLOCK) for fd in (1, 2, 4)]
try:
    os.open("/proc/self/fd/3", os.O_RDWR)
    print("reopened the control socket")
except OSError as e:
    pass
stop = False
def drain():
    while not stop:
        for fd in fds:
            try:
                os.read(fd, 65536)
            except BlockingIOError:
                pass
        time.sleep(0.0005)
threading.Thread(target=drain, daemon=True).start()
for i in range(200):
    print("line", i, flush=True)
time.sleep(0.05)
"reported"
`})
	require.NotContains(t, r.Stdout, "reopened the control socket")
	if r.Error != nil {
		requireErrorType(t, r, "TimeoutError") // its report's ring was stolen
	} else {
		require.Equal(t, `"reported"`, string(r.Value))
	}
	next := run(t, p, Job{Code: "for i in range(1000):\n    print('line', i)"})
	requireOK(t, next)
	require.Equal(t, 1000, strings.Count(next.Stdout, "line "))
	advServes(t, p)
}

// TestHostileReview7InflightDescriptors: descriptors in flight on unix
// sockets (sent with SCM_RIGHTS and not yet received) are counted per
// user across the whole machine, and a process without CAP_SYS_RESOURCE
// may send more only while that count is within its own RLIMIT_NOFILE. A
// session put 4301 of them in flight on its own socketpair (its limit is
// 4096) and kept them there, stopped between steps. The template, which
// hands every new spare to the pool with SCM_RIGHTS and had the soft
// descriptor limit the pool was started with (1024 under a shell's or
// systemd's default; Go restores it for the processes it starts), then
// failed to send its next spare and died: every other session and job of
// that template with it (another tenant's session lost its variables).
// The template now raises its soft limit to its hard limit, and a job's
// own limit stays at most half of that, so no job can push the count to
// where the template's sends fail.
func TestHostileReview7InflightDescriptors(t *testing.T) {
	var orig syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig))
	if orig.Max < 8192 {
		t.Skipf("the hard descriptor limit is %d; the probe needs room above a job's 4096", orig.Max)
	}
	// The templates start with the soft limit of a default shell.
	low := orig
	low.Cur = 1024
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low))
	p := newTestPool(t, Config{Workers: 1})
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig))
	before := p.templatePIDs()

	victim := checkout(t, p, Job{})
	requireOK(t, feed(t, victim, "x = 'tenant-a'"))
	attacker := checkout(t, p, Job{})
	r := feed(t, attacker, `
import array, socket
a, b = socket.socketpair()
n = 0
try:
    for i in range(40):
        a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0] * 253))])
        n += 253
except OSError as e:
    print("stopped:", e)
print("in flight", n)
`)
	requireOK(t, r)
	t.Logf("the attacking session: %s", strings.TrimSpace(r.Stdout))
	for i := 0; i < 3; i++ {
		requireOK(t, run(t, p, Job{Code: "print(6 * 7)"}))
	}
	r = feed(t, victim, "print(x)")
	require.False(t, r.Restarted, "the victim's session was restarted: its template died")
	requireOK(t, r)
	require.Equal(t, "tenant-a\n", r.Stdout)
	require.Equal(t, before, p.templatePIDs(), "the template died")
	requireOK(t, feed(t, attacker, "print(n)"))
	advServes(t, p)
}

// TestHostileReview7ConfigNotReadable: the configuration file is the
// operator's (its profiles' env may hold what only jobs of that profile
// should see), and SECURITY.md counts it among what jobs cannot read. In
// the natural set-up it lies in the working directory, the default read
// ceiling, and a request that asked to read "." read it. A read grant
// (allow_read, package_dirs, a read-only mount) that covers it, or is a
// hard link to it, is now refused as write grants are; a directory beside
// it is still granted.
func TestHostileReview7ConfigNotReadable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := filepath.Join(dir, "pynox.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[profiles.p]\nenv = {API_KEY = \"profile-secret\"}\n"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "data"), 0o755))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "links"), 0o755))
	require.NoError(t, os.Link(conf, filepath.Join(dir, "links", "copy.toml")))
	p := newTestPool(t, Config{Dir: dir, Source: conf, Limits: Limits{AllowWrite: []string{}}})
	read := "print(open(%q).read())"
	for _, tc := range []struct {
		job  Job
		what string
	}{
		{Job{AllowRead: []string{"."}, Code: fmt.Sprintf(read, "pynox.toml")}, "allow_read"},
		{Job{AllowRead: []string{dir}, Code: fmt.Sprintf(read, conf)}, "allow_read"},
		{Job{AllowRead: []string{"pynox.toml"}, Code: fmt.Sprintf(read, conf)}, "allow_read"},
		{Job{AllowRead: []string{"links/copy.toml"}, Code: fmt.Sprintf(read, "links/copy.toml")}, "allow_read"},
		{Job{PackageDirs: []string{"."}, Code: fmt.Sprintf(read, "pynox.toml")}, "package_dirs"},
		{Job{Mounts: []MountSpec{{HostPath: dir, Mode: ReadOnly}}, Code: fmt.Sprintf(read, conf)}, "mounts"},
	} {
		r := run(t, p, tc.job)
		require.NotContains(t, r.Stdout, "profile-secret", "%+v", tc.job)
		requireErrorType(t, r, "RequestError")
		require.Contains(t, r.Error.Message, tc.what)
		require.Contains(t, r.Error.Message, "configuration file")
	}
	r := run(t, p, Job{AllowRead: []string{"data"}, Code: "import os; print(os.listdir('data'))"})
	requireOK(t, r)
	advServes(t, p)
}
