package pynox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// idleDumps lists the files of kept sessions in dir.
func idleDumps(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "pynox-session-*.dump"))
	require.NoError(t, err)
	return m
}

func TestIdleSessionKeptAndRestored(t *testing.T) {
	t.Parallel()
	dumps := t.TempDir()
	p := newTestPool(t, Config{Workers: 1, SessionIdle: 300 * time.Millisecond, SessionIdleDump: dumps})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(ctx)
	feedOK(t, co, "x = 41\ndef f():\n    return x + 1")
	pid := co.Pid()
	require.NotZero(t, pid)
	require.Eventually(t, func() bool { return len(idleDumps(t, dumps)) == 1 && co.Pid() == 0 }, 20*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return !processAlive(pid) }, 5*time.Second, 10*time.Millisecond)
	fi, err := os.Stat(idleDumps(t, dumps)[0])
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.NoError(t, co.isFinished())

	res := feedOK(t, co, "print(f())")
	require.Equal(t, "42\n", res.Stdout)
	require.True(t, res.Restored)
	require.Equal(t, 2, res.Step)
	require.Empty(t, idleDumps(t, dumps), "the file outlived its restore")
	res = feedOK(t, co, "print(x)")
	require.False(t, res.Restored)
	require.Equal(t, 3, res.Step)

	// Kept again, then finished: the file goes with the session.
	require.Eventually(t, func() bool { return len(idleDumps(t, dumps)) == 1 }, 20*time.Second, 20*time.Millisecond)
	require.NoError(t, co.Finish(ctx))
	require.Empty(t, idleDumps(t, dumps))
}

func TestIdleDumpDirOutsideGrants(t *testing.T) {
	t.Parallel()
	requireSandbox(t)
	dir := t.TempDir()
	sub := filepath.Join(dir, "dumps")
	require.NoError(t, os.Mkdir(sub, 0o700))
	for _, c := range []Config{
		{Dir: dir, SessionIdleDump: sub}, // beneath the read ceiling (Dir)
		{Dir: t.TempDir(), Limits: Limits{AllowWrite: []string{dir}}, SessionIdleDump: sub}, // beneath the write ceiling
		{Dir: t.TempDir(), SessionIdleDump: "/usr/lib"},                                     // the runtime's
		{Dir: t.TempDir(), SessionIdleDump: filepath.Join(dir, "missing")},
	} {
		c.Python = testPython()
		p, err := New(c)
		if p != nil {
			p.Close()
		}
		var ce *ConfigError
		require.True(t, errors.As(err, &ce), "%s: %v", c.SessionIdleDump, err)
		require.Equal(t, "pool.session_idle_dump", ce.Key, "%v", err)
	}
}
