package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// The natural first set-up: a configuration file in the working
// directory. With the working directory as the default write ceiling it
// was refused ("lies beneath the write ceiling") without saying what to
// change; now nothing is writable by default, so it starts, and a write
// request says how the operator grants writes.
func TestPoolConfigInWorkingDirectory(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ok.toml"), []byte("[pool]\nworkers = 1\n"), 0o644))
	p := startPoolIn(t, dir, "--config=ok.toml")
	require.Equal(t, filepath.Join(dir, "ok.toml"), p.ready["config"])
	p.send(t, `{"id": 1, "code": "print('ran')"}`)
	r := p.next(t)
	require.Equal(t, "ran\n", r["stdout"], "%v", r)
	p.send(t, `{"id": 2, "code": "pass", "allow_write": ["."]}`)
	r = p.next(t)
	require.Contains(t, r["error"].(map[string]any)["message"], "the pool grants no writes at all")
	require.Contains(t, r["error"].(map[string]any)["message"], "--allow-write")
	require.NoError(t, p.stdin.Close())
	require.NoError(t, p.cmd.Wait())

	// With --allow-write covering the file, the refusal says what to do.
	var stderr strings.Builder
	code := run([]string{"pool", "--config=" + filepath.Join(dir, "ok.toml"), "--allow-write=" + dir}, strings.NewReader(""), &strings.Builder{}, &stderr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr.String(), "beneath the write ceiling")
	require.Contains(t, stderr.String(), "--allow-write")
}

// The README's layout: the binary in the pool's working directory, and a
// write ceiling that includes that directory. A job that asked for "."
// replaced ./pynox, which the operator's next start ran as root outside
// any sandbox. Now such a grant is refused; a directory beside the binary
// is still writable.
func TestPoolOwnBinaryNotWritable(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	src := pynoxBinary(t)
	root := t.TempDir()
	app := filepath.Join(root, "app")
	require.NoError(t, os.MkdirAll(filepath.Join(app, "work"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	bin := filepath.Join(app, "pynox")
	require.NoError(t, os.WriteFile(bin, b, 0o755))
	cfg := filepath.Join(root, "etc", "pynox.toml")
	require.NoError(t, os.WriteFile(cfg, []byte("[pool.limits]\nallow_write = [\"../app\"]\n"), 0o644))

	p := startBinaryIn(t, bin, app, "--config="+cfg, "--workers=1")
	// An executable replacement: the mode is set at creation (chmod is
	// denied), then renamed over the binary.
	replace := `import os\nfd = os.open('pynox.new', os.O_CREAT | os.O_WRONLY, 0o755)\nos.write(fd, b'#!/bin/sh\\necho owned\\n')\nos.close(fd)\nos.replace('pynox.new', 'pynox')\nprint('replaced')`
	p.send(t, `{"id": "dot", "allow_write": ["."], "code": "`+replace+`"}`)
	r := p.next(t)
	require.NotEqual(t, "replaced\n", r["stdout"], "%v", r)
	e, _ := r["error"].(map[string]any)
	require.NotNil(t, e, "%v", r)
	require.Equal(t, "RequestError", e["type"])
	require.Contains(t, e["message"], "allow_write: "+app+" would cover "+bin+", the pool's own executable")
	p.send(t, `{"id": "work", "allow_write": ["work"], "code": "open('work/out', 'w').write('ok'); print('ok')"}`)
	r = p.next(t)
	require.Equal(t, "ok\n", r["stdout"], "%v", r)
	require.NoError(t, p.stdin.Close())
	require.NoError(t, p.cmd.Wait())
	after, err := os.ReadFile(bin)
	require.NoError(t, err)
	require.True(t, bytes.Equal(b, after), "the pool's binary was changed")
}
