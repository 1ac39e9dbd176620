package pynox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/worker"
)

// The configuration file's own errors (LoadConfig, File.Line) are
// checked in package jsonl.

// New names the setting behind each start-up failure as a ConfigError,
// so that the command can point at its flag or at the file's line.
func TestNewConfigErrorsNameTheKey(t *testing.T) {
	requireSandbox(t)
	dir := t.TempDir()
	tests := []struct {
		name    string
		cfg     Config
		key     string
		value   string
		problem string
	}{
		{"missing read ceiling", Config{Limits: Limits{AllowRead: []string{"/nonexistent"}}}, "pool.limits.allow_read", "/nonexistent", "does not exist; expected an existing file or directory"},
		{"missing write ceiling", Config{Limits: Limits{AllowWrite: []string{"nope"}}}, "pool.limits.allow_write", "nope", "does not exist"},
		{"missing package dir", Config{PackageDirs: []string{"/nonexistent"}}, "pool.package_dirs", "/nonexistent", "does not exist; expected an existing directory"},
		{"bad preload name", Config{Preload: []string{"a b"}}, "pool.preload", "a b", "expected a module name"},
		{"failing preload", Config{Preload: []string{"json", "no_such_module_x"}}, "pool.preload", "no_such_module_x", "ModuleNotFoundError"},
		{"missing python", Config{Python: "/nonexistent/python3"}, "pool.python", "/nonexistent/python3", "does not exist; expected the path or command name of a CPython 3 interpreter"},
		{"bad cgroups", Config{Cgroups: "maybe"}, "pool.cgroups", "maybe", `expected "auto", "require" or "off"`},
		{"negative workers", Config{Workers: -1}, "pool.workers", "-1", "expected a positive integer"},
		{"negative timeout", Config{Limits: Limits{Timeout: -1}}, "pool.limits.timeout", "-1", "must not be negative"},
		{"profile covering the executable", Config{Profiles: map[string]Profile{"p": {AllowWrite: []string{exeDir(t)}}}}, "profiles.p.allow_write", exeDir(t), "the pool's own executable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			c.Dir, c.Workers = dir, max(c.Workers, 1)
			if tc.cfg.Workers < 0 {
				c.Workers = tc.cfg.Workers
			}
			if c.Python == "" {
				c.Python = testPython()
			}
			p, err := New(c)
			if p != nil {
				p.Close()
			}
			var ce *ConfigError
			require.ErrorAs(t, err, &ce, "%v", err)
			require.Equal(t, tc.key, ce.Key, "%v", err)
			require.Equal(t, tc.value, ce.Value, "%v", err)
			require.Contains(t, ce.Problem, tc.problem)
			require.NotContains(t, ce.Problem, "lstat")
			require.ErrorIs(t, err, ErrSpawn)
		})
	}

	// A template's failure for want of a required PID namespace names
	// pid_namespace (the kernel here allows one, so the mapping is shown
	// on the worker's own error).
	err := startError(Config{PIDNamespace: "require"}, fmt.Errorf("start: %w: %w", worker.ErrNoPIDNamespace, errors.New("operation not permitted")))
	var ce *ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "pool.pid_namespace", ce.Key)
	require.Equal(t, "require", ce.Value)
	require.Contains(t, ce.Problem, `"auto" runs templates without one`)
}

func exeDir(t *testing.T) string {
	exe, err := os.Executable()
	require.NoError(t, err)
	exe, err = filepath.EvalSymlinks(exe)
	require.NoError(t, err)
	return filepath.Dir(exe)
}
