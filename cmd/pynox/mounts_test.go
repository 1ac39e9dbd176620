package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/sandbox"
)

// `pynox pool` confines itself by default, and its jobs still get their
// scratch directory (the pool's domain holds it), a read-only mount works,
// and, where the machine allows mount namespaces, a read-only mount at
// /data and an overlay at /work work too (the pool started its mounter
// before it confined itself, and its domain holds a rule on the
// namespaces' root); elsewhere the ready event's "mounts" says why they
// are refused, and they are.
func TestPoolScratchAndMountsConfined(t *testing.T) {
	requireSandboxOrSkip(t)
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock: %v", err)
	}
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "data"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "f"), []byte("hi"), 0o644))
	p := startPoolIn(t, dir, "--workers=1")
	m, ok := p.ready["mounts"].(map[string]any)
	require.True(t, ok, "ready: %v", p.ready)
	nsOK := m["virtual_paths"] == true
	t.Logf("ready mounts: %v", m)
	scratch, _ := m["scratch"].(string)
	require.NotEmpty(t, scratch)
	p.send(t, `{"id": 1, "code": "import os, tempfile\nf = tempfile.NamedTemporaryFile('w')\nf.write('x'); f.flush()\nprint(open(f.name).read(), open('data/f').read(), os.path.dirname(f.name) == os.environ['TMPDIR'])", "mounts": [{"host": "data"}]}`)
	r := p.next(t)
	require.Nil(t, r["error"], "%v", r)
	require.Equal(t, "x hi True\n", r["stdout"])
	require.True(t, strings.HasPrefix(r["policy"].(map[string]any)["scratch"].(string), scratch+"/"))
	p.send(t, `{"id": 2, "code": "open('/work/f', 'w').write('changed'); print(open('/data/f').read(), open('/work/f').read())", "mounts": [{"host": "data", "path": "/data"}, {"host": "data", "path": "/work", "mode": "overlay"}]}`)
	r = p.next(t)
	if !nsOK {
		require.Equal(t, "SandboxSetupError", r["error"].(map[string]any)["type"], "%v", r)
		require.Contains(t, r["error"].(map[string]any)["message"], "mounts[0].path: showing")
		return
	}
	require.Nil(t, r["error"], "%v", r)
	require.Equal(t, "hi changed\n", r["stdout"])
	b, err := os.ReadFile(filepath.Join(dir, "data", "f"))
	require.NoError(t, err)
	require.Equal(t, "hi", string(b))
}
