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

func TestEvictIdleLRU(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, MaxSessions: 2, EvictIdle: true})
	ctx := context.Background()
	fn := Job{Functions: []string{"f"}}
	a, err := p.Checkout(ctx, fn)
	require.NoError(t, err)
	b, err := p.Checkout(ctx, fn)
	require.NoError(t, err)
	feedOK(t, a, "x = 1")
	feedOK(t, b, "y = 2")
	feedOK(t, a, "x += 1") // b is now the least recently used
	c, err := p.Checkout(ctx, fn)
	require.NoError(t, err)
	_, err = b.Feed(ctx, Step{Code: "1"})
	require.ErrorIs(t, err, ErrFinished)
	require.Contains(t, err.Error(), "evicted")
	require.Equal(t, "2\n", feedOK(t, a, "print(x)").Stdout)

	// A session whose host call waits for Resume is not idle: a, the
	// least recently used, waits, so c goes.
	feedOK(t, c, "z = 3")
	ev, err := a.Feed(ctx, Step{Code: "import pynox_host\npynox_host.f()"})
	require.NoError(t, err)
	require.NotNil(t, ev.Call)
	d, err := p.Checkout(ctx, fn)
	require.NoError(t, err)
	_, err = c.Feed(ctx, Step{Code: "1"})
	require.ErrorIs(t, err, ErrFinished)

	// With every session busy, a new one is refused as without eviction.
	ev2, err := d.Feed(ctx, Step{Code: "import pynox_host\npynox_host.f()"})
	require.NoError(t, err)
	require.NotNil(t, ev2.Call)
	_, err = p.Checkout(ctx, fn)
	require.ErrorIs(t, err, ErrExhausted)
	ev, err = a.Resume(ctx, ev.Call.ID, Return(1))
	require.NoError(t, err)
	requireOK(t, ev.Result)
	ev2, err = d.Resume(ctx, ev2.Call.ID, Return(1))
	require.NoError(t, err)
	requireOK(t, ev2.Result)
}
