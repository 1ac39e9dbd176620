package jsonl

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
)

// The helpers every package's tests share (internal/testenv).
var (
	requireSandbox = testenv.RequireSandbox
	requireLong    = testenv.RequireLong
	testPython     = testenv.Python
	processAlive   = testenv.ProcessAlive
	procStat       = testenv.ProcStat
	advSteadyFDs   = testenv.SteadyFDs
	advFDs         = testenv.FDs
)

// The helpers below are those of the root package's tests, reaching the
// pool through its public API only.

// newTestPool starts a pool whose working directory (and default read
// ceiling) is a fresh temporary directory, and closes it when the test
// ends. Unless the test sets a write ceiling, that directory is the write
// ceiling too.
func newTestPool(t testing.TB, cfg pynox.Config) *pynox.Pool {
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
	p, err := pynox.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// run runs one job with a generous overall deadline.
func run(t testing.TB, p *pynox.Pool, job pynox.Job) *pynox.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := p.Run(ctx, job)
	require.NoError(t, err)
	require.NotNil(t, res)
	return res
}

// requireOK asserts a job succeeded, showing its output when it did not.
func requireOK(t testing.TB, res *pynox.Result) {
	t.Helper()
	require.Nil(t, res.Error, "error: %+v\nstderr: %s", res.Error, res.Stderr)
	require.Equal(t, 0, res.Exit, "stderr: %s", res.Stderr)
}

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	return path
}

// poolProcesses returns the pids of the pool's templates and their
// children: the processes whose working directory is the pool's (each
// test pool has a directory of its own).
func poolProcesses(t testing.TB, p *pynox.Pool) []int {
	t.Helper()
	dir := p.Config().Dir
	var out []int
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd"); err == nil && cwd == dir {
			out = append(out, pid)
		}
	}
	return out
}

// templatePIDs returns the pids of the pool's live templates: its
// processes that are children of this one.
func templatePIDs(t testing.TB, p *pynox.Pool) []int {
	t.Helper()
	var pids []int
	for _, pid := range poolProcesses(t, p) {
		if state, ppid, ok := procStat(pid); ok && ppid == os.Getpid() && state != "Z" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// advServes asserts that the pool still serves a normal job correctly.
func advServes(t *testing.T, p *pynox.Pool) {
	t.Helper()
	r := run(t, p, pynox.Job{ID: "control", Code: "print(6 * 7)"})
	requireOK(t, r)
	require.Equal(t, "42\n", r.Stdout)
}

// advWarm runs a job on every worker at once, so that each template has
// its next spare (whose descriptors the host holds) in hand, and returns
// the host's descriptor count once it is steady.
func advWarm(t testing.TB, p *pynox.Pool) int {
	t.Helper()
	var wg sync.WaitGroup
	for i := 0; i < p.Workers(); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := run(t, p, pynox.Job{Code: "import time; time.sleep(0.05)"})
			requireOK(t, r)
		}()
	}
	wg.Wait()
	return advSteadyFDs(t)
}

func feed(t *testing.T, co *pynox.Checkout, code string) *pynox.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ev, err := co.Feed(ctx, pynox.Step{Code: code})
	require.NoError(t, err)
	require.NotNil(t, ev.Result, "got a call event: %+v", ev.Call)
	return ev.Result
}

func checkout(t testing.TB, p *pynox.Pool, job pynox.Job) *pynox.Checkout {
	t.Helper()
	co, err := p.Checkout(context.Background(), job)
	require.NoError(t, err)
	t.Cleanup(func() { co.Finish(context.Background()) })
	return co
}

// requireErrorType requires that the job failed with error type typ.
func requireErrorType(t testing.TB, res *pynox.Result, typ string) {
	t.Helper()
	require.NotNil(t, res.Error, "job succeeded; stdout: %s", res.Stdout)
	require.Equal(t, typ, res.Error.Type, "message: %s\nstderr: %s", res.Error.Message, res.Stderr)
}
