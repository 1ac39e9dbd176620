package pynox

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// requireNS skips a test when this pool cannot build mount namespaces,
// saying why.
func requireNS(t *testing.T, p *Pool) {
	t.Helper()
	if why := p.nsObstacles(); len(why) > 0 {
		t.Skipf("the pool cannot build mount namespaces here: %v", why)
	}
}

// A read-only mount at a virtual path and an overlay, against real
// python3 under the real sandbox: the job reads /data, cannot write it
// (EROFS), writes /work (the host directory is unchanged), and its policy
// says what it got.
func TestMountNamespaceJob(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	requireNS(t, p)
	dir := p.Config().Dir
	data := filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "in.txt"), []byte("input"), 0o644))
	res := run(t, p, Job{
		Mounts: []MountSpec{{HostPath: data, Path: "/data"}, {HostPath: data, Path: "/work", Mode: Overlay}},
		Code: `
import errno, os
print(open("/data/in.txt").read())
try:
    open("/data/new", "w")
except OSError as e:
    print("data write", errno.errorcode[e.errno])
open("/work/in.txt", "w").write("changed")
print(open("/work/in.txt").read())
print(sorted(os.listdir("/work")))
import json, tempfile
with tempfile.NamedTemporaryFile() as f:
    f.write(b"x")
print("tmp ok")
print(os.getcwd() == ` + pyQuote(dir) + `)
`})
	requireOK(t, res)
	require.Equal(t, "input\ndata write EROFS\nchanged\n['in.txt']\ntmp ok\nTrue\n", res.Stdout)
	b, err := os.ReadFile(filepath.Join(data, "in.txt"))
	require.NoError(t, err)
	require.Equal(t, "input", string(b))
	require.Equal(t, []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly},
		{HostPath: data, Path: "/work", Mode: Overlay, WriteBytesLimit: DefaultOverlayLimit}}, res.Policy.Mounts)
}

// A session with an overlay: its writes persist across steps; a dump of
// it restores into a new process with a new namespace, whose overlay
// starts from the host directory again (a dump holds __main__, not
// files), and the host directory never changes.
func TestMountNamespaceSessionDump(t *testing.T) {
	t.Parallel()
	p, data, _ := nsPool(t)
	job := Job{Mounts: []MountSpec{{HostPath: data, Path: "/work", Mode: Overlay}}}
	ctx := t.Context()
	c, err := p.Checkout(ctx, job)
	require.NoError(t, err)
	for _, code := range []string{`x = 41; open("/work/new.txt", "w").write("mine")`, `x += 1; print(x, open("/work/new.txt").read())`} {
		ev, err := c.Feed(ctx, Step{Code: code})
		require.NoError(t, err)
		requireOK(t, ev.Result)
	}
	d, err := c.Dump(ctx)
	require.NoError(t, err)
	require.NoError(t, c.Finish(ctx))
	c2, err := p.Restore(ctx, job, d.Data)
	require.NoError(t, err)
	defer c2.Finish(context.Background())
	ev, err := c2.Feed(ctx, Step{Code: `import os; print(x, os.path.exists("/work/new.txt"), sorted(os.listdir("/work")))`})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "42 False ['f.txt', 'fifo']\n", ev.Result.Stdout)
	require.NoFileExists(t, filepath.Join(data, "new.txt"))
}
