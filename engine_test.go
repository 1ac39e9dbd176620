package pynox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

func TestRunBasics(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{})
	dir := p.cfg.Dir
	require.NoError(t, os.WriteFile(filepath.Join(dir, "app.py"), []byte("import sys\nprint('args', sys.argv[1:], __file__)\nraise ValueError('boom')\n"), 0o644))

	tests := []struct {
		name  string
		job   Job
		check func(t *testing.T, r *Result)
	}{
		{"trivial", Job{ID: "a", Code: "print(sum(range(100)))"}, func(t *testing.T, r *Result) {
			requireOK(t, r)
			require.Equal(t, "4950\n", r.Stdout)
			require.Equal(t, "a", r.ID)
			require.Equal(t, "pynox", r.Runtime.Name)
			require.Equal(t, "pool", r.Runtime.Mode)
			require.Regexp(t, `^3\.\d+\.\d+$`, r.Runtime.Python)
			require.Equal(t, "landlock+seccomp", r.Policy.Backend)
			require.Equal(t, "deny", r.Policy.Network)
			require.Equal(t, "deny", r.Policy.Subprocesses)
			require.Equal(t, int64(30000), r.Policy.TimeoutMS)
			require.Equal(t, int64(1<<30), r.Policy.MemoryBytes)
		}},
		{"exception has type, location and traceback", Job{Code: "x = 1\n\ndef f():\n    return 1/0\nf()\n", Name: "step.py"}, func(t *testing.T, r *Result) {
			requireErrorType(t, r, "ZeroDivisionError")
			require.Equal(t, 1, r.Exit)
			require.Equal(t, "step.py", *r.Error.File)
			require.Equal(t, 4, *r.Error.Line)
			require.Contains(t, r.Stderr, "Traceback (most recent call last)")
			require.Contains(t, r.Stderr, `File "step.py", line 4, in f`)
			require.Contains(t, r.Stderr, "return 1/0")
			require.NotContains(t, r.Stderr, "runner", "runner frames must not leak into tracebacks")
		}},
		{"default name", Job{Code: "raise KeyError('k')"}, func(t *testing.T, r *Result) {
			requireErrorType(t, r, "KeyError")
			require.Equal(t, DefaultName, *r.Error.File)
			require.Equal(t, 1, *r.Error.Line)
		}},
		{"syntax error", Job{Code: "def (:\n", Name: "bad.py"}, func(t *testing.T, r *Result) {
			requireErrorType(t, r, "SyntaxError")
			require.Equal(t, "bad.py", *r.Error.File)
			require.Equal(t, 1, *r.Error.Line)
			require.Contains(t, r.Stderr, "SyntaxError")
		}},
		{"sys.exit(n)", Job{Code: "import sys; print('bye'); sys.exit(7)"}, func(t *testing.T, r *Result) {
			require.Equal(t, 7, r.Exit)
			require.Nil(t, r.Error)
			require.Equal(t, "bye\n", r.Stdout)
		}},
		{"sys.exit(str)", Job{Code: "import sys; sys.exit('fatal: nope')"}, func(t *testing.T, r *Result) {
			require.Equal(t, 1, r.Exit)
			require.Equal(t, "fatal: nope\n", r.Stderr)
		}},
		{"os._exit", Job{Code: "import os; print('x', flush=True); os._exit(5)"}, func(t *testing.T, r *Result) {
			require.Equal(t, 5, r.Exit)
			require.Nil(t, r.Error)
			require.Equal(t, "x\n", r.Stdout)
		}},
		{"output at descriptor level, in order", Job{Code: "import os, sys\nprint('one')\nos.write(1, b'two\\n')\nsys.stdout.write('three\\n')\nos.write(2, b'err1\\n')\nprint('err2', file=sys.stderr)\n"}, func(t *testing.T, r *Result) {
			requireOK(t, r)
			require.Equal(t, "one\ntwo\nthree\n", r.Stdout)
			require.Equal(t, "err1\nerr2\n", r.Stderr)
		}},
		{"args and env", Job{Code: "import os, sys\nprint(sys.argv[1:], os.environ['GREETING'], os.environ.get('PATH') is not None)", Args: []string{"one", "two"}, Env: map[string]string{"GREETING": "hi"}}, func(t *testing.T, r *Result) {
			requireOK(t, r)
			require.Equal(t, "['one', 'two'] hi True\n", r.Stdout)
		}},
		{"script", Job{Script: "app.py", Args: []string{"x"}}, func(t *testing.T, r *Result) {
			requireErrorType(t, r, "ValueError")
			require.Equal(t, "args ['x'] app.py\n", r.Stdout)
			require.Equal(t, "app.py", *r.Error.File)
			require.Equal(t, 3, *r.Error.Line)
		}},
		{"numeric id echoed", Job{ID: 42, Code: "pass"}, func(t *testing.T, r *Result) {
			require.Equal(t, 42, r.ID)
		}},
		{"working directory is the pool's", Job{Code: "import os; print(os.getcwd())"}, func(t *testing.T, r *Result) {
			requireOK(t, r)
			require.Equal(t, dir+"\n", r.Stdout)
		}},
		{"unicode output", Job{Code: "print('héllo ✓ 🐍')"}, func(t *testing.T, r *Result) {
			requireOK(t, r)
			require.Equal(t, "héllo ✓ 🐍\n", r.Stdout)
		}},
		{"rlimits in force and cannot be raised", Job{Code: "import resource as r\nprint(r.getrlimit(r.RLIMIT_NOFILE), r.getrlimit(r.RLIMIT_CORE), r.getrlimit(r.RLIMIT_FSIZE), r.getrlimit(r.RLIMIT_CPU))\ntry:\n    r.setrlimit(r.RLIMIT_NOFILE, (8192, 8192))\nexcept (ValueError, OSError) as e:\n    print('refused')", MaxFileSize: 1 << 20, Timeout: 3 * time.Second}, func(t *testing.T, r *Result) {
			requireOK(t, r)
			require.Equal(t, "(4096, 4096) (0, 0) (1048576, 1048576) (4, 5)\nrefused\n", r.Stdout)
		}},
		{"imports from the stdlib work", Job{Code: "import json, decimal, sqlite3, ssl, zoneinfo, datetime\nprint(json.dumps({'a': str(decimal.Decimal('1.5'))}))"}, func(t *testing.T, r *Result) {
			requireOK(t, r)
			require.Equal(t, "{\"a\": \"1.5\"}\n", r.Stdout)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, run(t, p, tc.job))
		})
	}
}

func TestRequestErrors(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	outside := t.TempDir()
	tests := []struct {
		name string
		job  Job
		want string
	}{
		{"neither code nor script", Job{}, "exactly one of code and script"},
		{"both code and script", Job{Code: "1", Script: "a.py"}, "not both"},
		{"timeout above ceiling", Job{Code: "1", Timeout: time.Minute}, "timeout 1m0s exceeds the pool's ceiling of 30s"},
		{"memory above ceiling", Job{Code: "1", Memory: 2 << 30}, "memory 2 GiB exceeds"},
		{"max_output above ceiling", Job{Code: "1", MaxOutput: 2 << 20}, "max_output"},
		{"negative max_output", Job{Code: "1", MaxOutput: -1}, "must not be negative"},
		{"negative timeout", Job{Code: "1", Timeout: -1}, "timeout must not be negative"},
		{"negative memory", Job{Code: "1", Memory: -1}, "memory must not be negative"},
		{"negative max_file_size", Job{Code: "1", MaxFileSize: -1}, "max_file_size must not be negative"},
		{"file size above ceiling", Job{Code: "1", MaxFileSize: 1 << 30}, "max_file_size"},
		{"network not in ceiling", Job{Code: "1", AllowNetwork: true}, "allow_network"},
		{"read outside ceiling", Job{Code: "1", AllowRead: []string{"/etc"}}, "outside the pool's ceiling"},
		{"write outside ceiling", Job{Code: "1", AllowWrite: []string{outside}}, "outside the pool's ceiling"},
		{"dotdot out of ceiling", Job{Code: "1", AllowRead: []string{"../../../../../../etc"}}, "outside the pool's ceiling"},
		{"missing path", Job{Code: "1", AllowRead: []string{"nope"}}, "no such file"},
		{"script outside ceiling", Job{Script: "/etc/shadow"}, "outside the pool's ceiling"},
		{"script missing", Job{Script: "missing.py"}, "no such file"},
		{"bad env", Job{Code: "1", Env: map[string]string{"A=B": "x"}}, "env"},
		{"bad id", Job{ID: []int{1}, Code: "1"}, "id must be"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, p, tc.job)
			requireErrorType(t, r, "RequestError")
			require.Contains(t, r.Error.Message, tc.want)
			require.Equal(t, -1, r.Exit)
			require.Nil(t, r.Policy)
			require.ErrorIs(t, r.Err(), ErrRequest)
		})
	}
	// A symlink inside the ceiling that points out of it is judged by what
	// it points at.
	require.NoError(t, os.Symlink("/etc", filepath.Join(p.cfg.Dir, "etc-link")))
	r := run(t, p, Job{Code: "1", AllowRead: []string{"etc-link"}})
	requireErrorType(t, r, "RequestError")
	require.Contains(t, r.Error.Message, "/etc is outside")
	// The pool still serves.
	requireOK(t, run(t, p, Job{Code: "pass"}))
}

func TestFilesystemConfinement(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{})
	dir := p.cfg.Dir
	for _, d := range []string{"data", "out", "secret"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "in.txt"), []byte("input"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "secret", "key.txt"), []byte("hunter2"), 0o644))

	t.Run("etc/passwd denied with hint", func(t *testing.T) {
		r := run(t, p, Job{Code: "print(open('/etc/passwd').read())"})
		requireErrorType(t, r, "PermissionError")
		require.Contains(t, r.Error.Hint, "/etc/passwd is outside the pool's ceiling")
		require.Empty(t, r.Stdout)
	})
	t.Run("ungranted file in the working directory denied with hint", func(t *testing.T) {
		r := run(t, p, Job{Code: "print(open('secret/key.txt').read())"})
		requireErrorType(t, r, "PermissionError")
		require.Contains(t, r.Error.Hint, `"allow_read": ["secret/key.txt"]`)
		require.NotContains(t, r.Stdout, "hunter2")
	})
	t.Run("listing the working directory denied", func(t *testing.T) {
		r := run(t, p, Job{Code: "import os; print(os.listdir('.'))"})
		requireErrorType(t, r, "PermissionError")
	})
	t.Run("read grant", func(t *testing.T) {
		r := run(t, p, Job{Code: "print(open('data/in.txt').read())", AllowRead: []string{"data"}})
		requireOK(t, r)
		require.Equal(t, "input\n", r.Stdout)
		require.Equal(t, []string{filepath.Join(dir, "data")}, r.Policy.AllowRead)
	})
	t.Run("read grant does not allow writing", func(t *testing.T) {
		r := run(t, p, Job{Code: "open('data/new.txt', 'w').write('x')", AllowRead: []string{"data"}})
		requireErrorType(t, r, "PermissionError")
		require.Contains(t, r.Error.Hint, "allow_write")
		require.NoFileExists(t, filepath.Join(dir, "data", "new.txt"))
	})
	t.Run("write grant", func(t *testing.T) {
		r := run(t, p, Job{Code: "import os\nopen('out/r.txt', 'w').write('result')\nos.mkdir('out/sub')\nos.rename('out/r.txt', 'out/sub/r.txt')\nprint(open('out/sub/r.txt').read())", AllowWrite: []string{"out"}})
		requireOK(t, r)
		require.Equal(t, "result\n", r.Stdout)
		b, err := os.ReadFile(filepath.Join(dir, "out", "sub", "r.txt"))
		require.NoError(t, err)
		require.Equal(t, "result", string(b))
		require.Equal(t, []string{filepath.Join(dir, "out")}, r.Policy.AllowWrite)
	})
	t.Run("writes outside allow_write denied", func(t *testing.T) {
		unique := fmt.Sprintf("pynox-escape-%d-%d", os.Getpid(), time.Now().UnixNano())
		for _, target := range []string{"/tmp/" + unique, filepath.Join(dir, "escape.txt"), "/dev/shm/" + unique, filepath.Join(dir, "data", "x")} {
			r := run(t, p, Job{Code: fmt.Sprintf("open(%q, 'w').write('x')", target), AllowWrite: []string{"out"}})
			requireErrorType(t, r, "PermissionError")
			require.NoFileExists(t, target)
		}
	})
	t.Run("the stdlib cannot be overwritten", func(t *testing.T) {
		r := run(t, p, Job{Code: "import os\nopen(os.__file__, 'a').write('#')"})
		requireErrorType(t, r, "PermissionError")
	})
	t.Run("dev/null works", func(t *testing.T) {
		r := run(t, p, Job{Code: "open('/dev/null', 'w').write('x'); print(len(open('/dev/urandom', 'rb').read(8)))"})
		requireOK(t, r)
		require.Equal(t, "8\n", r.Stdout)
	})
}

func TestProcessesDenied(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{})
	tests := []struct {
		name string
		code string
	}{
		{"os.system", "import os\nrc = os.system('echo pwned > /dev/null')\nassert rc != 0, rc\nraise PermissionError('system failed as it should: %d' % rc)"},
		{"subprocess", "import subprocess\nsubprocess.run(['/bin/true'])"},
		{"os.fork", "import os\nos.fork()"},
		{"os.execv", "import os\nos.execv('/bin/true', ['true'])"},
		{"os.posix_spawn", "import os\nos.posix_spawn('/bin/true', ['true'], {})"},
		{"multiprocessing", "import multiprocessing as mp\np = mp.Process(target=print)\np.start()"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, p, Job{Code: tc.code})
			require.NotNil(t, r.Error, "stdout: %s", r.Stdout)
			require.NotEqual(t, 0, r.Exit)
			require.Contains(t, []string{"PermissionError", "OSError"}, r.Error.Type, "%s: %s", r.Error.Type, r.Error.Message)
		})
	}
	requireOK(t, run(t, p, Job{Code: "pass"}))
}

func TestNetworkDenied(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	code := fmt.Sprintf("import socket\ns = socket.create_connection(('127.0.0.1', %d), timeout=2)\nprint('connected')", port)

	p := newTestPool(t, Config{})
	r := run(t, p, Job{Code: code})
	requireErrorType(t, r, "PermissionError")
	require.Contains(t, r.Error.Hint, "allow_network")
	select {
	case <-accepted:
		t.Fatal("the listener saw a connection from a job without the network")
	case <-time.After(200 * time.Millisecond):
	}

	// Positive control: with the network in the ceiling and the request,
	// the same code connects, so the denial above is the sandbox's doing.
	pn := newTestPool(t, Config{Workers: 1, Limits: Limits{AllowNetwork: true}})
	r = run(t, pn, Job{Code: code, AllowNetwork: true})
	requireOK(t, r)
	require.Equal(t, "allow", r.Policy.Network)
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the listener saw nothing from a job granted the network")
	}
	// Granted the network, a job still cannot open unix or raw sockets.
	r = run(t, pn, Job{Code: "import socket\nsocket.socket(socket.AF_UNIX)", AllowNetwork: true})
	requireErrorType(t, r, "PermissionError")
}

func TestEnvironmentIsolated(t *testing.T) {
	t.Setenv("PYNOX_TEST_SECRET", "hunter2-secret")
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Code: "import os\nprint(sorted(os.environ))\nprint('hunter2' in repr(dict(os.environ)))"})
	requireOK(t, r)
	require.NotContains(t, r.Stdout, "PYNOX_TEST_SECRET")
	require.Contains(t, r.Stdout, "False")

	r = run(t, p, Job{Code: "print(open('/proc/self/environ', 'rb').read())"})
	require.NotContains(t, r.Stdout, "hunter2")
	require.NotNil(t, r.Error, "reading /proc must be denied")

	// The template itself was started with a clean environment, so nothing
	// the job inherits holds the secret either.
	for _, pid := range p.templatePIDs() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		require.NoError(t, err)
		require.NotContains(t, string(b), "hunter2")
	}
}

func TestTimeoutAndRecovery(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	start := time.Now()
	r := run(t, p, Job{Code: "print('started', flush=True)\nwhile True:\n    pass", Timeout: 300 * time.Millisecond})
	requireErrorType(t, r, "TimeoutError")
	require.ErrorIs(t, r.Err(), ErrTimeout)
	require.Equal(t, -1, r.Exit)
	require.Equal(t, "started\n", r.Stdout, "output before the timeout is kept")
	require.Less(t, time.Since(start), 10*time.Second)
	requireOK(t, run(t, p, Job{Code: "print('next')"}))

	// A job that ignores signals and sleeps is still killed.
	r = run(t, p, Job{Code: "import signal, time\nfor s in (signal.SIGTERM, signal.SIGINT):\n    signal.signal(s, signal.SIG_IGN)\ntime.sleep(60)", Timeout: 200 * time.Millisecond})
	requireErrorType(t, r, "TimeoutError")
	requireOK(t, run(t, p, Job{Code: "pass"}))
	st := p.Stats()
	require.Equal(t, int64(2), st.Timeouts)
}

func TestMemoryLimit(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Code: "x = bytearray(512 * 1024 * 1024)\nprint(len(x))", Memory: 256 << 20})
	requireErrorType(t, r, "MemoryError")
	require.Contains(t, r.Error.Hint, "256 MiB")
	require.Contains(t, r.Error.Hint, "1 GiB")
	// Within the allowance the same allocation works.
	r = run(t, p, Job{Code: "x = bytearray(200 * 1024 * 1024)\nprint(len(x))", Memory: 256 << 20})
	requireOK(t, r)
}

func TestFileSizeLimit(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	require.NoError(t, os.Mkdir(filepath.Join(p.cfg.Dir, "out"), 0o755))
	r := run(t, p, Job{Code: "f = open('out/big', 'wb')\nf.write(b'x' * (2 * 1024 * 1024))\nf.flush()", AllowWrite: []string{"out"}, MaxFileSize: 1 << 20})
	require.NotNil(t, r.Error)
	require.Equal(t, "OSError", r.Error.Type)
	require.Contains(t, r.Error.Message, "File too large")
	require.Contains(t, r.Error.Hint, "max_file_size")
	st, err := os.Stat(filepath.Join(p.cfg.Dir, "out", "big"))
	require.NoError(t, err)
	require.LessOrEqual(t, st.Size(), int64(1<<20))
}

func TestSignalError(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Code: "import ctypes\nctypes.string_at(0)"})
	requireErrorType(t, r, "SignalError")
	require.Contains(t, r.Error.Message, "SIGSEGV")
	require.ErrorIs(t, r.Err(), ErrSignal)
	requireOK(t, run(t, p, Job{Code: "print('still serving')"}))
	r = run(t, p, Job{Code: "import os, signal\nos.kill(os.getpid(), signal.SIGABRT)"})
	requireErrorType(t, r, "SignalError")
	require.Contains(t, r.Error.Message, "SIGABRT")
}

func TestOutputCap(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	start := time.Now()
	r := run(t, p, Job{Code: "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)\nprint('é' * 10, file=sys.stderr)", MaxOutput: 1000})
	requireOK(t, r)
	require.Len(t, r.Stdout, 1000)
	require.True(t, r.StdoutTruncated)
	require.False(t, r.StderrTruncated)
	require.Less(t, time.Since(start), 20*time.Second)
	// A cut inside a multi-byte character drops the partial character.
	r = run(t, p, Job{Code: "print('é' * 10)", MaxOutput: 5})
	require.Equal(t, "éé", r.Stdout)
	require.True(t, r.StdoutTruncated)
}

func TestForgedFramesReachNobody(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	// Every shape of frame the pool's channels use, written to every
	// descriptor the job can reach.
	code := `import os, struct, json
forgeries = []
for obj in ({"t": "done", "exit": 0, "error": None}, {"t": "spare", "pid": 1},
            {"t": "exit", "pid": os.getppid(), "code": 0}, {"t": "call", "call_id": 1, "function": "rm"},
            {"id": "victim", "exit": 0, "stdout": "forged", "error": None}):
    data = json.dumps(obj).encode()
    forgeries += [data, data + b"\n", struct.pack("<I", len(data)) + data]
hit = 0
for fd in range(0, 1024):
    if fd in (1, 2):
        continue
    for f in forgeries:
        try:
            os.write(fd, f)
            hit += 1
        except OSError:
            pass
print("wrote", hit)
`
	var wg sync.WaitGroup
	results := make([]*Result, 6)
	for i := range results {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results[i] = run(t, p, Job{ID: i, Code: code})
		}(i)
	}
	wg.Wait()
	for i, r := range results {
		require.Equal(t, i, r.ID)
		require.NotContains(t, r.Stdout, "forged")
		// The job may only have lied about itself: whatever it reported, it
		// is its own result and nothing else's.
		if r.Error != nil {
			require.Equal(t, "PoolWorkerError", r.Error.Type, "%+v", r.Error)
		}
	}
	// The pool is intact and serves correct results.
	for i := 0; i < 4; i++ {
		r := run(t, p, Job{ID: "after", Code: "print('clean')"})
		requireOK(t, r)
		require.Equal(t, "clean\n", r.Stdout)
	}
	// Garbage on the control channel is a protocol violation, contained.
	r := run(t, p, Job{Code: "import os\nos.write(3, b'\\xff' * 64)\nimport time; time.sleep(1)"})
	requireErrorType(t, r, "PoolWorkerError")
	require.Contains(t, r.Error.Message, "control protocol")
	requireOK(t, run(t, p, Job{Code: "pass"}))
}

func TestConcurrentJobsAnsweredOnce(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	const n = 60
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[int]int{}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r := run(t, p, Job{ID: i, Code: fmt.Sprintf("print(%d * 2)", i)})
			requireOK(t, r)
			require.Equal(t, fmt.Sprintf("%d\n", i*2), r.Stdout)
			mu.Lock()
			seen[r.ID.(int)]++
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	require.Len(t, seen, n)
	for id, c := range seen {
		require.Equal(t, 1, c, "id %d answered %d times", id, c)
	}
	st := p.Stats()
	require.Equal(t, int64(n), st.Jobs)
	require.Equal(t, int64(n), st.OK)
}

func TestTemplateKilled(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	requireOK(t, run(t, p, Job{Code: "pass"}))

	// Killed while idle: replaced before the next job.
	pids := p.templatePIDs()
	require.Len(t, pids, 1)
	require.NoError(t, syscall.Kill(pids[0], syscall.SIGKILL))
	// The replacement starts at once, not when the next job arrives.
	newPids := []int{awaitNewTemplate(t, p, pids[0])}
	r := run(t, p, Job{Code: "print('after idle kill')"})
	requireOK(t, r)

	// Killed mid-job: that job is a PoolWorkerError, the next one runs.
	done := make(chan *Result)
	go func() { done <- run(t, p, Job{Code: "import time\nprint('running', flush=True)\ntime.sleep(30)"}) }()
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, syscall.Kill(newPids[0], syscall.SIGKILL))
	r = <-done
	requireErrorType(t, r, "PoolWorkerError")
	require.ErrorIs(t, r.Err(), ErrCrashed)
	requireOK(t, run(t, p, Job{Code: "print('after busy kill')"}))
	require.False(t, processAlive(newPids[0]))
}

func TestCancellation(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	res, err := p.Run(ctx, Job{Code: "import time; time.sleep(30)"})
	require.Nil(t, res)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	requireOK(t, run(t, p, Job{Code: "pass"}))
}

func TestClosedPool(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	require.NoError(t, p.Close())
	_, err := p.Run(context.Background(), Job{Code: "pass"})
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, p.Close())
}

func TestPythonFromPath(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandbox(t)
	// The default interpreter is the first python3 on PATH, even when that
	// is a launcher script such as a pyenv shim.
	python, err := FindPython("")
	require.NoError(t, err)
	require.True(t, isELF(python), python)
	p := newTestPool(t, Config{Workers: 1, Python: "python3"})
	r := run(t, p, Job{Code: "import sys; print(sys.version_info[0])"})
	requireOK(t, r)
	require.Equal(t, "3\n", r.Stdout)
	require.True(t, strings.HasPrefix(r.Runtime.Python, "3."))
}

func TestSandboxSetupFailsClosed(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	require.NoError(t, os.Mkdir(filepath.Join(p.cfg.Dir, "out"), 0o755))
	pid := p.templatePIDs()[0]
	// A real kernel refusal: lower the template's hard address-space limit
	// so that the spares it forks from now on cannot set a job's memory
	// rlimit (raising a hard limit needs CAP_SYS_RESOURCE, which a spare has
	// dropped). That confinement step fails, so no user code may run.
	var cur unix.Rlimit
	require.NoError(t, unix.Prlimit(pid, unix.RLIMIT_AS, nil, &cur))
	statm, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	require.NoError(t, err)
	var pages int64
	_, err = fmt.Sscan(string(statm), &pages)
	require.NoError(t, err)
	low := uint64(pages*int64(os.Getpagesize())) + 64<<20
	require.NoError(t, unix.Prlimit(pid, unix.RLIMIT_AS, &unix.Rlimit{Cur: low, Max: low}, nil))

	job := Job{Code: "open('out/marker', 'w').write('ran')", AllowWrite: []string{"out"}}
	// The spare forked before the change may still run one job normally.
	first := run(t, p, job)
	marker := filepath.Join(p.cfg.Dir, "out", "marker")
	if first.Error == nil {
		require.NoError(t, os.Remove(marker))
	}
	r := run(t, p, job)
	requireErrorType(t, r, "SandboxSetupError")
	require.ErrorIs(t, r.Err(), ErrSandboxSetup)
	require.Contains(t, r.Error.Message, "no code ran")
	require.Equal(t, -1, r.Exit)
	require.NoFileExists(t, marker, "user code ran although confinement failed")
	require.Equal(t, p.Stats().Errors["SandboxSetupError"], p.Stats().WorkerErrors)
}

// System V IPC, message queues and inotify reach past Landlock's view of
// the filesystem; scheduling calls could slow other processes of the uid.
func TestIPCAndSchedulingOfOthersDenied(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	code := fmt.Sprintf(`import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(rc):
    return 0 if rc >= 0 else ctypes.get_errno()
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
print("shmget", errno_of(libc.shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0o600)))
print("msgget", errno_of(libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600)))
print("semget", errno_of(libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o600)))
print("mq_open", errno_of(libc.syscall(%d, b"pynox", 0o100, 0o600, None)))
print("renice pool", errno_of(libc.setpriority(0, %d, 19)))
print("renice uid", errno_of(libc.setpriority(2, 0, 19)))
print("renice self", errno_of(libc.setpriority(0, 0, 5)))
print("inotify_init1", errno_of(libc.inotify_init1(0)))
print("inotify_add_watch", errno_of(libc.inotify_add_watch(0, b"/tmp", 0xfff)))
`, unix.SYS_MQ_OPEN, os.Getpid())
	r := run(t, p, Job{Code: code})
	requireOK(t, r)
	require.Equal(t, "shmget 1\nmsgget 1\nsemget 1\nmq_open 1\nrenice pool 1\nrenice uid 1\nrenice self 0\ninotify_init1 1\ninotify_add_watch 1\n", r.Stdout)
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	require.NoError(t, err)
	require.Equal(t, 20, prio, "the pool's own priority is unchanged")
}

func TestBellAbuse(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	// A job that closes the descriptor it rings the host with still gets
	// its result, found by polling its control socket.
	r := run(t, p, Job{Code: "import os, time\nos.close(4)\ntime.sleep(0.05)\nprint('still answered')"})
	requireOK(t, r)
	require.Equal(t, "still answered\n", r.Stdout)
	// One that rings without cause is ended as a protocol break once its
	// rings outnumber its frames (hostile_worker_test.go floods it).
	r = run(t, p, Job{Code: "import os\nfor _ in range(100000):\n    os.write(4, b'!')\nprint('rang')"})
	requireErrorType(t, r, "PoolWorkerError")
	require.Contains(t, r.Error.Message, "rang its bell")
	// A crash after closing it is still seen.
	r = run(t, p, Job{Code: "import os, ctypes\nos.close(4)\nctypes.string_at(0)"})
	requireErrorType(t, r, "SignalError")
	requireOK(t, run(t, p, Job{Code: "pass"}))
}

func TestOldPythonRefused(t *testing.T) {
	t.Parallel()
	requireSandbox(t)
	old := "/root/.pyenv/versions/3.8.18/bin/python3"
	if _, err := os.Stat(old); err != nil {
		t.Skipf("no CPython 3.8 at %s to try", old)
	}
	_, err := New(Config{Workers: 1, Dir: t.TempDir(), Python: old})
	require.ErrorIs(t, err, ErrSpawn)
	require.ErrorContains(t, err, "pynox needs CPython 3.9 or newer")
}

// Every CPython from 3.9 on that the machine has runs confined jobs.
func TestPythonVersions(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandbox(t)
	found, _ := filepath.Glob("/root/.pyenv/versions/3.*/bin/python3")
	if len(found) == 0 {
		t.Skip("no pyenv CPython versions on this machine")
	}
	newest := 0 // the newest minor version found; the quick run tries 3.9 and it
	for _, py := range found {
		var minor int
		if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(filepath.Dir(py))), "3.%d", &minor); err == nil {
			newest = max(newest, minor)
		}
	}
	for _, py := range found {
		version := filepath.Base(filepath.Dir(filepath.Dir(py)))
		t.Run(version, func(t *testing.T) {
			var major, minor int
			_, err := fmt.Sscanf(version, "%d.%d", &major, &minor)
			require.NoError(t, err)
			if minor < 9 {
				t.Skipf("CPython %s is older than the 3.9 pynox needs (TestOldPythonRefused covers it)", version)
			}
			if minor != 9 && minor != newest {
				requireLong(t, "the versions between 3.9 and the newest")
			}
			p := newTestPool(t, Config{Workers: 1, Python: py})
			r := run(t, p, Job{Code: "import sys; print('%d.%d' % sys.version_info[:2])"})
			requireOK(t, r)
			require.Equal(t, fmt.Sprintf("%d.%d\n", major, minor), r.Stdout)
			requireErrorType(t, run(t, p, Job{Code: "open('/etc/passwd')"}), "PermissionError")
			requireErrorType(t, run(t, p, Job{Code: "import os; os.fork()"}), "PermissionError")
			requireErrorType(t, run(t, p, Job{Code: "while True: pass", Timeout: 200 * time.Millisecond}), "TimeoutError")
		})
	}
}

func TestWedgedTemplateReplaced(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 1})
	p.spareTimeout = time.Second
	// Replace the template so that its successor carries the short timeout.
	old := p.templatePIDs()[0]
	require.NoError(t, syscall.Kill(old, syscall.SIGKILL))
	pid := awaitNewTemplate(t, p, old)
	// Stop it so that it forks no more (it is wedged), then use up the spare
	// it already has: the next job finds no spare.
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	defer syscall.Kill(pid, syscall.SIGKILL)
	requireOK(t, run(t, p, Job{Code: "pass"}))
	r := run(t, p, Job{Code: "print('served')"})
	requireOK(t, r)
	require.Equal(t, "served\n", r.Stdout)
	require.NotContains(t, p.templatePIDs(), pid)
}

// panicOnce is a slog handler whose first job record panics.
type panicOnce struct{ done atomic.Bool }

func (h *panicOnce) Enabled(context.Context, slog.Level) bool { return true }
func (h *panicOnce) Handle(context.Context, slog.Record) error {
	if h.done.CompareAndSwap(false, true) {
		panic("logger failed")
	}
	return nil
}
func (h *panicOnce) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *panicOnce) WithGroup(string) slog.Handler      { return h }

// TestPanicKeepsSpares: a panic after a job (here, in the caller's logger)
// still asks for the template's next spare, so the next job does not wait
// for a template declared wedged.
func TestPanicKeepsSpares(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, Logger: slog.New(&panicOnce{})})
	func() {
		defer func() { require.NotNil(t, recover(), "the logger's panic reaches the caller") }()
		run(t, p, Job{Code: "print(1)"})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := p.Run(ctx, Job{Code: "print(2)"})
	require.NoError(t, err, "the next job found no spare")
	requireOK(t, res)
	require.Equal(t, "2\n", res.Stdout)
}

// TestSeccompLayers checks where each seccomp layer lives: a template runs
// under the template layer alone (with no capabilities and no_new_privs),
// and a job's process under the template layer and its own job layer.
func TestSeccompLayers(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	requireOK(t, run(t, p, Job{Code: "pass"}))
	status := func(pid int) string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		require.NoError(t, err)
		return string(b)
	}
	pids := p.templatePIDs()
	require.Len(t, pids, 1)
	tpl := status(pids[0])
	if !strings.Contains(tpl, "Seccomp_filters:") {
		t.Skip("this kernel's /proc/<pid>/status has no Seccomp_filters line (Linux < 5.9)")
	}
	for _, want := range []string{"Seccomp:\t2\n", "Seccomp_filters:\t1\n", "NoNewPrivs:\t1\n", "CapEff:\t0000000000000000\n"} {
		require.Contains(t, tpl, want, "template")
	}

	// A live job process: a session's, stopped between its steps.
	co := checkout(t, p, Job{})
	requireOK(t, feed(t, co, "x = 1"))
	job := status(co.Pid())
	for _, want := range []string{"Seccomp:\t2\n", "Seccomp_filters:\t2\n", "NoNewPrivs:\t1\n", "CapEff:\t0000000000000000\n"} {
		require.Contains(t, job, want, "job")
	}
}

// TestNoWarmUpTraces checks that the dummy jobs the template and the spare
// run through the job path before any real job (see rehearse in runner.py)
// leave nothing a job can see: no globals, no cached source, no exception,
// the job's own argv.
func TestNoWarmUpTraces(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	code := "import sys, linecache\n" +
		"print(sorted(k for k in globals() if not k.startswith('__') and k not in ('sys', 'linecache')))\n" +
		"print(sorted(linecache.cache))\n" +
		"print(hasattr(sys, 'last_value'), sys.exc_info()[0], sys.argv)\n" +
		"print(__name__, sys.modules['__main__'].__dict__ is globals())\n"
	for i := 0; i < 2; i++ { // a spare's first job, and the next spare's
		r := run(t, p, Job{Code: code, Name: "job.py", Args: []string{"a"}})
		requireOK(t, r)
		require.Equal(t, "[]\n['job.py']\nFalse None ['job.py', 'a']\n__main__ True\n", r.Stdout)
	}
}
