package jsonl

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// The "mounts" request field: objects with host, path, mode and
// write_bytes_limit (a size), decoded strictly; a mount the pool cannot
// enforce is a SandboxSetupError line; the ready event reports what the
// pool can do; a session's mounts are fixed by its first request.
func TestServeMounts(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	dir := p.Config().Dir
	data := filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f"), []byte("hi"), 0o644))
	input := `{"id": "ro", "code": "print(open('data/f').read())", "mounts": [{"host": "data", "mode": "ro"}]}
{"id": "rw", "code": "open('data/g', 'w').write('x'); import os; print(os.environ['TMPDIR'] == os.environ['HOME'])", "mounts": [{"host": "data", "path": "` + data + `", "mode": "rw"}]}
{"id": "overlay", "code": "print(1)", "mounts": [{"host": "data", "path": "/work", "mode": "overlay", "write_bytes_limit": "1m"}]}
{"id": "limit", "code": "print(1)", "mounts": [{"host": "data", "mode": "rw", "write_bytes_limit": "1m"}]}
{"id": "badmode", "code": "print(1)", "mounts": [{"host": "data", "mode": "RW"}]}
{"id": "badkey", "code": "print(1)", "mounts": [{"host": "data", "size": 1}]}
{"id": "badlimit", "code": "print(1)", "mounts": [{"host": "data", "mode": "rw", "write_bytes_limit": "lots"}]}
{"id": "s1", "session": "a", "code": "x = 1", "mounts": [{"host": "data"}]}
{"id": "s2", "session": "a", "code": "print(open('data/f').read())"}
{"id": "s3", "session": "a", "code": "print(2)", "mounts": [{"host": "data"}]}
`
	lines := serveLines(t, p, input)
	ready := lines[0]
	m := ready["mounts"].(map[string]any)
	nsOK := m["virtual_paths"] == true
	if nsOK {
		require.Equal(t, []any{"ro", "rw", "overlay"}, m["modes"])
	} else {
		require.Equal(t, []any{"ro", "rw"}, m["modes"])
	}
	require.NotEmpty(t, m["scratch"])
	got := byID(t, lines)
	require.Nil(t, got["ro"]["error"], "%v", got["ro"])
	require.Equal(t, "hi\n", got["ro"]["stdout"])
	pol := got["ro"]["policy"].(map[string]any)
	require.Equal(t, []any{map[string]any{"host": data, "path": data, "mode": "ro"}}, pol["mounts"])
	require.NotEmpty(t, pol["scratch"])
	require.Nil(t, got["rw"]["error"], "%v", got["rw"])
	require.Equal(t, "True\n", got["rw"]["stdout"])
	if nsOK {
		require.Nil(t, got["overlay"]["error"], "%v", got["overlay"])
		pol := got["overlay"]["policy"].(map[string]any)
		require.Equal(t, []any{map[string]any{"host": data, "path": "/work", "mode": "overlay", "write_bytes_limit": json.Number("1048576")}}, pol["mounts"])
	} else {
		require.Equal(t, "SandboxSetupError", errType(got["overlay"]), "%v", got["overlay"])
		require.Contains(t, errMessage(got["overlay"]), "mounts[0]: an overlay mount needs")
	}
	require.Equal(t, "SandboxSetupError", errType(got["limit"]))
	require.Contains(t, errMessage(got["limit"]), "mounts[0].write_bytes_limit")
	require.Equal(t, "RequestError", errType(got["badmode"]))
	require.Contains(t, errMessage(got["badmode"]), `mounts[0].mode: unknown mode "RW"`)
	require.Equal(t, "RequestError", errType(got["badkey"]))
	require.Contains(t, errMessage(got["badkey"]), `unknown field "size"`)
	require.Equal(t, "RequestError", errType(got["badlimit"]))
	require.Contains(t, errMessage(got["badlimit"]), `mounts[0].write_bytes_limit: invalid size "lots"`)
	require.Nil(t, got["s1"]["error"], "%v", got["s1"])
	require.Equal(t, "hi\n", got["s2"]["stdout"])
	require.Equal(t, "RequestError", errType(got["s3"]))
	require.Contains(t, errMessage(got["s3"]), "mounts")
}

// [pool] scratch_dir resolves against the file's directory, and the pool
// makes its scratch directory there; an empty one is refused by name.
func TestConfigScratchDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "scratch"), 0o700))
	path := filepath.Join(dir, "pynox.toml")
	require.NoError(t, os.WriteFile(path, []byte("[pool]\nscratch_dir = \"scratch\"\n"), 0o644))
	f, err := LoadConfig(path)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "scratch"), f.Config.ScratchDir)
	cfg := f.Config
	cfg.Dir = t.TempDir()
	p := newTestPool(t, cfg)
	require.Equal(t, filepath.Join(dir, "scratch"), filepath.Dir(p.Mounts().Scratch))

	require.NoError(t, os.WriteFile(path, []byte("[pool]\nscratch_dir = \"\"\n"), 0o644))
	_, err = LoadConfig(path)
	require.ErrorContains(t, err, ":2: pool.scratch_dir: expected a directory")
}
