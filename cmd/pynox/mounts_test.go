package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/testenv"
)

// `pynox pool` confines itself by default, and its jobs still get their
// scratch directory (the pool's domain holds it), a read-only mount works,
// and, where the machine allows mount namespaces, a read-only mount at
// /data and an overlay at /work work too (the pool started its mounter
// before it confined itself, and its domain holds a rule on the
// namespaces' root); elsewhere the ready event's "mounts" says why they
// are refused, and they are.
func TestPoolScratchAndMountsConfined(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
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

// Where the pool cannot build mount namespaces, it says so in its ready
// event and refuses a virtual path and an overlay with SandboxSetupError
// naming what is missing, and nothing runs; a mount at its host path still
// works. The pool runs here as root of a child user namespace (uid 0
// mapped to 0, no capability over the initial mount namespace), like a
// pool in an unprivileged container: its mounter cannot make a tmpfs.
func TestPoolMountsWithoutNamespaces(t *testing.T) {
	t.Parallel()
	requireSandboxOrSkip(t)
	if os.Geteuid() != 0 {
		t.Skip("mapping uid 0 into a child user namespace needs root")
	}
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "data"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "f"), []byte("hi"), 0o644))
	cmd := exec.Command(pynoxBinary(t), "pool", "--workers=1", "--cgroups=off")
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
	}
	p := startPoolCmd(t, cmd)
	m, ok := p.ready["mounts"].(map[string]any)
	require.True(t, ok, "ready: %v", p.ready)
	t.Logf("ready mounts: %v", m)
	require.Equal(t, false, m["virtual_paths"])
	require.Equal(t, []any{"ro", "rw"}, m["modes"])
	require.Contains(t, m["missing"], "tmpfs")
	p.send(t, `{"id": 1, "code": "print('ran')", "mounts": [{"host": "data", "path": "/work", "mode": "overlay"}]}`)
	r := p.next(t)
	require.Equal(t, "SandboxSetupError", r["error"].(map[string]any)["type"], "%v", r)
	require.Contains(t, r["error"].(map[string]any)["message"], "mounts[0]: an overlay mount needs")
	require.Contains(t, r["error"].(map[string]any)["message"], "tmpfs")
	require.Empty(t, r["stdout"])
	p.send(t, `{"id": 2, "code": "print(open('data/f').read())", "mounts": [{"host": "data"}]}`)
	r = p.next(t)
	require.Nil(t, r["error"], "%v", r)
	require.Equal(t, "hi\n", r["stdout"])
}
