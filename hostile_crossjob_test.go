package pynox

// Adversarial suite (helpers in hostile_test.go): across jobs, what one
// job can reach of, leave for or learn from another.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestHostileCrossJob(t *testing.T) {
	t.Parallel()
	t.Run("another job's process", func(t *testing.T) {
		p := newTestPool(t, Config{Workers: 2})
		shared := filepath.Join(p.cfg.Dir, "shared")
		require.NoError(t, os.Mkdir(shared, 0o755))
		const secret = "hunter2-cross-job-secret"
		aDone := make(chan *Result, 1)
		go func() {
			aDone <- run(t, p, Job{ID: "A", Env: map[string]string{"A_SECRET": secret}, AllowWrite: []string{"shared"}, Code: `import os, time
token = os.environ["A_SECRET"] * 3  # also on A's heap
open("shared/a.pid", "w").write(os.readlink("/proc/self"))
deadline = time.time() + 60
while not os.path.exists("shared/stop") and time.time() < deadline:
    time.sleep(0.02)
print("A done", len(token))
`})
		}()
		require.Eventually(t, func() bool {
			b, err := os.ReadFile(filepath.Join(shared, "a.pid"))
			return err == nil && len(b) > 0
		}, 30*time.Second, 10*time.Millisecond)

		r := run(t, p, Job{ID: "B", AllowRead: []string{"shared"}, Code: advCode(`import signal
a = int(open("shared/a.pid").read())
proc = "/proc/%d/" % a
def read(name, n=4096):
    with open(proc + name, "rb") as f:
        return f.read(n)
def mem():
    with open(proc + "mem", "rb") as f:
        f.seek(id(None))
        return f.read(64)
attempt("read mem", mem)
attempt("read environ", lambda: read("environ"))
attempt("read cmdline", lambda: read("cmdline"))
attempt("read status", lambda: read("status"))
attempt("read maps", lambda: read("maps"))
attempt("read stack", lambda: read("stack"))
attempt("read io", lambda: read("io"))
attempt("list fd", lambda: os.listdir(proc + "fd"))
attempt("list root", lambda: os.listdir(proc + "root"))
attempt("readlink cwd", lambda: os.readlink(proc + "cwd"))
attempt("readlink exe", lambda: os.readlink(proc + "exe"))
attempt("readlink fd 3", lambda: os.readlink(proc + "fd/3"))
attempt("open fd 1", lambda: open(proc + "fd/1", "w").write("forged"))
attempt("list task", lambda: os.listdir(proc + "task"))
attempt("kill 0", lambda: os.kill(a, 0))
sc("ptrace attach", 101, 16, a, 0, 0)
sc("pidfd_open", 434, a, 0)
buf = ctypes.create_string_buffer(64)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
sc("process_vm_readv", 310, a, ctypes.byref(iovec(ctypes.addressof(buf), 64)), 1, ctypes.byref(iovec(id(None), 64)), 1, 0)
`)})
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			"read mem": {"EACCES"}, "read environ": {"EACCES"}, "read cmdline": {"EACCES"}, "read status": {"EACCES"},
			"read maps": {"EACCES"}, "read stack": {"EACCES"}, "read io": {"EACCES"}, "list fd": {"EACCES"},
			"list root": {"EACCES"}, "readlink cwd": {"EACCES"}, "readlink exe": {"EACCES"}, "readlink fd 3": {"EACCES"},
			"open fd 1": {"EACCES"}, "list task": {"EACCES"}, "kill 0": {"EPERM", "ESRCH"},
			"ptrace attach": {"EPERM"}, "pidfd_open": {"EPERM"}, "process_vm_readv": {"EPERM"},
		})
		require.NotContains(t, r.Stdout+r.Stderr, "hunter2")

		require.NoError(t, os.WriteFile(filepath.Join(shared, "stop"), nil, 0o644))
		ra := <-aDone
		requireOK(t, ra)
		require.Equal(t, fmt.Sprintf("A done %d\n", 3*len(secret)), ra.Stdout, "job A was disturbed")
		advServes(t, p)
	})

	t.Run("interpreter state", func(t *testing.T) {
		// One worker: the next job is forked from the same template.
		p := newTestPool(t, Config{Workers: 1})
		dir := p.cfg.Dir
		unique := fmt.Sprintf("pynox-leak-%d-%d", os.Getpid(), time.Now().UnixNano())
		files := []string{filepath.Join("/tmp", unique), filepath.Join("/dev/shm", unique), filepath.Join("/var/tmp", unique),
			filepath.Join(dir, unique), filepath.Join(os.Getenv("HOME")+"/", unique)}
		filesPy := "["
		for _, f := range files {
			filesPy += fmt.Sprintf("%q, ", f)
		}
		filesPy += "]"
		r := run(t, p, Job{Code: advCode(`import atexit, builtins, json, linecache, signal, types
LEAK = "global"
json.LEAK = "module attribute"
builtins.LEAK = "builtin"
sys.modules["pynox_leak"] = types.ModuleType("pynox_leak")
os.environ["LEAK"] = "environ"
os.putenv("LEAK2", "putenv")
sys.path.insert(0, "/leak")
sys.setrecursionlimit(123456)
os.chdir("/")
os.umask(0o777)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
atexit.register(print, "LEAKED atexit")
linecache.cache["leak"] = (1, None, ["leak\n"], "leak")
for f in ` + filesPy + `:
    attempt("write " + f, lambda: open(f, "w").write("leak"))
`)})
		requireOK(t, r)
		got := advProbes(t, r)
		for _, f := range files {
			require.Contains(t, []string{"EACCES", "ENOENT"}, got["write "+f], f)
			require.NoFileExists(t, f)
		}
		require.NotContains(t, r.Stdout, "LEAKED atexit")

		r = run(t, p, Job{Code: `import builtins, json, linecache, os, signal, sys
seen = []
if "LEAK" in globals(): seen.append("global")
if hasattr(json, "LEAK"): seen.append("module attribute")
if hasattr(builtins, "LEAK"): seen.append("builtin")
if "pynox_leak" in sys.modules: seen.append("sys.modules")
if "LEAK" in os.environ or "LEAK2" in os.environ: seen.append("environ")
if "/leak" in sys.path: seen.append("sys.path")
if sys.getrecursionlimit() == 123456: seen.append("recursion limit")
if os.getcwd() == "/": seen.append("cwd")
old = os.umask(0o022)
if old == 0o777: seen.append("umask")
if signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN: seen.append("signal handler")
if "leak" in linecache.cache: seen.append("linecache")
for f in ` + filesPy + `:
    if os.path.exists(f): seen.append(f)
print("seen", seen)
`})
		requireOK(t, r)
		require.Equal(t, "seen []\n", r.Stdout)
		advServes(t, p)
	})

	// System V IPC and POSIX message queues live outside the filesystem
	// and Landlock, in the host's IPC namespace: a channel between jobs
	// (and a persistent leak on the host) unless seccomp denies them.
	t.Run("kernel IPC objects", func(t *testing.T) {
		p := newTestPool(t, Config{Workers: 1})
		key := 0x70790000 | (os.Getpid() & 0xffff)
		mq := fmt.Sprintf("pynox-leak-%d", os.Getpid())
		t.Cleanup(func() { advRemoveIPC(key, mq) })
		common := fmt.Sprintf("KEY = %d\nMQ = %q\nIPC_CREAT = 0o1000\n", key, mq)
		r := run(t, p, Job{Code: advCode(common + `import struct
addr = None
shmid = sc("shmget create", 29, KEY, 4096, IPC_CREAT | 0o666)
if shmid >= 0:
    _libc.shmat.restype = ctypes.c_void_p
    addr = _libc.shmat(shmid, None, 0)
    if addr not in (None, ctypes.c_void_p(-1).value):
        ctypes.memmove(addr, b"hunter2-shm", 11)
        R["shm write"] = "ok"
msq = sc("msgget create", 68, KEY, IPC_CREAT | 0o666)
if msq >= 0:
    msg = ctypes.create_string_buffer(struct.pack("<q", 1) + b"hunter2-msg")
    sc("msgsnd", 69, msq, msg, 11, 0)
sem = sc("semget create", 64, KEY, 1, IPC_CREAT | 0o666)
if sem >= 0:
    sc("semctl setval", 66, sem, 0, 16, 42)
sc("mq_open create", 240, MQ, os.O_CREAT | os.O_RDWR, 0o666, 0)
`)})
		requireOK(t, r)
		t.Logf("first job: %v", advProbes(t, r))
		// The objects must not outlive the job that made them...
		if _, err := unix.SysvShmGet(key, 0, 0); !errors.Is(err, unix.ENOENT) {
			t.Errorf("a job's shared memory segment outlived it on the host (shmget: %v)", err)
		}
		// ...nor be reachable from the next job.
		r = run(t, p, Job{Code: advCode(common + `R["shm content"] = R["msg content"] = "none"
shmid = sc("shmget existing", 29, KEY, 0, 0)
if shmid >= 0:
    _libc.shmat.restype = ctypes.c_void_p
    addr = _libc.shmat(shmid, None, 0)
    R["shm content"] = ctypes.string_at(addr, 11).decode(errors="replace")
msq = sc("msgget existing", 68, KEY, 0)
if msq >= 0:
    buf = ctypes.create_string_buffer(64)
    n = _libc.syscall(ctypes.c_long(70), ctypes.c_long(msq), buf, ctypes.c_long(32), ctypes.c_long(0), ctypes.c_long(0o4000))
    R["msg content"] = buf.raw[8:8 + max(n, 0)].decode(errors="replace")
sc("semget existing", 64, KEY, 0, 0)
sc("mq_open existing", 240, MQ, os.O_RDONLY, 0, 0)
`)})
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			"shmget existing": {"ENOENT", "EPERM"}, "msgget existing": {"ENOENT", "EPERM"},
			"semget existing": {"ENOENT", "EPERM"}, "mq_open existing": {"ENOENT", "EPERM", "EACCES"},
			"shm content": {"none"}, "msg content": {"none"},
		})
		advServes(t, p)
	})
}

// advRemoveIPC removes the IPC objects a hole probe may have left on the
// host.
func advRemoveIPC(key int, mq string) {
	if id, err := unix.SysvShmGet(key, 0, 0); err == nil {
		_, _ = unix.SysvShmCtl(id, unix.IPC_RMID, nil)
	}
	if id, _, errno := unix.Syscall(unix.SYS_MSGGET, uintptr(key), 0, 0); errno == 0 {
		_, _, _ = unix.Syscall(unix.SYS_MSGCTL, id, unix.IPC_RMID, 0)
	}
	if id, _, errno := unix.Syscall(unix.SYS_SEMGET, uintptr(key), 0, 0); errno == 0 {
		_, _, _ = unix.Syscall6(unix.SYS_SEMCTL, id, 0, unix.IPC_RMID, 0, 0, 0)
	}
	if name, err := unix.BytePtrFromString(mq); err == nil {
		_, _, _ = unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(name)), 0, 0)
	}
}
