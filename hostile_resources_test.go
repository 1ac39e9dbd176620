package pynox

// Adversarial suite (helpers in hostile_test.go): resources, memory,
// recursion, output, disk and CPU.

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

func TestHostileResources(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	dir := p.cfg.Dir

	t.Run("memory bomb", func(t *testing.T) {
		start := time.Now()
		r := run(t, p, Job{Code: "x = []\nwhile True:\n    x.append(' ' * (1 << 20) + str(len(x)))\n", Memory: 256 << 20})
		requireErrorType(t, r, "MemoryError")
		require.Contains(t, r.Error.Hint, "256 MiB")
		require.Less(t, time.Since(start), 20*time.Second)
		advServes(t, p)
	})
	smallObjects := "x = []\nwhile True:\n    x.append([len(x)] * 64)\n"
	t.Run("memory bomb of small objects", func(t *testing.T) {
		r := run(t, p, Job{Code: smallObjects, Memory: 128 << 20})
		requireErrorType(t, r, "MemoryError")
		require.Contains(t, r.Error.Hint, "128 MiB")
		advServes(t, p)
	})
	t.Run("memory bomb of small objects is contained", func(t *testing.T) {
		requireLong(t, "the small-object bomb again, timed (the subtest above proves the MemoryError)")
		start := time.Now()
		r := run(t, p, Job{Code: smallObjects, Memory: 128 << 20})
		t.Logf("small-object memory bomb: exit %d, error %+v, stderr %q", r.Exit, r.Error, r.Stderr)
		require.False(t, r.Error == nil && r.Exit == 0, "the job cannot have succeeded")
		require.Less(t, time.Since(start), 20*time.Second)
		advServes(t, p)
	})
	recursion := "import sys\nsys.setrecursionlimit(10**6)\ndef f(n):\n    return f(n + 1) + 1\nf(0)\n"
	t.Run("deep recursion", func(t *testing.T) {
		start := time.Now()
		r := run(t, p, Job{Code: recursion, Timeout: 30 * time.Second}) // the ceiling: the point is how it ends, not when (9.6 s seen on a busy machine)
		require.NotNil(t, r.Error)
		require.Contains(t, []string{"RecursionError", "MemoryError", "SignalError"}, r.Error.Type, r.Error.Message)
		t.Logf("Python recursion: %s in %s", r.Error.Type, time.Since(start))
		advServes(t, p)
	})
	t.Run("deep recursion is contained", func(t *testing.T) {
		requireLong(t, "deep recursion again, under a 3 s timeout (\"deep recursion\" above proves how it ends)")
		start := time.Now()
		r := run(t, p, Job{Code: recursion, Timeout: 3 * time.Second})
		require.NotNil(t, r.Error)
		require.Contains(t, []string{"RecursionError", "MemoryError", "SignalError", "TimeoutError"}, r.Error.Type, r.Error.Message)
		t.Logf("Python recursion under a 3s timeout: %s in %s", r.Error.Type, time.Since(start))
		require.Less(t, time.Since(start), 10*time.Second)
		advServes(t, p)
	})
	t.Run("deep C recursion", func(t *testing.T) {
		// repr of a deeply nested list recurses in C: with the limit raised
		// this overflows the C stack.
		r := run(t, p, Job{Code: "import sys\nsys.setrecursionlimit(10**6)\nx = []\nfor _ in range(10**6):\n    x = [x]\nprint(len(repr(x)))\n"})
		require.NotNil(t, r.Error, "stdout: %s", r.Stdout)
		require.Contains(t, []string{"RecursionError", "MemoryError", "SignalError"}, r.Error.Type, r.Error.Message)
		if r.Error.Type == "SignalError" {
			require.Contains(t, r.Error.Message, "SIGSEGV")
		}
		t.Logf("C recursion: %s %s", r.Error.Type, r.Error.Message)
		advServes(t, p)
	})
	t.Run("100 MB of output", func(t *testing.T) {
		start := time.Now()
		r := run(t, p, Job{Code: `import os
chunk = b"x" * (1 << 20)
for _ in range(100):
    os.write(1, chunk)
    os.write(2, chunk)
print("end", flush=True)
`, MaxOutput: 4096})
		took := time.Since(start)
		t.Logf("200 MB of output captured in %s", took)
		requireOK(t, r)
		require.Len(t, r.Stdout, 4096)
		require.Len(t, r.Stderr, 4096)
		require.True(t, r.StdoutTruncated)
		require.True(t, r.StderrTruncated)
		require.Equal(t, strings.Repeat("x", 4096), r.Stdout)
		require.Less(t, took, 30*time.Second)
		advServes(t, p)
	})
	t.Run("1 GiB file under a 10 MiB limit", func(t *testing.T) {
		require.NoError(t, os.Mkdir(filepath.Join(dir, "out"), 0o755))
		big := filepath.Join(dir, "out", "big")
		r := run(t, p, Job{Code: advCode(`chunk = b"x" * (1 << 20)
def write():
    with open("out/big", "wb") as f:
        for _ in range(1024):
            f.write(chunk)
attempt("write 1 GiB", write)
def sparse():
    with open("out/sparse", "wb") as f:
        f.seek(1 << 30)
        f.write(b"x")
attempt("sparse write at 1 GiB", sparse)
def grow():
    fd = os.open("out/grown", os.O_WRONLY | os.O_CREAT, 0o644)
    os.ftruncate(fd, 1 << 30)
attempt("ftruncate to 1 GiB", grow)
def falloc():
    fd = os.open("out/falloc", os.O_WRONLY | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, 1 << 30)
attempt("fallocate 1 GiB", falloc)
import resource
attempt("raise RLIMIT_FSIZE", lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 40, 1 << 40)))
`), AllowWrite: []string{"out"}, MaxFileSize: 10 << 20})
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			"write 1 GiB":           {"EFBIG"},
			"sparse write at 1 GiB": {"EFBIG"},
			"ftruncate to 1 GiB":    {"EFBIG"},
			"fallocate 1 GiB":       {"EFBIG"},
			"raise RLIMIT_FSIZE":    {"ValueError"},
		})
		for _, name := range []string{"big", "sparse", "grown", "falloc"} {
			st, err := os.Stat(filepath.Join(dir, "out", name))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			require.NoError(t, err)
			require.LessOrEqual(t, st.Size(), int64(10<<20), name)
			require.LessOrEqual(t, st.Sys().(*syscall.Stat_t).Blocks*512, int64(10<<20)+1<<20, name)
		}
		st, err := os.Stat(big)
		require.NoError(t, err)
		require.Equal(t, int64(10<<20), st.Size())
		// The uncaught form reports OSError with the errno's hint.
		r = run(t, p, Job{Code: "open('out/big2', 'wb').write(b'x' * (11 << 20))", AllowWrite: []string{"out"}, MaxFileSize: 10 << 20})
		requireErrorType(t, r, "OSError")
		require.Contains(t, r.Error.Message, "File too large")
		require.Contains(t, r.Error.Hint, "max_file_size")
		advServes(t, p)
	})
	t.Run("CPU spin ignoring signals", func(t *testing.T) {
		start := time.Now()
		r := run(t, p, Job{Code: `import signal
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGXCPU, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1):
    signal.signal(s, lambda *a: None)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT])
print("spinning", flush=True)
while True:
    pass
`, Timeout: 500 * time.Millisecond})
		took := time.Since(start)
		requireErrorType(t, r, "TimeoutError")
		require.Equal(t, -1, r.Exit)
		require.Equal(t, "spinning\n", r.Stdout)
		require.Less(t, took, 5*time.Second)
		t.Logf("CPU spin killed after %s", took)
		advServes(t, p)
	})
	st := p.Stats()
	require.Equal(t, st.Jobs, st.OK+st.Failed+st.Timeouts+st.Signals+st.RequestErrors+st.WorkerErrors+st.Cancelled)
	require.Zero(t, st.WorkerErrors)
}
