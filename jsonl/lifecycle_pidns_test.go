package jsonl

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// TestPIDNamespaceConfigKey checks the configuration file's
// pid_namespace key: a bad value is refused naming the key.
func TestPIDNamespaceConfigKey(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	require.NoError(t, os.WriteFile(good, []byte("[pool]\npid_namespace = \"require\"\n"), 0o644))
	f, err := LoadConfig(good)
	require.NoError(t, err)
	require.Equal(t, "require", f.Config.PIDNamespace)
	bad := filepath.Join(dir, "bad.toml")
	require.NoError(t, os.WriteFile(bad, []byte("[pool]\npid_namespace = \"maybe\"\n"), 0o644))
	_, err = LoadConfig(bad)
	require.ErrorContains(t, err, `pool.pid_namespace: expected "auto", "require" or "off", got "maybe"`)
}

// TestPIDNamespaceReported: the ready event says whether the templates
// run in PID namespaces of their own.
func TestPIDNamespaceReported(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	lines := serveLines(t, p, "")
	require.Equal(t, p.PIDNamespace(), lines[0]["pid_namespace"])
}
