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
// and the ready event's "mounts" says that the pool's own Landlock domain
// is one more reason why virtual paths and overlays are refused.
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
	require.Contains(t, m["missing"], "confine_self")
	scratch, _ := m["scratch"].(string)
	require.NotEmpty(t, scratch)
	p.send(t, `{"id": 1, "code": "import os, tempfile\nf = tempfile.NamedTemporaryFile('w')\nf.write('x'); f.flush()\nprint(open(f.name).read(), open('data/f').read(), os.path.dirname(f.name) == os.environ['TMPDIR'])", "mounts": [{"host": "data"}]}`)
	r := p.next(t)
	require.Nil(t, r["error"], "%v", r)
	require.Equal(t, "x hi True\n", r["stdout"])
	require.True(t, strings.HasPrefix(r["policy"].(map[string]any)["scratch"].(string), scratch+"/"))
	p.send(t, `{"id": 2, "code": "print(1)", "mounts": [{"host": "data", "mode": "overlay"}]}`)
	r = p.next(t)
	require.Equal(t, "SandboxSetupError", r["error"].(map[string]any)["type"], "%v", r)
	require.Contains(t, r["error"].(map[string]any)["message"], "mounts[0]: an overlay mount needs")
}
