package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// startMCP starts the real `pynox mcp args...` binary in dir and connects
// the Go SDK's own client to it over stdio.
func startMCP(t *testing.T, ctx context.Context, dir string, args ...string) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(pynoxBinary(t), append([]string{"mcp"}, args...)...)
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "pynox-test", Version: "v0"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { cs.Close() })
	return cs
}

// callText calls a tool and returns its text content and whether it is
// an error result.
func callText(t *testing.T, ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	require.NoError(t, err, "%s %v", tool, args)
	var b strings.Builder
	for _, c := range res.Content {
		tc, ok := c.(*mcp.TextContent)
		require.True(t, ok, "content %T", c)
		b.WriteString(tc.Text)
	}
	return b.String(), res.IsError
}

// TestMCPStdio drives the real `pynox mcp` over stdio with the Go SDK's
// client, against real python3 in the real sandbox: the tools are listed;
// code runs and its output and value come back; a _repr_png_ display
// comes back as image content; a session keeps a
// variable between two calls and reset_session drops it; a Python error
// is a tool error result carrying the error; a grant the client asks for
// (a path, an unknown profile) is refused; and the server keeps serving
// after jobs that exit the process or flood their output.
func TestMCPStdio(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	testenv.RequireSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "in.txt"), []byte("from the profile\n"), 0o644))
	conf := filepath.Join(dir, "mcp.toml")
	require.NoError(t, os.WriteFile(conf, []byte(`[pool]
workers = 1
python = "`+cmpOr(testenv.Python(), "python3")+`"

[pool.limits]
allow_read = ["`+dir+`"]

[profiles.data]
allow_read = ["`+data+`"]
`), 0o644))
	cs := startMCP(t, ctx, dir, "--config="+conf)

	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		require.NoError(t, err)
		names = append(names, tool.Name)
		if tool.Name == "run_python" {
			schema, err := json.Marshal(tool.InputSchema)
			require.NoError(t, err)
			require.Contains(t, string(schema), `"code"`)
			require.NotContains(t, string(schema), "allow_read", "a client passes no paths")
		}
	}
	require.ElementsMatch(t, []string{"run_python", "reset_session"}, names)

	// One-shot code: stdout and the value.
	text, isErr := callText(t, ctx, cs, "run_python", map[string]any{"code": "print('hi')\n6 * 7"})
	require.False(t, isErr, text)
	require.Contains(t, text, "[stdout]\nhi\n")
	require.Contains(t, text, "[value]\n42\n")

	// A _repr_png_ display is image content.
	requirePNGContent(t, ctx, cs)

	// Inputs become globals.
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "n * 2", "inputs": map[string]any{"n": 21}})
	require.False(t, isErr, text)
	require.Contains(t, text, "[value]\n42\n")

	// A session keeps its variables between calls; reset_session drops them.
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "x = 'kept'", "session": "s1"})
	require.False(t, isErr, text)
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "x", "session": "s1"})
	require.False(t, isErr, text)
	require.Contains(t, text, `[value]`+"\n"+`"kept"`)
	text, isErr = callText(t, ctx, cs, "reset_session", map[string]any{"session": "s1"})
	require.False(t, isErr, text)
	require.Contains(t, text, `session "s1" ended`)
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "x", "session": "s1"})
	require.True(t, isErr, text)
	require.Contains(t, text, "NameError: name 'x' is not defined")

	// A job's error is a tool error result with the Python error.
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "1 / 0"})
	require.True(t, isErr, text)
	require.Contains(t, text, "ZeroDivisionError: division by zero (<code>, line 1)")

	// Grants: a configured profile works, an unknown one and a path are refused.
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "open('data/in.txt').read()", "profile": "data"})
	require.False(t, isErr, text)
	require.Contains(t, text, "from the profile")
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "1", "profile": "root"})
	require.True(t, isErr, text)
	require.Contains(t, text, `profile: unknown profile "root"; the configured profiles are data`)
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "open('/etc/passwd').read()", "allow_read": []string{"/etc"}})
	require.True(t, isErr, text)
	require.Contains(t, text, "allow_read")
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "open('/etc/passwd').read()"})
	require.True(t, isErr, text)
	require.Contains(t, text, "PermissionError")

	// Hostile jobs: one exits the process (in a session, too), one floods
	// its output; the server answers each and keeps serving.
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "import os\nos._exit(3)"})
	require.True(t, isErr, text)
	require.Contains(t, text, "exit status 3")
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "y = 1", "session": "s2"})
	require.False(t, isErr, text)
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "import os\nos._exit(0)", "session": "s2"})
	require.Contains(t, text, "ended the session's process")
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "import sys\nfor _ in range(1024): sys.stdout.write('x' * 65536)\nraise SystemExit(1)"})
	require.True(t, isErr, text)
	require.Contains(t, text, "[stdout truncated")
	require.Less(t, len(text), 4<<20, "the output cap bounds the answer")
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "y", "session": "s2"})
	require.True(t, isErr, text)
	require.Contains(t, text, "NameError", "the session's new process starts empty")
	require.Contains(t, text, "new one whose variables start empty")
	text, isErr = callText(t, ctx, cs, "run_python", map[string]any{"code": "sum(range(10))"})
	require.False(t, isErr, text)
	require.Contains(t, text, "[value]\n45\n")

	// End of input (the client closing its end) ends the server cleanly,
	// with a session still open.
	require.NoError(t, cs.Close(), "pynox mcp exits 0 when its client disconnects")
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestMCPHelp checks that `pynox --help` lists the mcp command and that
// `pynox mcp --help` (and `pynox help mcp`) describe it with the pool's
// flags.
func TestMCPHelp(t *testing.T) {
	var out, errb strings.Builder
	require.Equal(t, 0, run([]string{"--help"}, strings.NewReader(""), &out, &errb))
	require.Contains(t, out.String(), "pynox mcp [flags]")
	for _, args := range [][]string{{"mcp", "--help"}, {"help", "mcp"}, {"mcp", "help"}} {
		out.Reset()
		require.Equal(t, 0, run(args, strings.NewReader(""), &out, &errb), "%q", args)
		require.Contains(t, out.String(), "Usage: pynox mcp [flags]", "%q", args)
		require.Contains(t, out.String(), `"mcpServers"`)
		require.Contains(t, out.String(), "--allow-read=DIR")
	}
	errb.Reset()
	require.Equal(t, 2, run([]string{"mcp", "--workers=x"}, strings.NewReader(""), &out, &errb))
	require.Equal(t, "pynox mcp: --workers=x: expected a positive integer\nRun \"pynox mcp --help\" for the flags.\n", errb.String())
}
