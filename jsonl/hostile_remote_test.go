package jsonl

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// Probes of the remote pool against a hostile or broken server: what it
// sends ends the connection (ErrDisconnected), never the client process,
// and never holds more than DialOptions.ReadLimit of it in memory.

// hostileServer is a WebSocket server that sends first, then answers the
// first request line with then.
func hostileServer(t *testing.T, first string, then func(ctx context.Context, c *websocket.Conn)) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(1 << 20)
		ctx := r.Context()
		if c.Write(ctx, websocket.MessageText, []byte(first)) != nil {
			return
		}
		if _, _, err := c.Read(ctx); err != nil {
			return
		}
		then(ctx, c)
		// Hold the connection until the client ends it.
		for {
			if _, _, err := c.Read(ctx); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/pool"
}

const hostileReady = `{"event":"ready","workers":1,"runtime":"pynox","preloaded_modules":[],"package_dirs":[],"config":null,"profiles":[]}`

func TestHostileRemoteNotReady(t *testing.T) {
	url := hostileServer(t, `{"id":1,"exit":0}`, func(context.Context, *websocket.Conn) {})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := Dial(ctx, url, DialOptions{})
	require.ErrorIs(t, err, pynox.ErrDisconnected)
	require.Contains(t, err.Error(), "not a ready event")
}

func TestHostileRemoteOversizeMessage(t *testing.T) {
	url := hostileServer(t, hostileReady, func(ctx context.Context, c *websocket.Conn) {
		_ = c.Write(ctx, websocket.MessageText, []byte(`{"id":"go-1","stdout":"`+strings.Repeat("x", 2<<20)+`"}`))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := Dial(ctx, url, DialOptions{ReadLimit: 1 << 20, Keepalive: -1})
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Run(ctx, pynox.Job{Code: "print(1)"})
	require.ErrorIs(t, err, pynox.ErrDisconnected)
}

func TestHostileRemoteBinaryMessage(t *testing.T) {
	url := hostileServer(t, hostileReady, func(ctx context.Context, c *websocket.Conn) {
		_ = c.Write(ctx, websocket.MessageBinary, []byte(`{"id":"go-1","exit":0}`))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := Dial(ctx, url, DialOptions{Keepalive: -1})
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Run(ctx, pynox.Job{Code: "print(1)"})
	require.ErrorIs(t, err, pynox.ErrDisconnected)
}

// A call event for a job that declared no function, or for no job at
// all, is refused with an error reply; the host is never reached.
func TestHostileRemoteForgedCall(t *testing.T) {
	replies := make(chan string, 2)
	url := hostileServer(t, hostileReady, func(ctx context.Context, c *websocket.Conn) {
		_ = c.Write(ctx, websocket.MessageText, []byte(`{"event":"call","id":"go-1","call_id":7,"function":"rm","args":[],"kwargs":{}}`))
		_ = c.Write(ctx, websocket.MessageText, []byte(`{"event":"call","id":"nobody","call_id":8,"function":"rm","args":[],"kwargs":{}}`))
		for range 2 {
			_, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			replies <- string(b)
		}
		_ = c.Write(ctx, websocket.MessageText, []byte(`{"id":"go-1","exit":0,"stdout":"ok\n","stderr":"","error":null}`))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := Dial(ctx, url, DialOptions{Keepalive: -1})
	require.NoError(t, err)
	defer p.Close()
	res, err := p.Run(ctx, pynox.Job{Code: "print(1)"})
	require.NoError(t, err)
	require.Equal(t, "ok\n", res.Stdout)
	for range 2 {
		r := <-replies
		require.Contains(t, r, `"error":"the client has no host function for request`)
	}
}
