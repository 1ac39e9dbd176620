package jsonl

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

func TestJSONLDumpRestore(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": 1, "session": "a", "code": "def f(x):\n    return x * k\nk = 3\ng = (i for i in [])"}`)
	require.Nil(t, ls.await(1)["error"])
	ls.send(`{"id": 2, "session": "a", "dump": true}`)
	d := ls.await(2)
	require.Equal(t, "a", d["session"])
	require.Equal(t, []any{"g"}, d["skipped"])
	require.Equal(t, "1", fmt.Sprint(d["steps"]))
	dump, ok := d["dump"].(string)
	require.True(t, ok, "%v", d)
	raw, err := base64.StdEncoding.DecodeString(dump)
	require.NoError(t, err)
	require.NotEmpty(t, raw)

	// The dumped session keeps running.
	ls.send(`{"id": 3, "session": "a", "code": "print(f(2))"}`)
	r := ls.await(3)
	require.Equal(t, "6\n", r["stdout"])
	require.Equal(t, "2", fmt.Sprint(r["step"]))

	// A new session created from the dump.
	ls.send(`{"id": 4, "session": "b", "restore": "` + dump + `", "code": "print(f(5), 'g' in globals())"}`)
	r = ls.await(4)
	require.Nil(t, r["error"], "%v", r)
	require.Equal(t, "15 False\n", r["stdout"])
	require.Equal(t, "2", fmt.Sprint(r["step"]))
	require.Equal(t, "b", r["session"])

	// Refusals name what is wrong.
	ls.send(`{"id": 5, "session": "a", "restore": "` + dump + `", "code": "1"}`)
	require.Contains(t, ls.await(5)["error"].(map[string]any)["message"], "restore")
	ls.send(`{"id": 6, "session": "c", "restore": "bm90IGEgZHVtcA==", "code": "1"}`)
	require.Contains(t, ls.await(6)["error"].(map[string]any)["message"], "not a pynox session dump")
	ls.send(`{"id": 7, "session": "nope", "dump": true}`)
	require.Contains(t, ls.await(7)["error"].(map[string]any)["message"], `no session named "nope" is open`)
	ls.send(`{"id": 8, "session": "a", "dump": true, "code": "1"}`)
	require.Contains(t, ls.await(8)["error"].(map[string]any)["message"], "a dump request takes no other fields")
	ls.send(`{"id": 9, "session": "c", "restore": "%%%", "code": "1"}`)
	require.Contains(t, ls.await(9)["error"].(map[string]any)["message"], "restore")
	ls.send(`{"id": 10, "session": "a", "close": true}`)
	ls.await(10)
	ls.send(`{"id": 11, "session": "b", "close": true}`)
	ls.await(11)
	ls.finish()
}

func TestJSONLIdleSessionRestored(t *testing.T) {
	t.Parallel()
	dumps := t.TempDir()
	p := newTestPool(t, pynox.Config{Workers: 1, SessionIdle: 200 * time.Millisecond, SessionIdleDump: dumps})
	ls := startLive(t, p)
	ls.send(`{"id": 1, "session": "a", "code": "k = 7"}`)
	require.Nil(t, ls.await(1)["error"])
	require.Eventually(t, func() bool {
		m, _ := filepath.Glob(filepath.Join(dumps, "*.dump"))
		return len(m) == 1
	}, 20*time.Second, 20*time.Millisecond)
	ls.send(`{"id": 2, "session": "a", "code": "print(k)"}`)
	r := ls.await(2)
	require.Equal(t, "7\n", r["stdout"], "%v", r)
	require.Equal(t, true, r["restored"])
	require.Equal(t, "2", fmt.Sprint(r["step"]))
	ls.send(`{"id": 3, "session": "a", "close": true}`)
	ls.await(3)
	ls.finish()
}

func TestConfigFileIdleDump(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "dumps"), 0o700))
	path := filepath.Join(dir, "pool.toml")
	require.NoError(t, os.WriteFile(path, []byte("[pool]\nsession_idle_dump = \"dumps\"\n"), 0o600))
	f, err := LoadConfig(path)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "dumps"), f.Config.SessionIdleDump)
}

func TestJSONLEvictIdle(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1, MaxSessions: 1, EvictIdle: true})
	ls := startLive(t, p)
	ls.send(`{"id": 1, "session": "a", "code": "k = 7"}`)
	require.Nil(t, ls.await(1)["error"])
	ls.send(`{"id": 2, "session": "b", "code": "print(2)"}`)
	r := ls.await(2)
	require.Nil(t, r["error"], "%v", r)
	// a was evicted: its name starts afresh (and evicts b in turn).
	ls.send(`{"id": 3, "session": "a", "code": "print('k' in globals())"}`)
	r = ls.await(3)
	require.Equal(t, "False\n", r["stdout"], "%v", r)
	require.Equal(t, "1", fmt.Sprint(r["step"]))
	ls.finish()
}

func TestClientSessionDumpRestore(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	c := startClient(t, p)
	ctx := context.Background()
	s := c.Session("a", pynox.Job{})
	_, err := s.Dump(ctx)
	require.ErrorIs(t, err, pynox.ErrRequest) // nothing to dump yet
	res, err := s.Run(ctx, pynox.Step{Code: "def twice(v):\n    return 2 * v\nn = 21"})
	require.NoError(t, err)
	require.Nil(t, res.Error)
	d, err := s.Dump(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, d.Steps)
	require.Empty(t, d.Skipped)
	r := c.RestoreSession("b", pynox.Job{}, d.Data)
	res, err = r.Run(ctx, pynox.Step{Code: "print(twice(n))"})
	require.NoError(t, err)
	require.Nil(t, res.Error, "%s", res.Stderr)
	require.Equal(t, "42\n", res.Stdout)
	require.Equal(t, 2, res.Step)
	// Only the first step carries the dump.
	res, err = r.Run(ctx, pynox.Step{Code: "print(n)"})
	require.NoError(t, err)
	require.Equal(t, "21\n", res.Stdout)
	require.NoError(t, s.Close(ctx))
	require.NoError(t, r.Close(ctx))
}
