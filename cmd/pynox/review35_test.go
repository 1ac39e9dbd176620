package main

// The 35th outside review's probes of pynox serve's network front.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
