package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestAgentToolHostileStream drives the Python package (python/pynox)
// against a real pool with what could break it:
// forged host calls whose arguments Python's json module cannot read, lines
// it cannot read on the stream (put there by a wrapper around the pool),
// and a pool killed while a request waits. The client must keep serving,
// or fail every request with PoolError, and never hang.
func TestAgentToolHostileStream(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	bin := pynoxBinary(t)
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3 to run the Python package")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	testdata, err := filepath.Abs("testdata")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, filepath.Join(testdata, "agent_tool_probe.py"),
		filepath.Join(root, "python"), bin, filepath.Join(testdata, "inject_bad_lines.sh"))
	cmd.Dir = t.TempDir()
	out, err := cmd.Output()
	var stderr string
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", out, stderr)
	require.Equal(t, strings.Join([]string{
		"forged utf8: served",
		"forged deep: served",
		"forged digits: served",
		"after forged: 42",
		"after bad lines: 42",
		"host call after bad lines: answered",
		"waiting request: PoolError: pynox pool exited before answering",
		"later request: PoolError",
	}, "\n")+"\n", string(out))
}
