package pynox

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/sandbox"
)

// requireSandbox skips a test when the kernel cannot confine jobs: every
// job would then fail closed with SandboxSetupError, which other tests
// prove.
func requireSandbox(t testing.TB) {
	t.Helper()
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock, so jobs cannot run confined: %v", err)
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 on PATH")
	}
}

// Tests that call t.Parallel run together once the sequential ones have
// finished, at most GOMAXPROCS at a time. A test stays sequential when it
// counts the test process's descriptors, goroutines, children or zombies,
// makes the test process a subreaper, kills or stops templates, sets the
// environment, works on cgroups, or measures; anything else that starts
// its own pool in its own directory may run in parallel.

// longEnv names the environment variable that runs the long tests: the
// load and endurance runs, the chaos smoke run and the README's blocks.
// `go test ./...` skips them so that a developer's run stays short; CI
// (.ci/run) sets it and runs everything.
const longEnv = "PYNOX_LONG"

// requireLong skips a long test unless PYNOX_LONG=1 is set; what says
// what the test does, for the skip message.
func requireLong(t testing.TB, what string) {
	t.Helper()
	if os.Getenv(longEnv) != "1" {
		t.Skipf("%s: a long test, run with %s=1 (as .ci/run does)", what, longEnv)
	}
}

// testPython is the interpreter tests use: Debian's when present (it has
// the python3-numpy and python3-pandas packages), else the first python3.
func testPython() string {
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return ""
}

// newTestPool starts a pool whose working directory (and default read
// ceiling) is a fresh temporary directory, and closes it when the test
// ends. Unless the test sets a write ceiling, that directory is the write
// ceiling too (a pool's own default is none).
func newTestPool(t testing.TB, cfg Config) *Pool {
	t.Helper()
	requireSandbox(t)
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Limits.AllowWrite == nil {
		cfg.Limits.AllowWrite = []string{cfg.Dir}
	}
	if cfg.Python == "" {
		cfg.Python = testPython()
	}
	p, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// run runs one job with a generous overall deadline.
func run(t testing.TB, p *Pool, job Job) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := p.Run(ctx, job)
	require.NoError(t, err)
	require.NotNil(t, res)
	return res
}

// requireOK asserts a job succeeded, showing its output when it did not.
func requireOK(t testing.TB, res *Result) {
	t.Helper()
	require.Nil(t, res.Error, "error: %+v\nstderr: %s", res.Error, res.Stderr)
	require.Equal(t, 0, res.Exit, "stderr: %s", res.Stderr)
}

// requireErrorType asserts a job failed with the given error type.
func requireErrorType(t testing.TB, res *Result, typ string) {
	t.Helper()
	require.NotNil(t, res.Error, "job succeeded; stdout: %s", res.Stdout)
	require.Equal(t, typ, res.Error.Type, "message: %s\nstderr: %s", res.Error.Message, res.Stderr)
}

func processAlive(pid int) bool {
	state, _, ok := procStat(pid)
	// A zombie has finished running.
	return ok && state != "Z"
}

// procStat returns a process's state letter and parent pid from
// /proc/<pid>/stat; ok is false when the process is gone.
func procStat(pid int) (state string, ppid int, ok bool) {
	f := procStatFields(pid)
	if len(f) < 2 {
		return "", 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return f[0], ppid, err == nil
}

// procStatFields returns the fields of /proc/<pid>/stat after the command
// name (field 3, the state, first); nil when the process is gone.
func procStatFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	// The command name is in parentheses and may hold spaces.
	return strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
}

// awaitNewTemplate waits for the pool's single template to be a new one,
// replacing old, and returns its pid.
func awaitNewTemplate(t *testing.T, p *Pool, old int) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		pids := p.templatePIDs()
		if len(pids) == 1 && pids[0] != old {
			pid = pids[0]
			return true
		}
		return false
	}, 20*time.Second, 10*time.Millisecond, "no replacement template appeared")
	return pid
}
