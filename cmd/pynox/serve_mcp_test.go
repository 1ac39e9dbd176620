package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// bearer is an http.RoundTripper that adds a bearer token to each request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// connectServeMCP connects the Go SDK's client to s's /v1/mcp with token.
func connectServeMCP(ctx context.Context, s *serveProc, token string) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "pynox-test", Version: "v0"}, nil)
	return client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   s.base + "/v1/mcp",
		HTTPClient: &http.Client{Transport: bearer{token}},
		MaxRetries: -1,
	}, nil)
}

// pngCode shows a 1x1 PNG through an object's _repr_png_.
const pngCode = "import base64\nfrom pynox_display import display\n" +
	"png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg==')\n" +
	"class P:\n    def _repr_png_(self):\n        return png\n" +
	"display(P())\n"

// requirePNGContent calls run_python with pngCode and requires image
// content holding a PNG.
func requirePNGContent(t *testing.T, ctx context.Context, cs *mcp.ClientSession) {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": pngCode}})
	require.NoError(t, err)
	require.False(t, res.IsError, "%+v", res.Content)
	var image *mcp.ImageContent
	for _, c := range res.Content {
		if c, ok := c.(*mcp.ImageContent); ok {
			image = c
		}
	}
	require.NotNil(t, image, "no image content in %+v", res.Content)
	require.Equal(t, "image/png", image.MIMEType)
	require.True(t, bytes.HasPrefix(image.Data, []byte("\x89PNG\r\n\x1a\n")), "%q", image.Data)
}

// TestServeMCP drives `pynox serve`'s /v1/mcp (streamable HTTP) with the
// Go SDK's own client, against real python3 in the real sandbox: without
// the bearer token (or with a wrong one) a client gets 401; with it, the
// tools are listed, code runs, a session keeps a variable across calls, a
// _repr_png_ display is image content; two clients using the same session
// name do not see each other's variables, and a client with another
// token cannot use a client's MCP session id; the web-page refusals of /v1/*
// apply; and SIGTERM with clients connected ends the process with exit 0.
func TestServeMCP(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	testenv.RequireSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("tok-a\ntok-c\n"), 0o600))
	conf := filepath.Join(t.TempDir(), "serve.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[pool]\nworkers = 2\n\n[pool.limits]\nallow_write = [\""+dir+"\"]\n\n[profiles.w]\nallow_write = [\""+dir+"\"]\n"), 0o644))
	s := startServe(t, dir, "--token-file="+tokens, "--config="+conf)

	for _, tok := range []string{"", "tok-b"} {
		_, err := connectServeMCP(ctx, s, tok)
		require.Error(t, err, "token %q", tok)
		require.Contains(t, err.Error(), "Unauthorized", "token %q", tok)
		code, body := s.do(t, "POST", "/v1/mcp", tok, `{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}`)
		require.Equal(t, 401, code, body)
	}
	// A web page's request is refused even with the token.
	req, _ := http.NewRequest("POST", s.base+"/v1/mcp", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", "https://evil.example")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 403, resp.StatusCode)

	a, err := connectServeMCP(ctx, s, "tok-a")
	require.NoError(t, err)
	defer a.Close()
	var names []string
	for tool, err := range a.Tools(ctx, nil) {
		require.NoError(t, err)
		names = append(names, tool.Name)
	}
	require.ElementsMatch(t, []string{"run_python", "reset_session"}, names)

	text, isErr := callText(t, ctx, a, "run_python", map[string]any{"code": "print('hi')\n6 * 7"})
	require.False(t, isErr, text)
	require.Contains(t, text, "[stdout]\nhi\n")
	require.Contains(t, text, "[value]\n42\n")

	// A session keeps its variables across calls.
	text, isErr = callText(t, ctx, a, "run_python", map[string]any{"code": "x = 'from a'", "session": "main"})
	require.False(t, isErr, text)
	text, isErr = callText(t, ctx, a, "run_python", map[string]any{"code": "x", "session": "main"})
	require.False(t, isErr, text)
	require.Contains(t, text, "[value]\n\"from a\"")

	requirePNGContent(t, ctx, a)

	// A second client naming the same session gets its own.
	b, err := connectServeMCP(ctx, s, "tok-a")
	require.NoError(t, err)
	defer b.Close()
	text, isErr = callText(t, ctx, b, "run_python", map[string]any{"code": "x", "session": "main"})
	require.True(t, isErr, text)
	require.Contains(t, text, "NameError: name 'x' is not defined")
	text, isErr = callText(t, ctx, b, "run_python", map[string]any{"code": "x = 'from b'", "session": "main"})
	require.False(t, isErr, text)
	text, isErr = callText(t, ctx, a, "run_python", map[string]any{"code": "x", "session": "main"})
	require.False(t, isErr, text)
	require.Contains(t, text, "[value]\n\"from a\"", "b's step did not reach a's session")

	// A's MCP session is bound to a's token: its id with another token
	// is refused.
	require.NotEmpty(t, a.ID())
	req, _ = http.NewRequest("POST", s.base+"/v1/mcp", strings.NewReader(
		`{"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {"name": "run_python", "arguments": {"code": "x", "session": "main"}}}`))
	req.Header.Set("Authorization", "Bearer tok-c")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", a.ID())
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 403, resp.StatusCode, "%s", got)
	require.NotContains(t, string(got), "from a")

	// SIGTERM with both clients connected (their event streams open and
	// a session each) and a call in flight: new clients are refused, the
	// call is answered, the MCP sessions end and the process exits 0.
	mark := filepath.Join(dir, "call")
	answer := make(chan string, 1)
	go func() {
		res, err := a.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"profile": "w",
			"code": "open(" + string(mustJSON(t, mark)) + ", 'w').close()\nimport time; time.sleep(1); print('call done')"}})
		if err != nil {
			answer <- err.Error()
			return
		}
		answer <- res.Content[0].(*mcp.TextContent).Text
	}()
	awaitMarkFile(t, mark)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { code, _ := s.do(t, "GET", "/readyz", "", ""); return code == 503 },
		time.Minute, 5*time.Millisecond)
	code, body := s.do(t, "POST", "/v1/mcp", "tok-a", `{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}`)
	require.Equal(t, 503, code, body)
	require.Contains(t, <-answer, "[stdout]\ncall done\n", "the call in flight was answered")
	require.NoError(t, s.cmd.Wait(), "stderr: %s", s.stderr.String())
}

// TestServeMCPRefusesWebPages: /v1/mcp on a server without tokens
// answers with the guard's refusals of every /v1/* path: a foreign Origin
// and a Host a web page could own (DNS rebinding) get 403 before the
// MCP handler sees the request.
func TestServeMCPRefusesWebPages(t *testing.T) {
	t.Parallel()
	s := startServe(t, t.TempDir())
	port := s.base[strings.LastIndex(s.base, ":")+1:]
	for _, tc := range []struct{ host, origin, says string }{
		{"", "http://evil.example", `Origin \"http://evil.example\" is not this server`},
		{"evil.example:" + port, "", `Host \"evil.example:` + port + `\": without --token-file`},
	} {
		req, err := http.NewRequest("POST", s.base+"/v1/mcp", strings.NewReader(`{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}`))
		require.NoError(t, err)
		if tc.host != "" {
			req.Host = tc.host
		}
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 403, resp.StatusCode, "%+v: %s", tc, b)
		require.Contains(t, string(b), tc.says, "%+v", tc)
	}
}
