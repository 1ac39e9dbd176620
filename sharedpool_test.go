package pynox

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// sharedPools are the package's shared test pools, one per configuration
// (sharedTestPool), each started by the first test that asks for it and
// closed by TestMain after the tests and examples (CloseSharedTestPools).
var sharedPools struct {
	mu    sync.Mutex
	pools map[int]*Pool
	dirs  []string
}

// sharedTestPool returns the package's one pool of cfg, a plain
// configuration that sets nothing but Workers, made as newTestPool makes
// it (its own fresh directory as working directory and write ceiling,
// the tests' interpreter) and shared by every test that asks for it.
// Starting a pool costs ~75 ms of CPU and a template's start-up; a test
// that only runs its own jobs and sessions on a plain pool uses this one.
//
// A test may share it only if nothing it checks depends on the other
// tests' jobs: it must not kill, stop or count templates or processes,
// read the pool's Stats, metrics, configuration or directory, fill a
// limit (sessions, workers), close the pool, or run jobs that hold the
// pool's workers for long. Its jobs may still be hostile: a job that
// reached another test's job would be the bug the hostile tests look
// for. Tests that call it must call t.Parallel first (the pool is then
// made after the sequential tests, which count descriptors and children).
func sharedTestPool(t testing.TB, cfg Config) *Pool {
	t.Helper()
	requireSandbox(t)
	require.Equal(t, Config{Workers: cfg.Workers}, cfg, "a shared pool's configuration sets Workers only")
	sharedPools.mu.Lock()
	defer sharedPools.mu.Unlock()
	if p := sharedPools.pools[cfg.Workers]; p != nil {
		return p
	}
	dir, err := os.MkdirTemp("", "pynox-shared-pool")
	require.NoError(t, err)
	sharedPools.dirs = append(sharedPools.dirs, dir)
	dir, err = filepath.EvalSymlinks(dir)
	require.NoError(t, err)
	p, err := New(Config{Workers: cfg.Workers, Dir: dir, Python: testPython(), Limits: Limits{AllowWrite: []string{dir}}})
	require.NoError(t, err)
	if sharedPools.pools == nil {
		sharedPools.pools = map[int]*Pool{}
	}
	sharedPools.pools[cfg.Workers] = p
	return p
}

// CloseSharedTestPools closes the pools sharedTestPool started and
// removes their directories. The package's TestMain calls it after
// m.Run.
func CloseSharedTestPools() {
	sharedPools.mu.Lock()
	defer sharedPools.mu.Unlock()
	for _, p := range sharedPools.pools {
		p.Close()
	}
	for _, d := range sharedPools.dirs {
		os.RemoveAll(d)
	}
	sharedPools.pools, sharedPools.dirs = nil, nil
}
