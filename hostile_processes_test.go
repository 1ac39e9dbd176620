package pynox

// Adversarial suite (helpers in hostile_test.go): processes, fork and
// thread bombs, exec and the process limits.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHostileProcesses(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	dir := p.cfg.Dir
	marker := filepath.Join(dir, "out", "marker")
	// Each command, if it ever ran, would leave the marker behind.
	sh := "echo pwned > " + marker

	tests := []struct {
		name  string
		code  string
		check func(t *testing.T, r *Result)
	}{
		{"os.system", fmt.Sprintf("import os\nrc = os.system(%q)\nprint('rc', rc)", sh), func(t *testing.T, r *Result) {
			requireOK(t, r)
			require.NotEqual(t, "rc 0\n", r.Stdout)
			require.Regexp(t, `^rc -?\d+\n$`, r.Stdout)
		}},
		{"subprocess.run", fmt.Sprintf("import subprocess\nsubprocess.run(['/bin/sh', '-c', %q])", sh), func(t *testing.T, r *Result) {
			requireDenied(t, r, "", "PermissionError")
		}},
		{"os.fork", "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint('forked', pid)", func(t *testing.T, r *Result) {
			requireDenied(t, r, "", "PermissionError")
			require.Empty(t, r.Stdout)
		}},
		{"os.execv", fmt.Sprintf("import os\ntry:\n    os.execv('/bin/sh', ['sh', '-c', %q])\nfinally:\n    print('still here')", sh), func(t *testing.T, r *Result) {
			requireDenied(t, r, "", "PermissionError")
			require.Equal(t, "still here\n", r.Stdout)
		}},
		{"os.posix_spawn", fmt.Sprintf("import os\nos.posix_spawn('/bin/sh', ['sh', '-c', %q], {})", sh), func(t *testing.T, r *Result) {
			requireDenied(t, r, "", "PermissionError")
		}},
		{"multiprocessing fork", fmt.Sprintf("import multiprocessing as mp, os\nctx = mp.get_context('fork')\npr = ctx.Process(target=os.system, args=(%q,))\npr.start()\npr.join()", sh), func(t *testing.T, r *Result) {
			requireDenied(t, r, "", "PermissionError", "OSError")
		}},
		{"multiprocessing spawn", fmt.Sprintf("import multiprocessing as mp, os\nctx = mp.get_context('spawn')\npr = ctx.Process(target=os.system, args=(%q,))\npr.start()\npr.join()", sh), func(t *testing.T, r *Result) {
			requireDenied(t, r, "", "PermissionError", "OSError")
		}},
		{"raw process creation via ctypes", advCode(`import signal, struct
SIGCHLD = int(signal.SIGCHLD)
sc("fork", 57, child_exits=True)
sc("vfork", 58, child_exits=True)
sc("clone SIGCHLD", 56, SIGCHLD, 0, 0, 0, 0, child_exits=True)
sc("clone VM|VFORK (posix_spawn)", 56, 0x4000 | 0x100 | SIGCHLD, 0, 0, 0, 0, child_exits=True)
sc("clone NEWUSER", 56, 0x10000000 | SIGCHLD, 0, 0, 0, 0, child_exits=True)
args = ctypes.create_string_buffer(struct.pack("<11Q", 0, 0, 0, 0, SIGCHLD, 0, 0, 0, 0, 0, 0))
sc("clone3", 435, args, 88, child_exits=True)
sc("execve /bin/true", 59, b"/bin/true", 0, 0)
sc("execveat /bin/true", 322, -100, b"/bin/true", 0, 0, 0)
sc("control getpid", 39)
`), func(t *testing.T, r *Result) {
			requireOK(t, r)
			advExpect(t, advProbes(t, r), map[string][]string{
				"fork":                         {"EPERM"},
				"vfork":                        {"EPERM"},
				"clone SIGCHLD":                {"EPERM"},
				"clone VM|VFORK (posix_spawn)": {"EPERM"},
				"clone NEWUSER":                {"EPERM"},
				"clone3":                       {"ENOSYS"},
				"execve /bin/true":             {"EPERM"},
				"execveat /bin/true":           {"EPERM"},
				"control getpid":               {"ok"},
			})
		}},
		{"memfd_create and exec", advCode(fmt.Sprintf(`fd = os.memfd_create("payload", 0)
with open("/bin/sh", "rb") as f:
    os.write(fd, f.read())
R["memfd_create"] = "ok"
attempt("fexecve", lambda: os.execve(fd, ["sh", "-c", %q], {}))
sc("execveat AT_EMPTY_PATH", 322, fd, b"", 0, 0, 0x1000)
attempt("execve /proc/self/fd", lambda: os.execv("/proc/self/fd/%%d" %% fd, ["sh"]))
`, sh)), func(t *testing.T, r *Result) {
			requireOK(t, r)
			advExpect(t, advProbes(t, r), map[string][]string{
				"memfd_create":           {"ok"},
				"fexecve":                {"EPERM"},
				"execveat AT_EMPTY_PATH": {"EPERM"},
				"execve /proc/self/fd":   {"EPERM", "EACCES"},
			})
		}},
		{"x32 system call numbers", advCode(`X32 = 0x40000000
sc("x32 getpid", 39 | X32)
sc("x32 fork", 57 | X32, child_exits=True)
sc("x32 vfork", 58 | X32, child_exits=True)
sc("x32 execve", 520 | X32, b"/bin/true", 0, 0)
sc("x32 execveat", 545 | X32, -100, b"/bin/true", 0, 0, 0)
sc("x32 ptrace", 521 | X32, 16, os.getppid(), 0, 0)
sc("x32 socket", 41 | X32, 2, 1, 0)
sc("x32 unshare", 272 | X32, 0x10000000)
sc("x32 mount", 165 | X32, b"none", b"/tmp", b"tmpfs", 0, 0)
`), func(t *testing.T, r *Result) {
			requireOK(t, r)
			advExpect(t, advProbes(t, r), map[string][]string{
				"x32 getpid":   {"EPERM"},
				"x32 fork":     {"EPERM"},
				"x32 vfork":    {"EPERM"},
				"x32 execve":   {"EPERM"},
				"x32 execveat": {"EPERM"},
				"x32 ptrace":   {"EPERM"},
				"x32 socket":   {"EPERM"},
				"x32 unshare":  {"EPERM"},
				"x32 mount":    {"EPERM"},
			})
		}},
		{"i386 int 0x80 kills the job", `import ctypes, mmap
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")  # mov eax, 20 (i386 getpid); int 0x80; ret
f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
print("i386 getpid returned", f(), flush=True)
`, func(t *testing.T, r *Result) {
			requireErrorType(t, r, "SignalError")
			require.Contains(t, r.Error.Message, "SIGSYS", "a foreign-architecture call must kill the process")
			require.Empty(t, r.Stdout)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "out")
			require.NoError(t, os.RemoveAll(out))
			require.NoError(t, os.Mkdir(out, 0o755))
			r := run(t, p, Job{Code: tc.code, AllowWrite: []string{"out"}})
			tc.check(t, r)
			require.NotContains(t, r.Stdout, "pwned")
			// Give a process that escaped a moment to write its marker.
			time.Sleep(20 * time.Millisecond)
			require.NoFileExists(t, marker, "a command ran")
		})
	}
	advServes(t, p)

	t.Run("thread bomb", func(t *testing.T) {
		start := time.Now()
		r := run(t, p, Job{Code: `import threading, time
ev = threading.Event()
n = 0
try:
    while True:
        threading.Thread(target=ev.wait, daemon=True).start()
        n += 1
finally:
    print("threads", n, flush=True)
`, Timeout: 20 * time.Second})
		took := time.Since(start)
		t.Logf("thread bomb: %s after %d threads in %s", r.Error.Type, advThreads(r.Stdout), took)
		require.NotNil(t, r.Error, "stdout: %s", r.Stdout)
		require.Contains(t, []string{"RuntimeError", "MemoryError"}, r.Error.Type, "%s\n%s", r.Error.Message, r.Stderr)
		require.Less(t, took, 15*time.Second)
		require.Greater(t, advThreads(r.Stdout), 0)
		advServes(t, p)
	})
	t.Run("thread bomb with small stacks", func(t *testing.T) {
		// Small stacks buy more threads per MiB of allowance (observed: about
		// 650 threads at 64 KiB stacks whatever the allowance, about 1,200 at
		// 32 KiB under the default 1 GiB: far from the host's pid_max). Under
		// memory pressure CPython's Thread.start() can also wait forever for
		// a thread that died of MemoryError before it signalled that it
		// started, so the timeout may be what ends the job: still contained.
		start := time.Now()
		r := run(t, p, Job{Code: `import os, threading
threading.stack_size(64 * 1024)
ev = threading.Event()
n = 0
try:
    while True:
        threading.Thread(target=ev.wait, daemon=True).start()
        n += 1
        if n % 16 == 0:
            os.write(1, b"threads %d\n" % n)
finally:
    os.write(1, b"threads %d\n" % n)
`, Memory: 64 << 20, Timeout: 2 * time.Second})
		took := time.Since(start)
		t.Logf("small-stack thread bomb (64 MiB allowance): %s after %d threads in %s", r.Error.Type, advThreads(r.Stdout), took)
		require.NotNil(t, r.Error, "stdout: %s", r.Stdout)
		require.Contains(t, []string{"RuntimeError", "MemoryError", "TimeoutError"}, r.Error.Type, "%s\n%s", r.Error.Message, r.Stderr)
		require.Less(t, took, 15*time.Second)
		if p.Cgroups() == "none" {
			require.Greater(t, advThreads(r.Stdout), 100)
		} else {
			// The job's cgroup stops it first (pids.max).
			require.Greater(t, advThreads(r.Stdout), 0)
			require.Less(t, advThreads(r.Stdout), DefaultThreads)
		}
		advServes(t, p)
	})
}

func advThreads(stdout string) int {
	var n int
	for _, l := range strings.Split(stdout, "\n") {
		if rest, ok := strings.CutPrefix(l, "threads "); ok {
			n, _ = strconv.Atoi(strings.TrimSpace(rest))
		}
	}
	return n
}
