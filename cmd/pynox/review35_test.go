package main

// The 35th outside review's probes of pynox serve's network front.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// review35Serve starts `pynox serve` with RLIMIT_NOFILE set to nofile
// (soft and hard), so that exhausting its descriptors is cheap.
func review35Serve(t *testing.T, nofile int, args ...string) *serveProc {
	t.Helper()
	all := append([]string{"serve", "--listen=127.0.0.1:0", "--python=" + testenv.Python()}, args...)
	cmd := exec.Command("/bin/sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, nofile), pynoxBinary(t)}, all...)...)
	cmd.Dir = t.TempDir()
	pipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	s := &serveProc{cmd: cmd, stderr: &syncBuffer{}}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(s.stderr, line)
			if a, ok := strings.CutPrefix(line, "pynox serve: listening on "); ok {
				addr <- a
			}
		}
		close(addr)
	}()
	a, ok := <-addr
	require.True(t, ok, "no address; stderr: %s", s.stderr.String())
	s.base = a
	return s
}

// TestReview35IdleConnectionsCannotLockOut: a client without a token
// opens TCP connections, sends each one GET /healthz (no token needed)
// and keeps them open as idle keep-alive connections (2 minutes each,
// renewable by another probe). Before, nothing bounded their number: at
// the process's descriptor limit accept failed with EMFILE, and every
// authenticated client's request timed out for as long as the flood
// lasted (20000 connections on the default limit). Now the server keeps
// descriptors in reserve and, at its connection bound, closes an idle
// connection to take a new one: the authenticated run is answered while
// the flood holds on, and the server serves after it.
func TestReview35IdleConnectionsCannotLockOut(t *testing.T) {
	testenv.Slow(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("tok-a\n"), 0o600))
	const nofile = 512
	s := review35Serve(t, nofile, "--workers=1", "--token-file="+tokens)
	host := strings.TrimPrefix(s.base, "http://")
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range nofile + 100 {
		c, err := net.DialTimeout("tcp", host, 5*time.Second)
		require.NoError(t, err)
		_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		require.NoError(t, err)
		flood = append(flood, c)
	}
	time.Sleep(time.Second)
	client := &http.Client{Timeout: 20 * time.Second}
	for i := range 3 {
		req, err := http.NewRequest("POST", s.base+"/v1/run", strings.NewReader(fmt.Sprintf(`{"id": %d, "code": "print(6 * 7)"}`, i)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer tok-a")
		resp, err := client.Do(req)
		require.NoError(t, err, "an authenticated run while unauthenticated idle connections hold the server's descriptors; stderr:\n%s", s.stderr.String())
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, "%s", b)
		require.Contains(t, string(b), `"stdout":"42\n"`)
	}
	// A WebSocket connection gets through too, and runs a session.
	w, _, err := dialPool(t, s, "tok-a")
	require.NoError(t, err)
	w.send(t, `{"id": "s", "session": "a", "code": "x = 7\nprint(x * 6)"}`)
	require.Equal(t, "42\n", w.next(t)["stdout"])
}

// review35MCP posts body to /v1/mcp with tok-a (and the session's id and
// protocol version when sid is set) and returns the status and body.
func review35MCP(t *testing.T, s *serveProc, sid, version, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest("POST", s.base+"/v1/mcp", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer tok-a")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", version)
	}
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestReview35MCPBatchIsOneRequest: an MCP client that negotiates
// protocol 2025-03-26 (whose streamable HTTP transport takes JSON-RPC
// batches) sent 100 run_python calls in one POST: one --max-conns place,
// 100 jobs queued in the pool, and another client's one-line /v1/run
// waited 47 s behind them (a 1 MiB body holds ~7000 calls). Now a batch
// of more than one request is refused with 400 naming why, before
// anything runs; a batch of one request, and notifications, still pass.
func TestReview35MCPBatchIsOneRequest(t *testing.T) {
	testenv.Slow(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("tok-a\n"), 0o600))
	s := startServe(t, t.TempDir(), "--workers=1", "--token-file="+tokens)
	const v = "2025-03-26"
	code, h, body := review35MCP(t, s, "", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"`+v+`","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	require.Equal(t, 200, code, body)
	sid := h.Get("Mcp-Session-Id")
	require.NotEmpty(t, sid)
	code, _, body = review35MCP(t, s, sid, v, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	require.Equal(t, http.StatusAccepted, code, body)

	var calls []string
	for i := range 20 {
		calls = append(calls, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"import time; time.sleep(0.5); print(%d)"}}}`, 10+i, i))
	}
	start := time.Now()
	code, _, body = review35MCP(t, s, sid, v, "["+strings.Join(calls, ",")+"]")
	require.Equal(t, http.StatusBadRequest, code, "a batch of 20 calls: %s", body)
	require.Contains(t, body, "a JSON-RPC batch of 20 requests")
	require.Contains(t, body, "one request per POST")
	require.Less(t, time.Since(start), 5*time.Second, "refused before anything ran")

	// Another client is not queued behind anything.
	start = time.Now()
	code, b := s.do(t, "POST", "/v1/run", "tok-a", `{"id": 1, "code": "print(42)"}`)
	require.Equal(t, 200, code, b)
	require.Less(t, time.Since(start), 5*time.Second)

	// A batch of one request (and a notification) is served, one answer.
	code, _, body = review35MCP(t, s, sid, v, `[{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}},{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"print(6 * 7)"}}}]`)
	require.Equal(t, 200, code, body)
	require.Equal(t, 1, strings.Count(body, `"id":7`), body)
	require.Contains(t, body, `42`)
}

// review35MCPSession opens an MCP session (protocol 2025-06-18) with
// token and returns its id.
func review35MCPSession(t *testing.T, s *serveProc, token string) string {
	t.Helper()
	post := func(sid, body string) (int, string, string) {
		req, err := http.NewRequest("POST", s.base+"/v1/mcp", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+token)
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), string(b)
	}
	code, sid, body := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	require.Equal(t, 200, code, body)
	require.NotEmpty(t, sid)
	code, _, body = post(sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	require.Equal(t, http.StatusAccepted, code, body)
	return sid
}

// review35Call posts one run_python call and waits up to wait for its
// answer; "" when none came (the POST is then abandoned: the connection
// is closed).
func review35Call(t *testing.T, s *serveProc, token, sid string, id int, code string, wait time.Duration) string {
	t.Helper()
	args, _ := json.Marshal(map[string]any{"code": code})
	req, err := http.NewRequest("POST", s.base+"/v1/mcp", strings.NewReader(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"run_python","arguments":%s}}`, id, args)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := (&http.Client{Timeout: wait, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return ""
	}
	return string(b)
}

// TestReview35MCPAbandonedCallsBounded: a POST to /v1/mcp holds its
// --max-conns place only while the client waits for the answer, but the
// SDK goes on with a tool call whose POST was abandoned (MCP says a
// disconnection is not a cancellation). Before, a client that posted 30
// calls of 1 s and dropped each after 0.3 s had 30 jobs queued in the
// pool while holding no place, and another client's run waited 20 s:
// without bound. Now the calls one token has under way, answered or not,
// are bounded by --max-inflight-per-conn; one more is answered at once
// with an error naming the flag, and another token's calls still run.
func TestReview35MCPAbandonedCallsBounded(t *testing.T) {
	testenv.Slow(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("tok-a\ntok-b\n"), 0o600))
	s := startServe(t, t.TempDir(), "--workers=1", "--token-file="+tokens, "--max-inflight-per-conn=3")
	a := review35MCPSession(t, s, "tok-a")
	refused := 0
	for i := range 12 {
		got := review35Call(t, s, "tok-a", a, 100+i, "import time; time.sleep(2)", 300*time.Millisecond)
		if strings.Contains(got, "--max-inflight-per-conn") {
			refused++
			require.Contains(t, got, fmt.Sprintf(`"id":%d`, 100+i), "one answer, to this call")
			require.Contains(t, got, "3 tool calls of this token are under way (the limit, --max-inflight-per-conn)")
		}
	}
	require.GreaterOrEqual(t, refused, 8, "abandoned calls beyond --max-inflight-per-conn=3 were taken")

	// Another token is not bounded by tok-a's calls.
	b := review35MCPSession(t, s, "tok-b")
	got := review35Call(t, s, "tok-b", b, 1, "print(6 * 7)", time.Minute)
	require.Contains(t, got, `42`, got)
	// Once tok-a's calls end, it may call again.
	require.Eventually(t, func() bool {
		return strings.Contains(review35Call(t, s, "tok-a", a, 7, "print(6 * 7)", time.Minute), "42")
	}, time.Minute, 500*time.Millisecond)
}

// review35Counts returns the server's open descriptors and its
// descendant processes. Descriptors of job cgroups are left out: the
// pool keeps the cgroups of ended jobs for reuse (internal/cgroup
// NewGroup), as many as jobs ever ran at once, a high-water mark.
func review35Counts(t *testing.T, pid int) (fds, procs int) {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return -1, -1 // the server is gone
	}
	for _, e := range ents {
		l, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + e.Name())
		if !strings.HasPrefix(l, "/sys/fs/cgroup/") {
			fds++
		}
	}
	return fds, len(descendants(pid))
}

// review35FDs lists what pid's descriptors are, and how many of each.
func review35FDs(pid int) string {
	ents, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	kinds := map[string]int{}
	for _, e := range ents {
		l, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + e.Name())
		if i := strings.Index(l, ":["); i >= 0 {
			l = l[:i]
		}
		kinds[l]++
	}
	return fmt.Sprint(kinds)
}

// TestReview35NoLeakPerConnection: 20 rounds of clients that go away
// abruptly mid-request: a WebSocket connection reset with a session open
// and a job and a step under way, a WebSocket half-closed (FIN) after a
// request, a /v1/run dropped mid-run, and an MCP client with a Python
// session that ends its MCP session (DELETE) while a call runs. The work
// they had sent runs to its end (docs/serve.md: ending a connection is
// the pipe's end of input; MCP does not cancel on disconnection); once
// it has, the server holds the descriptors and processes it held before,
// and serves.
func TestReview35NoLeakPerConnection(t *testing.T) {
	testenv.Slow(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("tok-a\n"), 0o600))
	s := startServe(t, t.TempDir(), "--workers=2", "--token-file="+tokens)
	pid := s.cmd.Process.Pid
	host := strings.TrimPrefix(s.base, "http://")
	var calls sync.WaitGroup
	var fds0, procs0 int
	for i := range 11 {
		if i == 1 {
			// Round 0 warmed every path up (the pool keeps per-job cgroups
			// for reuse, as many as jobs ran at once): the baseline is
			// taken once its work has ended.
			calls.Wait()
			time.Sleep(5 * time.Second)
			http.DefaultClient.CloseIdleConnections()
			fds0, procs0 = review35Counts(t, pid)
		}
		w, _, err := dialPool(t, s, "tok-a")
		require.NoError(t, err)
		w.send(t, `{"id": "s", "session": "a", "code": "x = 1"}`)
		require.Equal(t, "s", w.next(t)["id"])
		w.send(t, `{"id": "s2", "session": "a", "code": "import time; time.sleep(2)"}`)
		w.send(t, `{"id": "j", "code": "import time; time.sleep(2)"}`)
		time.Sleep(100 * time.Millisecond)
		w.c.CloseNow()

		// A WebSocket upgrade, a request, then FIN on the raw socket.
		c, err := net.Dial("tcp", host)
		require.NoError(t, err)
		fmt.Fprintf(c, "GET /v1/pool HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer tok-a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
		c.(*net.TCPConn).CloseWrite()
		time.Sleep(50 * time.Millisecond)
		c.Close()

		// A run dropped mid-run.
		req, _ := http.NewRequest("POST", s.base+"/v1/run", strings.NewReader(`{"id": 2, "code": "import time; time.sleep(2)"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer tok-a")
		_, err = (&http.Client{Timeout: 200 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		require.Error(t, err)

		// An MCP client with a session, ended (DELETE) while a call runs.
		sid := review35MCPSession(t, s, "tok-a")
		require.Contains(t, review35Call(t, s, "tok-a", sid, 1, "x = 41", time.Minute), `"id":1`)
		// (Work under way when its client goes runs to its end, by
		// design: docs/serve.md; 2 s here.)
		calls.Add(1)
		go func() {
			defer calls.Done()
			args := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"import time; time.sleep(2)","session":"m"}}}`
			req, _ := http.NewRequest("POST", s.base+"/v1/mcp", strings.NewReader(args))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Authorization", "Bearer tok-a")
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
			resp, err := (&http.Client{Timeout: 45 * time.Second}).Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		time.Sleep(300 * time.Millisecond)
		del, _ := http.NewRequest("DELETE", s.base+"/v1/mcp", nil)
		del.Header.Set("Authorization", "Bearer tok-a")
		del.Header.Set("Mcp-Session-Id", sid)
		del.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		resp, err := http.DefaultClient.Do(del)
		require.NoError(t, err)
		resp.Body.Close()
	}
	calls.Wait()
	http.DefaultClient.CloseIdleConnections()
	var fds, procs int
	deadline := time.Now().Add(20 * time.Second)
	for {
		fds, procs = review35Counts(t, pid)
		if fds >= 0 && fds <= fds0+2 && procs <= procs0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "before: %d descriptors, %d processes; after: %d, %d (-1: the server is gone); descriptors now:\n%s\nstderr:\n%s", fds0, procs0, fds, procs, review35FDs(pid), s.stderr)
		time.Sleep(200 * time.Millisecond)
	}
	code, body := s.do(t, "POST", "/v1/run", "tok-a", `{"id": 3, "code": "print(6 * 7)"}`)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"stdout":"42\n"`)
}

// TestReview35MCPIdOutOfRange: the SDK reads a numeric JSON-RPC id into
// an int64 through a float64: a ping with id
// 123456789012345678901234567890, or 2^63-1, was answered with id
// -9223372036854775808, which the client cannot match to its request. Now /v1/mcp refuses such an id with 400 naming it; an id
// within range and a string id are answered with themselves.
func TestReview35MCPIdOutOfRange(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("tok-a\n"), 0o600))
	s := startServe(t, t.TempDir(), "--workers=1", "--token-file="+tokens)
	sid := review35MCPSession(t, s, "tok-a")
	for _, id := range []string{"123456789012345678901234567890", "9223372036854775807", "9007199254740993", "1.5", "1e3"} {
		code, _, body := review35MCP(t, s, sid, "2025-06-18", `{"jsonrpc":"2.0","id":`+id+`,"method":"ping"}`)
		require.Equal(t, http.StatusBadRequest, code, "id %s: %s", id, body)
		require.Contains(t, body, "id "+id+": expected a string or an integer")
	}
	code, _, body := review35MCP(t, s, sid, "2025-06-18", `{"jsonrpc":"2.0","id":9007199254740992,"method":"ping"}`)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"id":9007199254740992,`)
	code, _, body = review35MCP(t, s, sid, "2025-06-18", `{"jsonrpc":"2.0","id":"123456789012345678901234567890","method":"ping"}`)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"id":"123456789012345678901234567890"`)
}
