package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestRemoteExample runs the example against a real `pynox serve` with a
// token file.
func TestRemoteExample(t *testing.T) {
	testenv.RequireSandbox(t)
	dir := t.TempDir()
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("example-token\n"), 0o600))
	srv := testenv.StartServe(t, dir, "127.0.0.1:0", "--token-file="+tokens)
	var out strings.Builder
	require.NoError(t, run(&out, srv.URL(), "example-token"))
	require.Equal(t, "hello from the host, [\"remote\"]\nvalue: 42\n", out.String())
	require.Error(t, run(&out, srv.URL(), "wrong-token"))
}
