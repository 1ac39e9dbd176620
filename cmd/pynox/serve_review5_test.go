package main

// The fifth outside review's probes of pynox serve's /v1/mcp.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// review5RSS returns the resident set of pid in bytes.
func review5RSS(t *testing.T, pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return n << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// review5Initialize opens one MCP session on /v1/mcp and returns the
// status and the session id.
func review5Initialize(t *testing.T, s *serveProc) (int, string) {
	req, err := http.NewRequest("POST", s.base+"/v1/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id")
}

// TestServeReview5MCPSessionFlood: a client opens MCP sessions and never
// uses them again; each would live up to --idle-timeout (an hour by
// default), ~15 KB each: before the bound, 3000 opened in 3 s took the
// server from 14 to 59 MiB, without end. Now at most maxMCPSessions are
// held; the next is refused with 503 saying why, and the server keeps
// serving (an MCP session ended frees a place).
func TestServeReview5MCPSessionFlood(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	s := startServe(t, t.TempDir())
	before := review5RSS(t, s.cmd.Process.Pid)
	const n = 3 * maxMCPSessions
	ok, refused := 0, 0
	var first string
	for range n {
		code, id := review5Initialize(t, s)
		switch code {
		case 200:
			ok++
			if first == "" {
				first = id
			}
		case 503:
			refused++
		default:
			t.Fatalf("initialize: status %d", code)
		}
	}
	after := review5RSS(t, s.cmd.Process.Pid)
	t.Logf("%d of %d sessions opened, %d refused; RSS %d -> %d KiB", ok, n, refused, before>>10, after>>10)
	require.Equal(t, maxMCPSessions, ok)
	require.Equal(t, n-maxMCPSessions, refused)

	// The refusal says why.
	req, err := http.NewRequest("POST", s.base+"/v1/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 503, resp.StatusCode)
	require.Contains(t, string(b), "MCP sessions already (the limit)")

	// A made-up session id does not pass the bound: the SDK opens no
	// session for it.
	for _, sid := range []string{"bogus", first + "x"} {
		req, err = http.NewRequest("POST", s.base+"/v1/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		resp, err = http.DefaultClient.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.NotEqual(t, 200, resp.StatusCode, "a made-up session id %q opened a session", sid)
	}

	// Ending one frees its place.
	req, err = http.NewRequest("DELETE", s.base+"/v1/mcp", nil)
	require.NoError(t, err)
	req.Header.Set("Mcp-Session-Id", first)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Less(t, resp.StatusCode, 300)
	code, _ := review5Initialize(t, s)
	require.Equal(t, 200, code)

	// The rest of the server serves on.
	code, body := s.do(t, "GET", "/readyz", "", "")
	require.Equal(t, 200, code, body)
	code, body = s.do(t, "POST", "/v1/run", "", `{"code": "print(6*7)"}`)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "42")
}

// TestServeReview5MCPSlowBody: a client that sends the body of a POST
// /v1/mcp a byte at a time (or never finishes it) held its --max-conns
// place for as long as it liked: reading the body is bounded by
// --write-timeout, like POST /v1/run's.
func TestServeReview5MCPSlowBody(t *testing.T) {
	testenv.Slow(t)
	s := startServe(t, t.TempDir(), "--max-conns=1", "--write-timeout=1s")
	c, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "POST /v1/mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{", strings.TrimPrefix(s.base, "http://"))
	require.NoError(t, err)
	c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	t.Logf("slow request got %q (%v)", buf[:n], err)
	// The slow request holds the only place for a while...
	require.Eventually(t, func() bool {
		code, _ := s.do(t, "POST", "/v1/run", "", `{"code": "print(1)"}`)
		return code == 503
	}, 5*time.Second, 20*time.Millisecond, "the slow request never held its place")
	// ...and gives it up once its body is late.
	require.Eventually(t, func() bool {
		code, _ := s.do(t, "POST", "/v1/run", "", `{"code": "print(1)"}`)
		return code == 200
	}, 10*time.Second, 100*time.Millisecond, "a POST /v1/mcp whose body never ends holds its --max-conns place")
}

// TestServeReview5MCPCallLongerThanWriteTimeout: the bound on reading a
// POST /v1/mcp's body does not end a tool call that runs longer.
func TestServeReview5MCPCallLongerThanWriteTimeout(t *testing.T) {
	t.Parallel()
	testenv.RequireLong(t, "a tool call of 2.5 s")
	s := startServe(t, t.TempDir(), "--write-timeout=1s")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := connectServeMCP(ctx, s, "")
	require.NoError(t, err)
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "import time\ntime.sleep(2.5)\nprint('slept')"}})
	require.NoError(t, err)
	b, err := json.Marshal(res.Content)
	require.NoError(t, err)
	require.Contains(t, string(b), "slept")
	require.False(t, res.IsError, "%s", b)
}
