package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// The seventh review's probes of the front door (pynox serve): tenants
// on separate connections, Host and Origin spellings, bearer-token
// spellings, and the single-request endpoint's stream-only fields. Each
// held; each stays as a regression test.

// TestServeReview7SessionsPerConnection: two WebSocket connections name
// the same session; each gets its own process, and neither can read,
// run code in, interrupt, close or dump the other's.
func TestServeReview7SessionsPerConnection(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	s := startServe(t, t.TempDir())
	a, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	b, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	a.send(t, `{"id": "a1", "session": "shared", "code": "secret = 'tenant-a'"}`)
	require.Equal(t, "a1", a.next(t)["id"])
	for _, line := range []string{
		`{"id": "b1", "session": "shared", "code": "print(globals().get('secret'))"}`,
		`{"id": "b2", "session": "shared", "interrupt": true}`,
		`{"id": "b3", "session": "shared", "dump": true}`,
		`{"id": "b4", "session": "shared", "close": true}`,
		`{"id": "b5", "cancel": "a1"}`,
	} {
		b.send(t, line)
		m := b.next(t)
		require.NotContains(t, string(mustJSON(t, m)), "tenant-a", "%s", line)
		if m["id"] == "b1" {
			require.Equal(t, "None\n", m["stdout"])
		}
	}
	a.send(t, `{"id": "a2", "session": "shared", "code": "print(secret)"}`)
	m := a.next(t)
	require.Equal(t, "a2", m["id"])
	require.Equal(t, "tenant-a\n", m["stdout"], "another connection ended or changed this connection's session")
}

// TestServeReview7HostAndOriginSpellings: a token-less server answers
// only localhost and loopback Host names and its own Origin; spellings a
// web page's own name can take (a trailing dot, a name that merely starts
// with localhost or 127.0.0.1, a userinfo Origin, Origin "null") are
// refused.
func TestServeReview7HostAndOriginSpellings(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	s := startServe(t, t.TempDir())
	port := s.base[strings.LastIndex(s.base, ":")+1:]
	send := func(host, origin string) int {
		req, err := http.NewRequest("POST", s.base+"/v1/run", strings.NewReader(`{"id": 1, "code": "print(1)"}`))
		require.NoError(t, err)
		if host != "" {
			req.Host = host
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	for _, host := range []string{
		"localhost.:" + port, "localhost.evil.example:" + port, "127.0.0.1.nip.io:" + port,
		"127.1:" + port, "0x7f000001:" + port, "2130706433:" + port, "[::ffff:7f00:1]x:" + port, "evil.example",
	} {
		require.Equal(t, 403, send(host, ""), "Host %q", host)
	}
	for _, origin := range []string{
		"null", "http://127.0.0.1:" + port + "@evil.example", "http://evil.example/#@127.0.0.1:" + port,
		"http://127.0.0.1:" + port + ".evil.example", "file://", "http://127.0.0.1",
	} {
		require.Equal(t, 403, send("", origin), "Origin %q", origin)
	}
	// What stays allowed: loopback names, in any case.
	require.Equal(t, 200, send("LOCALHOST:"+port, ""))
	require.Equal(t, 200, send("127.0.0.1:"+port, "http://127.0.0.1:"+port))
	// The WebSocket handshake with Origin "null" (a sandboxed frame).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, s.wsURL(), &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"null"}}})
	require.Error(t, err)
	require.Equal(t, 403, resp.StatusCode)
}

// TestServeReview7TokenSpellings: only "Bearer TOKEN" with a token of the
// file passes (the scheme in any case); a prefix or extension of a token,
// an empty token, the token in the query string or in another header, a
// comment line of the file used as a token, and a second Authorization
// header after a bad first one all get 401, on every /v1 path, MCP
// included.
func TestServeReview7TokenSpellings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokens := filepath.Join(t.TempDir(), "tokens") // outside the read ceiling (the working directory)
	require.NoError(t, os.WriteFile(tokens, []byte("# not-a-token\nsecret-token-1\n"), 0o600))
	s := startServe(t, dir, "--token-file="+tokens)
	try := func(path string, header http.Header, query string) int {
		method := "POST"
		body := `{"id": 1, "code": "print(1)"}`
		if path == "/v1/mcp" {
			body = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
		}
		req, err := http.NewRequest(method, s.base+path+query, strings.NewReader(body))
		require.NoError(t, err)
		for k, vs := range header {
			for _, v := range vs {
				req.Header.Add(k, v)
			}
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	for _, path := range []string{"/v1/run", "/v1/mcp"} {
		for _, h := range []http.Header{
			{},
			{"Authorization": {"Bearer secret-token"}},
			{"Authorization": {"Bearer secret-token-12"}},
			{"Authorization": {"Bearer "}},
			{"Authorization": {"Bearer"}},
			{"Authorization": {"Basic secret-token-1"}},
			{"Authorization": {"secret-token-1"}},
			{"Authorization": {"Bearer # not-a-token"}},
			{"Authorization": {"Bearer not-a-token"}},
			{"Authorization": {"Bearer x", "Bearer secret-token-1"}},
			{"X-Authorization": {"Bearer secret-token-1"}},
			{"Cookie": {"token=secret-token-1"}},
		} {
			require.Equal(t, 401, try(path, h, ""), "%s %v", path, h)
		}
		require.Equal(t, 401, try(path, nil, "?token=secret-token-1&access_token=secret-token-1"), path)
	}
	require.Equal(t, 200, try("/v1/run", http.Header{"Authorization": {"bearer secret-token-1"}}, ""))
	require.Equal(t, 200, try("/v1/run", http.Header{"Authorization": {"Bearer   secret-token-1  "}}, ""))
}

// TestServeReview7RunRefusesStreamFields: POST /v1/run runs one job and
// holds nothing after its answer: a session, host functions (even an
// empty list), a restore, a dump, a reply, a cancel or an interrupt are
// refused by name, each with one answer, and the server serves on.
func TestServeReview7RunRefusesStreamFields(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	s := startServe(t, t.TempDir())
	for field, line := range map[string]string{
		"session":   `{"id": 1, "code": "x = 1", "session": "s"}`,
		"functions": `{"id": 1, "code": "print(1)", "functions": []}`,
		"restore":   `{"id": 1, "code": "print(1)", "restore": "cHlub3hkAAEAAAAAAAAAAA=="}`,
		"dump":      `{"id": 1, "dump": true}`,
		"reply":     `{"id": 1, "reply": {"call_id": 1, "result": 1}}`,
		"cancel":    `{"id": 1, "cancel": 2}`,
		"interrupt": `{"id": 1, "interrupt": true}`,
	} {
		code, body := s.do(t, "POST", "/v1/run", "", line)
		require.Equal(t, 200, code, "%s: %s", field, body)
		require.Contains(t, body, `"RequestError"`, field)
		require.Contains(t, body, field+": a single request", field)
		require.Equal(t, 1, strings.Count(strings.TrimSpace(body), "\n")+1, "one answer: %s", body)
	}
	code, body := s.do(t, "POST", "/v1/run", "", `{"id": 2, "code": "print(6 * 7)"}`)
	require.Equal(t, 200, code)
	require.Contains(t, body, `"stdout":"42\n"`)
}

// review7EpollWatches is a session step that registers every one of n
// eventfds with each of up to m epoll instances (m*n watches) and keeps
// them, adding instances for at most 15 s per step; it prints the number
// of watches it holds.
const review7EpollWatches = `
import os, select, time
if "eps" not in globals():
    efds = [os.eventfd(0) for _ in range(%d)]
    eps = []
    n = 0
deadline = time.monotonic() + 15
try:
    while len(eps) < %d and time.monotonic() < deadline:
        ep = select.epoll()
        eps.append(ep)
        for fd in efds:
            ep.register(fd, select.EPOLLIN)
            n += 1
except OSError as e:
    print("stopped:", e)
print("watches", n, len(eps))
`

// TestServeReview7EpollWatchesExhausted: epoll watches are counted per
// uid across the machine (fs.epoll.max_user_watches) with no exemption
// for capabilities, and a job may hold millions: 2045 epoll instances
// each watching 2045 eventfds fit in its 4096 descriptors. Two sessions
// together exhaust the count for every process of the pool's uid, the
// server's own Go runtime included, whose accept then fails to register
// the new connection with its poller (ENOSPC). The server must not end
// on that: it retries, and serves again once the sessions are gone.
func TestServeReview7EpollWatchesExhausted(t *testing.T) {
	testenv.RequireLong(t, "two sessions registering ~5.5 million epoll watches")
	if os.Getenv("PYNOX_UIDWIDE") != "1" {
		// While it runs, every process of the uid fails to register a
		// descriptor with epoll: the other packages' tests, run at the same
		// time by go test ./..., saw their jobs' pipes break (BrokenPipeError).
		t.Skip("exhausts the uid's epoll watches machine-wide, breaking any test running beside it; .ci/run runs it alone with PYNOX_UIDWIDE=1")
	}
	b, err := os.ReadFile("/proc/sys/fs/epoll/max_user_watches")
	require.NoError(t, err)
	var max int
	_, err = fmt.Sscan(string(b), &max)
	require.NoError(t, err)
	if max > 8_000_000 {
		t.Skipf("max_user_watches is %d; two sessions cannot reach it", max)
	}
	s := startServe(t, t.TempDir())
	w, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	fill := func(session string, fds, epolls int) {
		for step := 0; step < 10; step++ {
			w.send(t, fmt.Sprintf(`{"id": "%s%d", "session": "%s", "timeout": "30s", "code": %q}`, session, step, session, fmt.Sprintf(review7EpollWatches, fds, epolls)))
			m := w.next(t)
			t.Logf("session %s: %v %v", session, m["stdout"], m["error"])
			require.Nil(t, m["error"])
			if strings.Contains(m["stdout"].(string), "stopped") || strings.HasSuffix(strings.TrimSpace(m["stdout"].(string)), fmt.Sprint(epolls)) {
				return
			}
		}
		t.Fatalf("session %s did not finish registering", session)
	}
	fill("a", 2045, 2045)
	rest := max - 2045*2045 + 10_000
	fill("b", 2000, rest/2000+1)
	// The count is exhausted now: new connections may fail, the server
	// must not end.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	for i := 0; i < 5; i++ {
		resp, err := fresh.Get(s.base + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		t.Logf("healthz on a new connection while exhausted: %v", err)
		time.Sleep(200 * time.Millisecond)
	}
	w.send(t, `{"id": "ca", "session": "a", "close": true}`)
	w.next(t)
	w.send(t, `{"id": "cb", "session": "b", "close": true}`)
	w.next(t)
	require.Eventually(t, func() bool {
		code, _ := s.do(t, "POST", "/v1/run", "", `{"id": 1, "code": "print(6 * 7)"}`)
		return code == 200
	}, 30*time.Second, 200*time.Millisecond, "the server does not serve after the sessions ended; stderr: %s", s.stderr.String())
	t.Logf("server stderr: %s", s.stderr.String())
}

// TestServeReview7JobsCannotBeClients: the server's own jobs must not be
// able to act as its clients. Before, a job granted the network (and no
// write grant) sent a request to a token-less server on loopback with a
// write grant of the ceiling, and it ran; and a token file in the working
// directory (the default read ceiling) was read by any job, every
// client's token with it. Now the server refuses to start without
// --token-file when the ceiling grants the network, and refuses a token
// file beneath a path a job may read; with tokens kept outside, a job
// with the network that calls the server gets 401.
func TestServeReview7JobsCannotBeClients(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	testenv.RequireSandbox(t)
	refused := func(t *testing.T, dir string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var errb bytes.Buffer
		cmd := exec.CommandContext(ctx, pynoxBinary(t), append([]string{"serve", "--listen=127.0.0.1:0", "--python=" + testenv.Python()}, args...)...)
		cmd.Dir, cmd.Stderr = dir, &errb
		require.Error(t, cmd.Run())
		require.Equal(t, 1, cmd.ProcessState.ExitCode(), "the server started: %s", errb.String())
		return errb.String()
	}
	netConf := func(t *testing.T, write string) string {
		conf := filepath.Join(t.TempDir(), "serve.toml")
		body := "[pool]\nworkers = 2\n\n[pool.limits]\nallow_network = true\n"
		if write != "" {
			body += "allow_write = [\"" + write + "\"]\n"
		}
		require.NoError(t, os.WriteFile(conf, []byte(body), 0o644))
		return conf
	}
	t.Run("network without tokens", func(t *testing.T) {
		msg := refused(t, t.TempDir(), "--config="+netConf(t, ""))
		require.Contains(t, msg, "allow_network")
		require.Contains(t, msg, "--token-file")
	})
	t.Run("token file in the read ceiling", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens"), []byte("tok\n"), 0o600))
		msg := refused(t, dir, "--token-file=tokens")
		require.Contains(t, msg, "--token-file=tokens lies beneath the read ceiling")
	})
	t.Run("token file in the write ceiling", func(t *testing.T) {
		w := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(w, "tokens"), []byte("tok\n"), 0o600))
		msg := refused(t, t.TempDir(), "--allow-write="+w, "--token-file="+filepath.Join(w, "tokens"))
		require.Contains(t, msg, "lies beneath the write ceiling")
	})
	t.Run("token file beneath a ceiling named through a symlink", func(t *testing.T) {
		real := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(real, "tokens"), []byte("tok\n"), 0o600))
		link := filepath.Join(t.TempDir(), "ceiling")
		require.NoError(t, os.Symlink(real, link))
		msg := refused(t, t.TempDir(), "--allow-read="+link, "--token-file="+filepath.Join(real, "tokens"))
		require.Contains(t, msg, "lies beneath the read ceiling")
	})
	t.Run("TLS key in the read ceiling", func(t *testing.T) {
		dir := t.TempDir()
		certPath, keyPath, _ := writeSelfSigned(t, dir, "pynox-key-readable")
		msg := refused(t, dir, "--tls-cert="+certPath, "--tls-key="+keyPath)
		require.Contains(t, msg, "--tls-key="+keyPath+" lies beneath the read ceiling")
		require.Contains(t, msg, "TLS private key")
	})
	t.Run("a job with the network calls the server", func(t *testing.T) {
		dir, w := t.TempDir(), t.TempDir()
		tokens := filepath.Join(t.TempDir(), "tokens")
		require.NoError(t, os.WriteFile(tokens, []byte("tok-a\n"), 0o600))
		s := startServe(t, dir, "--token-file="+tokens, "--config="+netConf(t, w))
		inner := fmt.Sprintf(`{"id": 2, "allow_write": [%q], "code": "open(%q, 'w').write('x')"}`, w, filepath.Join(w, "escalated"))
		outer := fmt.Sprintf(`import urllib.request, urllib.error
req = urllib.request.Request(%q, data=%q.encode(), headers={"Content-Type": "application/json"})
try:
    print(urllib.request.urlopen(req, timeout=20).status)
except urllib.error.HTTPError as e:
    print(e.code)
`, s.base+"/v1/run", inner)
		line, err := json.Marshal(map[string]any{"id": 1, "allow_network": true, "code": outer})
		require.NoError(t, err)
		code, body := s.do(t, "POST", "/v1/run", "tok-a", string(line))
		require.Equal(t, 200, code, body)
		require.Contains(t, body, `"stdout":"401\n"`)
		_, err = os.Stat(filepath.Join(w, "escalated"))
		require.True(t, os.IsNotExist(err), "the job's own request ran")
	})
}
