package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestHostileReview36TokenlessStalledBody: a client with no token sends
// GET /healthz (or a request refused for its missing token) declaring a
// body it never sends. The server must not hold such a connection busy
// (not idle, so never one the connection bound may close) for longer
// than its timeouts: else a tokenless client fills the bound with them
// and every new connection is closed.
func TestHostileReview36TokenlessStalledBody(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	s := startServe(t, t.TempDir(), "--write-timeout=1s")
	host := strings.TrimPrefix(s.base, "http://")
	for _, req := range []string{
		"GET /healthz HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\n{",
		"POST /v1/run HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer wrong\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
		"GET /nowhere HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\n{",
		"GET /readyz HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{",
	} {
		c, err := net.Dial("tcp", host)
		require.NoError(t, err)
		_, err = fmt.Fprintf(c, req, host)
		require.NoError(t, err)
		start := time.Now()
		require.NoError(t, c.SetReadDeadline(time.Now().Add(40*time.Second)))
		b, err := io.ReadAll(c)
		took := time.Since(start)
		c.Close()
		t.Logf("%q: %v after %v: %.80q", strings.SplitN(req, " HTTP", 2)[0], err, took, b)
		require.NoError(t, err, "the server held a tokenless connection with a stalled body open for %v", took)
		require.Less(t, took, 30*time.Second)
	}
}

// TestHostileReview36StalledBodiesFillConnBound: the same through the
// connection bound. Under RLIMIT_NOFILE 200 the bound is 136
// connections; a tokenless client holds more than that many stalled
// GET /healthz requests. Once --write-timeout (3s) has passed they are let
// go and a new client is served, rather than every new connection being
// closed for as long as the stalled ones stay open.
func TestHostileReview36StalledBodiesFillConnBound(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	cmd := exec.Command("prlimit", "--nofile=200:200", pynoxBinary(t), "serve", "--listen=127.0.0.1:0", "--python="+testenv.Python(), "--write-timeout=3s")
	cmd.Dir = t.TempDir()
	pipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "pynox serve: listening on "); ok {
				addr <- a
			}
		}
		close(addr)
	}()
	base, ok := <-addr
	require.True(t, ok)
	host := strings.TrimPrefix(base, "http://")
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 150 {
		c, err := net.Dial("tcp", host)
		require.NoError(t, err)
		held = append(held, c)
		_, err = fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\n{", host)
		require.NoError(t, err)
	}
	time.Sleep(time.Second) // the server reads their requests
	// A new client: served within a few seconds.
	end := time.Now().Add(15 * time.Second)
	for {
		resp, err := (&http.Client{Timeout: 3 * time.Second}).Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			return
		}
		require.True(t, time.Now().Before(end), "no new client served while a tokenless client holds stalled requests: %v", err)
		time.Sleep(200 * time.Millisecond)
	}
}
