package mcpserver_test

import (
	"bufio"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
	"github.com/pynox/pynox/mcpserver"
)

// connect attaches a new client to srv over in-memory transports: one
// more MCP session of the same server.
func connect(t *testing.T, ctx context.Context, srv *mcpserver.Server, name string) *mcp.ClientSession {
	t.Helper()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(ctx, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: name, Version: "v0"}, nil).Connect(ctx, ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { cs.Close() })
	return cs
}

func call(t *testing.T, ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	require.NoError(t, err)
	var b strings.Builder
	for _, c := range res.Content {
		b.WriteString(c.(*mcp.TextContent).Text)
	}
	return b.String(), res.IsError
}

// TestSessionsScopedToClient connects two clients to one server: both
// use the session name "main", and neither sees, changes or resets the
// other's variables; when a client disconnects, its sessions are
// finished (the pool's open sessions drop back).
func TestSessionsScopedToClient(t *testing.T) {
	testenv.RequireSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	p, err := pynox.New(pynox.Config{Python: testenv.Python(), Dir: dir, Workers: 1, Limits: pynox.Limits{AllowRead: []string{dir}}})
	require.NoError(t, err)
	defer p.Close()
	srv := mcpserver.New(p, "test")
	a := connect(t, ctx, srv, "a")
	b := connect(t, ctx, srv, "b")

	text, isErr := call(t, ctx, a, "run_python", map[string]any{"code": "x = 'A'", "session": "main"})
	require.False(t, isErr, text)
	text, isErr = call(t, ctx, b, "run_python", map[string]any{"code": "x", "session": "main"})
	require.True(t, isErr, text)
	require.Contains(t, text, "NameError", "client b must not see client a's session")
	text, isErr = call(t, ctx, b, "run_python", map[string]any{"code": "x = 'B'", "session": "main"})
	require.False(t, isErr, text)
	text, _ = call(t, ctx, a, "run_python", map[string]any{"code": "x", "session": "main"})
	require.Contains(t, text, `"A"`)
	require.Equal(t, 2, p.Stats().SessionsActive)

	text, isErr = call(t, ctx, b, "reset_session", map[string]any{"session": "main"})
	require.False(t, isErr, text)
	text, _ = call(t, ctx, a, "run_python", map[string]any{"code": "x", "session": "main"})
	require.Contains(t, text, `"A"`, "client b's reset must not end client a's session")
	text, _ = call(t, ctx, b, "reset_session", map[string]any{"session": "main"})
	require.Contains(t, text, "was not open")
	require.Equal(t, 1, p.Stats().SessionsActive)

	require.NoError(t, a.Close())
	require.Eventually(t, func() bool { return p.Stats().SessionsActive == 0 }, 30*time.Second, 10*time.Millisecond,
		"a disconnected client's sessions are finished")
}

// profilePool is a one-worker pool reading its directory, with a profile
// "p1" that does too; it closes when the test ends.
func profilePool(t *testing.T) *pynox.Pool {
	t.Helper()
	dir := t.TempDir()
	p, err := pynox.New(pynox.Config{Python: testenv.Python(), Dir: dir, Workers: 1,
		Limits:   pynox.Limits{AllowRead: []string{dir}},
		Profiles: map[string]pynox.Profile{"p1": {AllowRead: []string{dir}}}})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// TestBadArguments checks that each bad argument is refused by name as a
// tool error, and that a session keeps the profile it was created with.
func TestBadArguments(t *testing.T) {
	testenv.RequireSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := profilePool(t)
	cs := connect(t, ctx, mcpserver.New(p, "test"), "c")
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"run_python", map[string]any{"code": ""}, "code: expected Python source"},
		{"run_python", map[string]any{}, "code"},
		{"run_python", map[string]any{"code": "1", "session": strings.Repeat("s", 129)}, "session: a name of at most 128 bytes"},
		{"run_python", map[string]any{"code": "1", "allow_network": true}, "allow_network: not an argument of run_python"},
		{"run_python", map[string]any{"code": 1}, "code: expected a string, got a JSON number"},
		{"run_python", map[string]any{"code": "1", "timeout_seconds": "5s"}, "timeout_seconds: expected a number, got a JSON string"},
		{"run_python", map[string]any{"code": "1", "inputs": []int{1}}, "inputs: expected an object, got a JSON array"},
		{"run_python", map[string]any{"code": "1", "inputs": map[string]any{"not an identifier": 1}}, "inputs"},
		{"reset_session", map[string]any{"session": ""}, "session: expected the name of a session"},
	} {
		text, isErr := call(t, ctx, cs, tc.tool, tc.args)
		require.True(t, isErr, "%v: %s", tc.args, text)
		require.Contains(t, text, tc.want, "%v", tc.args)
	}
	text, isErr := call(t, ctx, cs, "run_python", map[string]any{"code": "1", "session": "s", "profile": "p1"})
	require.False(t, isErr, text)
	text, isErr = call(t, ctx, cs, "run_python", map[string]any{"code": "1", "session": "s", "profile": "other"})
	require.True(t, isErr, text)
	require.Contains(t, text, `profile: session "s" runs under profile "p1"`)
}

// TestTimeoutWithinCeiling checks timeout_seconds: a run beyond the
// server's limit is refused before anything runs, one within it bounds
// the code.
func TestTimeoutWithinCeiling(t *testing.T) {
	testenv.Slow(t)
	testenv.RequireSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	p, err := pynox.New(pynox.Config{Python: testenv.Python(), Dir: dir, Workers: 1,
		Limits: pynox.Limits{AllowRead: []string{dir}, Timeout: 20 * time.Second}})
	require.NoError(t, err)
	defer p.Close()
	cs := connect(t, ctx, mcpserver.New(p, "test"), "c")
	text, isErr := call(t, ctx, cs, "run_python", map[string]any{"code": "1", "timeout_seconds": 3600})
	require.True(t, isErr, text)
	require.Contains(t, text, "timeout_seconds: 3600 exceeds the server's limit of 20s")
	text, isErr = call(t, ctx, cs, "run_python", map[string]any{"code": "1", "timeout_seconds": -1})
	require.True(t, isErr, text)
	require.Contains(t, text, "timeout_seconds: expected a positive number")
	require.Zero(t, p.Stats().Jobs, "a refused timeout runs nothing")
	for _, session := range []string{"", "s"} {
		text, isErr = call(t, ctx, cs, "run_python", map[string]any{"code": "while True: pass", "timeout_seconds": 0.5, "session": session})
		require.True(t, isErr, text)
		require.Contains(t, text, "TimeoutError: the job exceeded its timeout of 500ms")
	}
}

// TestCancelInterruptsStep cancels a client's call while its session
// step runs: the step is interrupted (KeyboardInterrupt), not left to run
// to its timeout, and the session keeps its variables.
func TestCancelInterruptsStep(t *testing.T) {
	testenv.RequireSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	p, err := pynox.New(pynox.Config{Python: testenv.Python(), Dir: dir, Workers: 1,
		Limits:   pynox.Limits{AllowRead: []string{dir}, AllowWrite: []string{dir}},
		Profiles: map[string]pynox.Profile{"w": {AllowWrite: []string{dir}}}})
	require.NoError(t, err)
	defer p.Close()
	cs := connect(t, ctx, mcpserver.New(p, "test"), "c")
	text, isErr := call(t, ctx, cs, "run_python", map[string]any{"code": "x = 7", "session": "s", "profile": "w"})
	require.False(t, isErr, text)
	callCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{
			"code": "open('started', 'w').close()\nwhile True: pass", "session": "s"}})
		done <- err
	}()
	require.Eventually(t, func() bool { return fileExists(dir + "/started") }, 30*time.Second, 5*time.Millisecond)
	stop()
	require.Error(t, <-done)
	text, isErr = call(t, ctx, cs, "run_python", map[string]any{"code": "x", "session": "s"})
	require.False(t, isErr, text)
	require.Contains(t, text, "[value]\n7\n", "the interrupted step leaves the session's variables")
}

// TestIdleSessionReplaced checks that a session the pool ended for being
// idle is replaced on the next call, whose text says its variables are
// gone.
func TestIdleSessionReplaced(t *testing.T) {
	testenv.RequireSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	p, err := pynox.New(pynox.Config{Python: testenv.Python(), Dir: dir, Workers: 1,
		Limits: pynox.Limits{AllowRead: []string{dir}}, SessionIdle: 200 * time.Millisecond})
	require.NoError(t, err)
	defer p.Close()
	cs := connect(t, ctx, mcpserver.New(p, "test"), "c")
	text, isErr := call(t, ctx, cs, "run_python", map[string]any{"code": "x = 1", "session": "s"})
	require.False(t, isErr, text)
	require.Eventually(t, func() bool { return p.Stats().SessionsActive == 0 }, 30*time.Second, 10*time.Millisecond)
	text, isErr = call(t, ctx, cs, "run_python", map[string]any{"code": "'x' in globals()", "session": "s"})
	require.False(t, isErr, text)
	require.Contains(t, text, `session "s" had ended (idle too long`)
	require.Contains(t, text, "[value]\nfalse\n")
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestValueExact checks on the wire that a large integer input reaches
// the job exactly, and that the structured content keeps the large
// integer value exactly, as the text does (no float64 rounding).
func TestValueExact(t *testing.T) {
	testenv.RequireSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	p, err := pynox.New(pynox.Config{Python: testenv.Python(), Dir: dir, Workers: 1, Limits: pynox.Limits{AllowRead: []string{dir}}})
	require.NoError(t, err)
	defer p.Close()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	go func() { _ = mcpserver.New(p, "test").Run(ctx, &mcp.IOTransport{Reader: inR, Writer: outW}) }()
	defer inW.Close()
	lines := bufio.NewScanner(outR)
	lines.Buffer(nil, 1<<20)
	for _, msg := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"n + 1","inputs":{"n":9223372036854775808}}}}`,
	} {
		_, err := io.WriteString(inW, msg+"\n")
		require.NoError(t, err)
	}
	var answer string
	for lines.Scan() {
		if strings.Contains(lines.Text(), `"id":2`) {
			answer = lines.Text()
			break
		}
	}
	require.Contains(t, answer, `"value":9223372036854775809`)
	require.Contains(t, answer, `[value]\n9223372036854775809`)
}
