package main

import (
	"fmt"
	"io"
	"net"
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
