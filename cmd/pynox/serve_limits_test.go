package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// waitCode is a job or session step that prints name once the file go
// exists in the working directory (the test creates it).
func waitCode(name string) string {
	return fmt.Sprintf(`import os, time\nwhile not os.path.exists('go'): time.sleep(0.01)\nprint('%s')`, name)
}

// TestServeMaxInFlightPerConn: a WebSocket connection with
// --max-inflight-per-conn requests accepted and unanswered gets one
// RequestError naming the flag for each further job or session step, and
// serves on: stats, and closes, are still answered, another connection
// runs jobs meanwhile, and once the answers are out the connection takes
// new work.
func TestServeMaxInFlightPerConn(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, dir, "--workers=2", "--max-inflight-per-conn=2")
	a, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	a.send(t, fmt.Sprintf(`{"id": "s1", "session": "one", "code": "%s"}`, waitCode("s1")))
	a.send(t, fmt.Sprintf(`{"id": "j1", "code": "%s"}`, waitCode("j1")))
	// Two in flight: the third job and a step of another session are
	// refused, each with one answer.
	a.send(t, `{"id": "j2", "code": "print(2)"}`)
	r := a.next(t)
	require.Equal(t, "j2", r["id"])
	e := r["error"].(map[string]any)
	require.Equal(t, "RequestError", e["type"])
	require.Equal(t, "2 requests of this connection are in flight (the limit, --max-inflight-per-conn); read their results before sending more", e["message"])
	a.send(t, `{"id": "s2", "session": "two", "code": "print(2)"}`)
	r = a.next(t)
	require.Equal(t, "s2", r["id"])
	require.Equal(t, "two", r["session"])
	require.Equal(t, "RequestError", r["error"].(map[string]any)["type"])
	a.send(t, `{"id": "st", "stats": true}`)
	require.Equal(t, "stats", a.next(t)["event"])

	// The pool serves another connection meanwhile.
	b, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	b.send(t, `{"id": "b", "code": "print(6 * 7)"}`)
	require.Equal(t, "42\n", b.next(t)["stdout"])

	require.NoError(t, os.WriteFile(filepath.Join(dir, "go"), nil, 0o600))
	got := map[string]string{}
	for range 2 {
		r := a.next(t)
		require.Nil(t, r["error"], "%v", r)
		got[fmt.Sprint(r["id"])] = fmt.Sprint(r["stdout"])
	}
	require.Equal(t, map[string]string{"s1": "s1\n", "j1": "j1\n"}, got)
	a.send(t, `{"id": "j3", "code": "print(3)"}`)
	require.Equal(t, "3\n", a.next(t)["stdout"])
	a.send(t, `{"id": "s3", "session": "one", "code": "print(4)"}`)
	require.Equal(t, "4\n", a.next(t)["stdout"])
	a.send(t, `{"id": "c", "session": "one", "close": true}`)
	require.Equal(t, true, a.next(t)["closed"])

	// The flag takes a positive integer.
	var out, errb strings.Builder
	require.Equal(t, 2, run([]string{"serve", "--listen=127.0.0.1:0", "--max-inflight-per-conn=0"}, strings.NewReader(""), &out, &errb))
	require.Equal(t, "pynox serve: --max-inflight-per-conn=0: expected a positive integer\n", errb.String())
}

// TestServeIdleTimeoutClosesSilentConnection: the read deadline: a
// connection that sends nothing for --idle-timeout is closed by the
// server, and its --max-conns place is free again.
func TestServeIdleTimeoutClosesSilentConnection(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	s := startServe(t, t.TempDir(), "--idle-timeout=1s", "--max-conns=1")
	a, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, err = a.c.Read(ctx)
	require.Error(t, err)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the server closed the connection")
	require.Eventually(t, func() bool {
		_, _, err := dialPool(t, s, "")
		return err == nil
	}, time.Minute, 10*time.Millisecond)
}

// mcpInitialize opens an MCP session on /v1/mcp with token and returns
// the status and the body.
func mcpInitialize(t *testing.T, s *serveProc, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", s.base+"/v1/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeMCPSessionsPerToken: --max-mcp-sessions-per-token bounds each
// token's MCP sessions apart: a token that has used up its places gets
// 503 naming the flag, and another token still opens sessions (before,
// 256 sessions of one token refused every other token's).
func TestServeMCPSessionsPerToken(t *testing.T) {
	t.Parallel()
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("tok-a\ntok-b\n"), 0o600))
	s := startServe(t, t.TempDir(), "--token-file="+tokens, "--max-mcp-sessions-per-token=3")
	for i := range 3 {
		code, body := mcpInitialize(t, s, "tok-a")
		require.Equal(t, 200, code, "session %d: %s", i, body)
	}
	code, body := mcpInitialize(t, s, "tok-a")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "this token holds 3 MCP sessions already (the limit): --max-mcp-sessions-per-token=3")
	for i := range 3 {
		code, body := mcpInitialize(t, s, "tok-b")
		require.Equal(t, 200, code, "tok-b session %d: %s", i, body)
	}
	code, _ = mcpInitialize(t, s, "tok-b")
	require.Equal(t, http.StatusServiceUnavailable, code)
}

// TestServeUsageNamesHardeningFlags: --help lists the flags of the
// serve hardening (each with its =VALUE form).
func TestServeUsageNamesHardeningFlags(t *testing.T) {
	for _, name := range []string{"max-inflight-per-conn", "max-mcp-sessions-per-token", "tls-cert", "tls-key"} {
		require.Contains(t, serveUsage, "--"+name+"=", name)
	}
}

// TestServeRunSlowBodyLetGo: the read deadline of POST /v1/run: a client
// that never finishes sending its body is answered 400 once
// --write-timeout has passed, and its --max-conns place (the only one)
// then serves another request.
func TestServeRunSlowBodyLetGo(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	s := startServe(t, t.TempDir(), "--max-conns=1", "--write-timeout=1s")
	c, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "POST /v1/run HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", strings.TrimPrefix(s.base, "http://"))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(2*time.Minute)))
	b, _ := io.ReadAll(c)
	require.Contains(t, string(b), "HTTP/1.1 400 ")
	require.Contains(t, string(b), "reading the request body")
	require.Contains(t, string(b), "i/o timeout")
	code, body := s.do(t, "POST", "/v1/run", "", `{"code": "print(1)"}`)
	require.Equal(t, http.StatusOK, code, body)
}
