package jsonl

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// TestHostileRemoteCallFlood: a server that sends far more call events
// than MaxHostCalls for one request gets at most MaxHostCalls HostFunc
// calls (and goroutines) at once; each call beyond them is answered at
// once with an error reply naming the bound. The calls answered in time
// still get their results.
func TestHostileRemoteCallFlood(t *testing.T) {
	const flood = 3 * MaxHostCalls
	var refused, answered atomic.Int64
	release := make(chan struct{})
	url := hostileServer(t, hostileReady, func(ctx context.Context, c *websocket.Conn) {
		for i := range flood {
			line := fmt.Sprintf(`{"event":"call","id":"go-1","call_id":%d,"function":"f","args":[],"kwargs":{}}`, i)
			if c.Write(ctx, websocket.MessageText, []byte(line)) != nil {
				return
			}
		}
		// The replies that come before any host call returns: the
		// refusals, or, without the bound, the calls the host does not
		// hold.
		for i := range flood {
			if i == flood-MaxHostCalls {
				close(release)
			}
			_, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			switch {
			case i < flood-MaxHostCalls && contains(b, "at most 64 host calls"):
				refused.Add(1)
			case contains(b, `"result":"done"`):
				answered.Add(1)
			}
		}
		_ = c.Write(ctx, websocket.MessageText, []byte(`{"id":"go-1","exit":0,"stdout":"ok\n","stderr":"","error":null}`))
	})
	var mu sync.Mutex
	entered := 0
	host := func(ctx context.Context, call *pynox.Call) (any, error) {
		mu.Lock()
		entered++
		over := entered > MaxHostCalls
		mu.Unlock()
		if !over {
			<-release
		}
		return "done", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := DialClient(ctx, url, DialOptions{Keepalive: -1})
	require.NoError(t, err)
	defer c.Close()
	res, err := c.Run(ctx, pynox.Job{Functions: []string{"f"}, Host: host, Code: "1"})
	require.NoError(t, err)
	require.Equal(t, "ok\n", res.Stdout)
	require.Equal(t, MaxHostCalls, entered, "HostFunc calls made (the others were refused)")
	require.EqualValues(t, flood-MaxHostCalls, refused.Load(), "calls beyond the bound refused with an error reply")
	require.EqualValues(t, MaxHostCalls, answered.Load(), "the calls within the bound answered")
}

func contains(b []byte, s string) bool { return len(b) >= len(s) && strings.Contains(string(b), s) }
