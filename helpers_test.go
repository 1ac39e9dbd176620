package pynox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// The helpers every package's tests share (internal/testenv).
var (
	requireSandbox = testenv.RequireSandbox
	requireLong    = testenv.RequireLong
	testPython     = testenv.Python
	processAlive   = testenv.ProcessAlive
	procStat       = testenv.ProcStat
	procStatFields = testenv.ProcStatFields
	advSteadyFDs   = testenv.SteadyFDs
	advFDs         = testenv.FDs
)

// Tests that call t.Parallel run together once the sequential ones have
// finished, at most max(GOMAXPROCS, testenv.MinParallel) at a time (TestMain's
// testenv.RaiseParallel; -parallel overrides it). A test stays sequential when it
// counts the test process's descriptors, goroutines, children or zombies,
// makes the test process a subreaper, kills or stops templates, sets the
// environment, works on cgroups, or measures; anything else that starts
// its own pool in its own directory may run in parallel.

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
