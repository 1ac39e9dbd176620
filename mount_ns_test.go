package pynox

import (
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
