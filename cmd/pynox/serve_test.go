package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// serveProc is a running `pynox serve`.
type serveProc struct {
	cmd    *exec.Cmd
	base   string // http://127.0.0.1:PORT
	stderr *syncBuffer
}

// startServe starts `pynox serve --listen=127.0.0.1:0 args...` in dir and
// waits for the address it prints.
func startServe(t *testing.T, dir string, args ...string) *serveProc {
	t.Helper()
	cmd := exec.Command(pynoxBinary(t), append([]string{"serve", "--listen=127.0.0.1:0", "--python=" + testenv.Python()}, args...)...)
	cmd.Dir = dir
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

func (s *serveProc) wsURL() string { return "ws" + strings.TrimPrefix(s.base, "http") + "/v1/pool" }

// get does a GET with an optional bearer token and returns the status and body.
func (s *serveProc) do(t *testing.T, method, path, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if method == "POST" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// wsProc is one WebSocket connection to /v1/pool, with the line
// interface of poolProc.
type wsProc struct {
	c     *websocket.Conn
	ready map[string]any
}

func dialPool(t *testing.T, s *serveProc, token string) (*wsProc, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	c, resp, err := websocket.Dial(ctx, s.wsURL(), &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		return nil, resp, err
	}
	c.SetReadLimit(16 << 20)
	t.Cleanup(func() { c.CloseNow() })
	w := &wsProc{c: c}
	w.ready = w.next(t)
	require.Equal(t, "ready", w.ready["event"])
	return w, resp, nil
}

func (w *wsProc) send(t *testing.T, line string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, w.c.Write(ctx, websocket.MessageText, []byte(line)))
}

func (w *wsProc) next(t *testing.T) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	typ, b, err := w.c.Read(ctx)
	require.NoError(t, err)
	require.Equal(t, websocket.MessageText, typ)
	require.NotContains(t, string(b), "\n", "one line per message")
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

// lineConn is what the protocol transcript needs of a transport.
type lineConn interface {
	send(t *testing.T, line string)
	next(t *testing.T) map[string]any
}

// transcript plays requests one at a time over c, answering call events
// with a fixed reply, and returns every line each request brought, the
// fields that vary from run to run (durations, scratch paths, uptime)
// removed.
func transcript(t *testing.T, c lineConn, requests []string) [][]map[string]any {
	t.Helper()
	var out [][]map[string]any
	for _, req := range requests {
		var want any
		var probe map[string]any
		if json.Unmarshal([]byte(req), &probe) == nil {
			want = probe["id"]
		}
		c.send(t, req)
		var got []map[string]any
		for {
			l := c.next(t)
			normalize(l)
			got = append(got, l)
			if l["event"] == "call" {
				c.send(t, fmt.Sprintf(`{"reply": {"call_id": %v, "result": ["first hit", "second hit"]}}`, l["call_id"]))
				continue
			}
			if fmt.Sprint(l["id"]) == fmt.Sprint(want) {
				break
			}
		}
		out = append(out, got)
	}
	return out
}

func normalize(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if strings.HasSuffix(k, "_ms") || strings.HasSuffix(k, "_us") || strings.HasSuffix(k, "_total") || k == "scratch" || k == "usage" {
				delete(v, k)
				continue
			}
			normalize(x)
		}
	case []any:
		for _, x := range v {
			normalize(x)
		}
	}
}

// TestServeWebSocketIsThePipe: the same requests over `pynox pool`'s
// pipe and over `pynox serve`'s WebSocket bring the same answers, line
// for line (ready event, jobs, refusals, a session's steps, a host call
// and its reply, stats), and each message is one line.
func TestServeWebSocketIsThePipe(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requests := []string{
		`{"id": 1, "code": "print(6 * 7)"}`,
		`{"id": "err", "code": "1/0"}`,
		`not json at all`,
		`{"id": "bogus", "code": "1", "bogus": true}`,
		`{"id": "s1", "session": "nb", "code": "x = 41"}`,
		`{"id": "s2", "session": "nb", "code": "print(x + 1)"}`,
		`{"id": "h1", "functions": ["search"], "code": "from pynox_host import search\nprint(search('pynox', limit=2))"}`,
		`{"id": "s3", "session": "nb", "close": true}`,
		`{"id": "s4", "session": "nb", "close": true}`,
		`{"id": "stats", "stats": true}`,
	}
	pipe := startPoolIn(t, t.TempDir(), "--python="+testenv.Python())
	overPipe := transcript(t, pipe, requests)

	s := startServe(t, t.TempDir())
	ws, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	overWS := transcript(t, ws, requests)

	normalize(pipe.ready)
	normalize(ws.ready)
	require.Equal(t, pipe.ready, ws.ready)
	require.Equal(t, overPipe, overWS)
	require.Equal(t, "42\n", overWS[0][0]["stdout"])
	require.Equal(t, "42\n", overWS[5][0]["stdout"])
	require.Equal(t, "call", overWS[6][0]["event"])
	require.Equal(t, "['first hit', 'second hit']\n", overWS[6][1]["stdout"])
	require.Equal(t, "RequestError", overWS[8][0]["error"].(map[string]any)["type"], "a second close")
}

// TestServeSessionsEndWithTheirConnection: a session belongs to the
// connection that opened it; another connection does not see it, and
// closing the connection ends it.
func TestServeSessionsEndWithTheirConnection(t *testing.T) {
	t.Parallel()
	s := startServe(t, t.TempDir())
	a, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	a.send(t, `{"id": 1, "session": "nb", "code": "x = 'from a'"}`)
	require.Nil(t, a.next(t)["error"])
	b, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	b.send(t, `{"id": 2, "session": "nb", "code": "print(x)"}`)
	r := b.next(t)
	require.Equal(t, "NameError", r["error"].(map[string]any)["type"], "b's nb is its own: %v", r)
	b.send(t, `{"id": 3, "stats": true}`)
	require.Equal(t, json.Number("2"), json.Number(fmt.Sprint(b.next(t)["sessions_active"])))
	require.NoError(t, a.c.Close(websocket.StatusNormalClosure, ""))
	require.Eventually(t, func() bool {
		b.send(t, `{"id": 4, "stats": true}`)
		return fmt.Sprint(b.next(t)["sessions_active"]) == "1"
	}, time.Minute, 50*time.Millisecond, "a's session ends with a's connection")
}

// TestServeRun: POST /v1/run answers one request with one result, and
// refuses what needs the stream, naming the field.
func TestServeRun(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	s := startServe(t, t.TempDir())
	code, body := s.do(t, "POST", "/v1/run", "", `{"id": 1, "code": "print(6 * 7)"}`)
	require.Equal(t, 200, code, body)
	var r map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &r))
	require.Equal(t, "42\n", r["stdout"])
	require.Equal(t, json.Number("1"), json.Number(fmt.Sprint(r["id"])))
	require.Nil(t, r["error"])
	for field, req := range map[string]string{
		"session":   `{"id": 2, "session": "nb", "code": "x = 1"}`,
		"functions": `{"id": 3, "functions": ["search"], "code": "1"}`,
		"stats":     `{"id": 4, "stats": true}`,
		"stream":    `{"id": 5, "stream": true, "code": "1"}`,
	} {
		code, body := s.do(t, "POST", "/v1/run", "", req)
		require.Equal(t, 200, code, body)
		require.NoError(t, json.Unmarshal([]byte(body), &r))
		e := r["error"].(map[string]any)
		require.Equal(t, "RequestError", e["type"], field)
		require.Contains(t, e["message"], field+": a single request (POST /v1/run)", field)
	}
	code, body = s.do(t, "POST", "/v1/run", "", `{"id": "bad", "code": 5}`)
	require.Equal(t, 200, code)
	require.Contains(t, body, "code: expected a string")
	code, body = s.do(t, "POST", "/v1/run", "", `{"id": "big", "code": "`+strings.Repeat("x", 1<<20)+`"}`)
	require.Equal(t, 200, code)
	require.Contains(t, body, "exceeds 1048576 bytes")
	code, _ = s.do(t, "GET", "/v1/run", "", "")
	require.Equal(t, http.StatusMethodNotAllowed, code)
	code, body = s.do(t, "GET", "/healthz", "", "")
	require.Equal(t, 200, code, body)
	code, body = s.do(t, "GET", "/readyz", "", "")
	require.Equal(t, 200, code, body)
}

// TestServeTokens: without a token file the server will not listen
// beyond loopback; with one, /v1/* need a listed bearer token (the
// probes do not), and SIGHUP rereads the file.
func TestServeTokens(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var errb bytes.Buffer
	cmd := exec.Command(pynoxBinary(t), "serve", "--listen=0.0.0.0:0", "--python="+testenv.Python())
	cmd.Dir, cmd.Stderr = dir, &errb
	err := cmd.Run()
	require.Error(t, err)
	require.Equal(t, 1, cmd.ProcessState.ExitCode())
	require.Contains(t, errb.String(), "--listen=0.0.0.0:0: without --token-file the server listens on loopback addresses only")

	// Outside the working directory (the read ceiling), where the
	// self-confined server cannot read: SIGHUP rereads it all the same.
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("# comment\n\n"), 0o600))
	errb.Reset()
	cmd = exec.Command(pynoxBinary(t), "serve", "--listen=127.0.0.1:0", "--token-file="+tokens)
	cmd.Dir, cmd.Stderr = dir, &errb
	require.Error(t, cmd.Run())
	require.Contains(t, errb.String(), "--token-file="+tokens+": the file holds no token")

	require.NoError(t, os.WriteFile(tokens, []byte("tok-a\n  tok-c  \n"), 0o600))
	s := startServe(t, dir, "--token-file="+tokens)
	for _, p := range []string{"/healthz", "/readyz"} {
		code, _ := s.do(t, "GET", p, "", "")
		require.Equal(t, 200, code, p)
	}
	job := `{"id": 1, "code": "print(6 * 7)"}`
	for _, tok := range []string{"", "tok-b", "tok-", "tok-aa", "tok-a tok-c"} {
		code, body := s.do(t, "POST", "/v1/run", tok, job)
		require.Equal(t, 401, code, "token %q: %s", tok, body)
		_, resp, err := dialPool(t, s, tok)
		require.Error(t, err, "token %q", tok)
		require.Equal(t, 401, resp.StatusCode)
	}
	req, _ := http.NewRequest("POST", s.base+"/v1/run", strings.NewReader(job))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Basic tok-a")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 401, resp.StatusCode, "not a bearer token")
	for _, tok := range []string{"tok-a", "tok-c"} {
		code, body := s.do(t, "POST", "/v1/run", tok, job)
		require.Equal(t, 200, code, body)
		require.Contains(t, body, `"stdout":"42\n"`)
	}
	ws, _, err := dialPool(t, s, "tok-a")
	require.NoError(t, err)
	ws.send(t, job)
	require.Equal(t, "42\n", ws.next(t)["stdout"])

	// SIGHUP: tok-b replaces tok-a and tok-c.
	require.NoError(t, os.WriteFile(tokens, []byte("tok-b\n"), 0o600))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(s.stderr.String(), "reloaded --token-file") },
		time.Minute, 10*time.Millisecond)
	code, _ := s.do(t, "POST", "/v1/run", "tok-a", job)
	require.Equal(t, 401, code)
	code, body := s.do(t, "POST", "/v1/run", "tok-b", job)
	require.Equal(t, 200, code, body)
	// A file that cannot be read keeps the tokens in use.
	require.NoError(t, os.Remove(tokens))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(s.stderr.String(), "the tokens in use stay") },
		time.Minute, 10*time.Millisecond)
	code, body = s.do(t, "POST", "/v1/run", "tok-b", job)
	require.Equal(t, 200, code, body)
}

// TestServeSIGTERMDrains: SIGTERM fails /readyz and refuses new work at
// once, lets the job in flight finish and answers it, then the process
// exits 0.
func TestServeSIGTERMDrains(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	dir := t.TempDir()
	s := startServe(t, dir, "--workers=1", "--allow-write="+dir)
	ws, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	mark := filepath.Join(dir, "job")
	ws.send(t, startedJob(t, "job", mark, "import time; time.sleep(1); print('job done')"))
	// A session step in flight on a second connection, and one queued
	// behind it.
	ws2, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	smark := mustJSON(t, filepath.Join(dir, "step"))
	ws2.send(t, string(mustJSON(t, map[string]any{"id": "s1", "session": "s", "allow_write": []string{dir},
		"code": "open(" + string(smark) + ", 'w').close()\nimport time; time.sleep(1); print('step done')"})))
	ws2.send(t, `{"id": "s2", "session": "s", "code": "print('queued step ran')"}`)
	awaitMarkFile(t, mark)
	awaitMarkFile(t, filepath.Join(dir, "step"))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { code, _ := s.do(t, "GET", "/readyz", "", ""); return code == 503 },
		time.Minute, 5*time.Millisecond)
	code, body := s.do(t, "POST", "/v1/run", "", `{"id": 1, "code": "1"}`)
	require.Equal(t, 503, code, body)
	require.Contains(t, body, "shutting down")
	code, _ = s.do(t, "GET", "/healthz", "", "")
	require.Equal(t, 200, code)
	r := ws.next(t)
	require.Equal(t, "job", r["id"])
	require.Equal(t, "job done\n", r["stdout"], "the job in flight finished: %v", r)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, err = ws.c.Read(ctx)
	require.Equal(t, websocket.StatusGoingAway, websocket.CloseStatus(err), "%v", err)
	got := map[string]map[string]any{}
	for range 2 {
		r := ws2.next(t)
		got[r["id"].(string)] = r
	}
	require.Equal(t, "step done\n", got["s1"]["stdout"])
	require.Contains(t, got["s2"]["error"].(map[string]any)["message"], "shutting down")
	require.NoError(t, s.cmd.Wait(), "stderr: %s", s.stderr.String())
}

// TestServeSecondSIGTERMKills: a second SIGTERM ends the drain: the job
// still running is killed and answered, and the process exits 0.
func TestServeSecondSIGTERMKills(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	dir := t.TempDir()
	s := startServe(t, dir, "--workers=1", "--allow-write="+dir)
	ws, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	mark := filepath.Join(dir, "job")
	ws.send(t, startedJob(t, "long", mark, "import time; time.sleep(25); print('finished')"))
	awaitMarkFile(t, mark)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { code, _ := s.do(t, "GET", "/readyz", "", ""); return code == 503 },
		time.Minute, 5*time.Millisecond)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	r := ws.next(t)
	require.Equal(t, "long", r["id"])
	require.NotNil(t, r["error"], "killed, not finished: %v", r)
	require.Empty(t, r["stdout"])
	require.NoError(t, s.cmd.Wait(), "stderr: %s", s.stderr.String())
}

// vmRSS returns a process's resident set size in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestServeClientThatDoesNotRead: a client sends 60 jobs of 1 MB output
// each and reads nothing. The server stops running its jobs once the
// connection's writes block, and its memory stays within a bound well
// below the 60 MB (and more, encoded) the results would take; when the
// client reads at last, every result arrives whole.
func TestServeClientThatDoesNotRead(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	const n = 60
	s := startServe(t, t.TempDir(), "--workers=1", "--write-timeout=10m")
	stats, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	jobs := func() int64 {
		stats.send(t, `{"id": "s", "stats": true}`)
		v, err := strconv.ParseInt(fmt.Sprint(stats.next(t)["jobs"]), 10, 64)
		require.NoError(t, err)
		return v
	}
	stats.send(t, `{"id": "warm", "code": "print('x' * 1000000)"}`)
	require.Len(t, stats.next(t)["stdout"], 1000001)
	base := vmRSS(t, s.cmd.Process.Pid)

	slow, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	for i := range n {
		slow.send(t, fmt.Sprintf(`{"id": %d, "code": "print('x' * 1000000)"}`, i))
	}
	// Wait until the server stops running the slow client's jobs.
	last := int64(-1)
	require.Eventually(t, func() bool {
		j := jobs()
		steady := j == last && j > 1
		last = j
		return steady
	}, 5*time.Minute, time.Second)
	rss := vmRSS(t, s.cmd.Process.Pid)
	t.Logf("jobs run while the client did not read: %d of %d; RSS %d MiB before, %d MiB after", last-1, n, base>>20, rss>>20)
	require.Less(t, last-1, int64(n), "backpressure stopped the jobs")
	require.Less(t, rss-base, int64(48<<20), "the server's memory grew by %d MiB", (rss-base)>>20)

	seen := map[string]bool{}
	for range n {
		r := slow.next(t)
		require.Len(t, r["stdout"], 1000001)
		seen[fmt.Sprint(r["id"])] = true
	}
	require.Len(t, seen, n)
}

// TestServeHelpAndFlagErrors: the help lists serve and its flags, and
// mistakes name the flag and what it takes, before anything starts.
func TestServeHelpAndFlagErrors(t *testing.T) {
	var out, errb strings.Builder
	require.Equal(t, 0, run([]string{"--help"}, strings.NewReader(""), &out, &errb))
	require.Contains(t, out.String(), "pynox serve [flags]")
	for _, args := range [][]string{{"serve", "--help"}, {"serve", "-h"}, {"serve", "help"}, {"help", "serve"}} {
		out.Reset()
		require.Equal(t, 0, run(args, strings.NewReader(""), &out, &errb), "%q", args)
		require.Contains(t, out.String(), "Usage: pynox serve --listen=ADDR [flags]", "%q", args)
	}
	for _, name := range []string{"listen", "token-file", "max-conns", "drain-timeout", "write-timeout", "idle-timeout"} {
		require.Contains(t, serveUsage, "--"+name+"=", name)
	}
	for _, name := range keyFlags {
		require.Contains(t, serveUsage, "--"+name, "serve takes every pool flag: %s", name)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve"}, "pynox serve: --listen=ADDR is required, as in --listen=127.0.0.1:8080\n"},
		{[]string{"serve", "--listen=127.0.0.1:0", "--max-conns=0"}, "pynox serve: --max-conns=0: expected a positive integer\n"},
		{[]string{"serve", "--listen=127.0.0.1:0", "--drain-timeout=0s"}, "pynox serve: --drain-timeout=0s: expected a positive duration, as in 30s\n"},
		{[]string{"serve", "--bogus"}, "pynox serve: unknown flag --bogus\nRun \"pynox serve --help\" for the flags.\n"},
		{[]string{"serve", "--workers=0"}, "pynox serve: --workers=0: expected a positive integer\n"},
		{[]string{"serve", "extra"}, "pynox serve: unexpected argument \"extra\": pynox serve takes flags only\n"},
	} {
		errb.Reset()
		require.Equal(t, 2, run(tc.args, strings.NewReader(""), &out, &errb), "%q", tc.args)
		require.True(t, strings.HasPrefix(errb.String(), tc.want), "%q: got %q", tc.args, errb.String())
	}
}

// TestServeLimits: --max-conns bounds the connections (and runs) served
// at once, a message beyond the line cap closes its connection with
// status 1009, and a binary message with 1003.
func TestServeLimits(t *testing.T) {
	t.Parallel()
	s := startServe(t, t.TempDir(), "--max-conns=1")
	a, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	_, resp, err := dialPool(t, s, "")
	require.Error(t, err)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	code, body := s.do(t, "POST", "/v1/run", "", `{"id": 1, "code": "print(1)"}`)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "--max-conns=1")
	code, _ = s.do(t, "GET", "/readyz", "", "")
	require.Equal(t, 200, code, "the probes are not connections")

	// One line of exactly the cap (a JSON object padded with blanks) is
	// served; one byte more closes the connection.
	line := `{"id": "cap", "code": "print(1)"}`
	a.send(t, line+strings.Repeat(" ", 1<<20-len(line)))
	require.Equal(t, "1\n", a.next(t)["stdout"])
	a.send(t, line+strings.Repeat(" ", 1<<20-len(line)+2))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, err = a.c.Read(ctx)
	require.Equal(t, websocket.StatusMessageTooBig, websocket.CloseStatus(err), "%v", err)

	// The slot is free again once the server has let the connection go.
	var b *wsProc
	require.Eventually(t, func() bool {
		var err error
		b, _, err = dialPool(t, s, "")
		return err == nil
	}, time.Minute, 10*time.Millisecond)
	require.NoError(t, b.c.Write(ctx, websocket.MessageBinary, []byte(line)))
	_, _, err = b.c.Read(ctx)
	require.Equal(t, websocket.StatusUnsupportedData, websocket.CloseStatus(err), "%v", err)
}

// TestServeRefusesWebPages: a web page the user visits cannot use the
// server: not by a cross-origin POST (an Origin other than the server's,
// or a Content-Type a page may send without a preflight), nor through a
// name of its own that resolves to the loopback address (DNS
// rebinding), which a server without tokens refuses by its Host header.
func TestServeRefusesWebPages(t *testing.T) {
	t.Parallel()
	s := startServe(t, t.TempDir())
	job := `{"id": 1, "code": "print(6 * 7)"}`
	send := func(host, origin, ctype string) (int, string) {
		req, err := http.NewRequest("POST", s.base+"/v1/run", strings.NewReader(job))
		require.NoError(t, err)
		if host != "" {
			req.Host = host
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		req.Header.Set("Content-Type", ctype)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	port := s.base[strings.LastIndex(s.base, ":")+1:]
	for _, tc := range []struct {
		host, origin, ctype string
		code                int
		says                string
	}{
		{"", "", "text/plain", 415, `Content-Type \"text/plain\": expected application/json`},
		{"", "", "application/x-www-form-urlencoded", 415, "expected application/json"},
		{"", "http://evil.example", "application/json", 403, `Origin \"http://evil.example\" is not this server`},
		{"evil.example:" + port, "", "application/json", 403, `Host \"evil.example:` + port + `\": without --token-file`},
		{"evil.example:" + port, "http://evil.example:" + port, "application/json", 403, "without --token-file"},
		{"", "", "application/json; charset=utf-8", 200, `"stdout":"42\n"`},
		{"localhost:" + port, "http://localhost:" + port, "application/json", 200, `"stdout":"42\n"`},
		{"[::1]:" + port, "", "application/json", 200, `"stdout":"42\n"`},
	} {
		code, body := send(tc.host, tc.origin, tc.ctype)
		require.Equal(t, tc.code, code, "%+v: %s", tc, body)
		require.Contains(t, body, tc.says, "%+v", tc)
	}
	// The WebSocket handshake: the same Host and Origin rules.
	for _, h := range []http.Header{{"Origin": {"http://evil.example"}}, {"Host": {"evil.example"}}} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		opts := &websocket.DialOptions{HTTPHeader: h}
		if hh := h.Get("Host"); hh != "" {
			opts.Host = hh
		}
		_, resp, err := websocket.Dial(ctx, s.wsURL(), opts)
		cancel()
		require.Error(t, err, "%v", h)
		require.Equal(t, 403, resp.StatusCode, "%v", h)
	}
}

// TestServeStalledClientIsLetGo: a client that takes no result for
// --write-timeout loses its connection, which frees its --max-conns slot
// for another; the stalled client then finds its connection ended (not
// held open with results pending).
func TestServeStalledClientIsLetGo(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	const n = 40
	s := startServe(t, t.TempDir(), "--workers=1", "--write-timeout=1s", "--max-conns=1")
	slow, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	for i := range n {
		slow.send(t, fmt.Sprintf(`{"id": %d, "code": "print('x' * 1000000)"}`, i))
	}
	// The slot frees once the server gives up on the stalled connection.
	require.Eventually(t, func() bool {
		code, _ := s.do(t, "POST", "/v1/run", "", `{"id": "other", "code": "print(1)"}`)
		return code == 200
	}, 2*time.Minute, 100*time.Millisecond)
	got := 0
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		_, _, err := slow.c.Read(ctx)
		if err != nil {
			require.NotErrorIs(t, err, context.DeadlineExceeded)
			break
		}
		got++
	}
	t.Logf("results the stalled client could still read: %d of %d", got, n)
	require.Less(t, got, n)
}
