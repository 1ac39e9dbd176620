package jsonl

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// With SetInlineHost, a client of NewClient answers host calls on its one
// reader goroutine: calls awaited together reach the host one at a time,
// and each gets its own answer; an error
// and a panic still fail only their call.
func TestClientInlineHostOnReader(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	c := startClient(t, p)
	c.SetInlineHost(true)
	var running, most atomic.Int64
	var order []string
	host := func(_ context.Context, call *pynox.Call) (any, error) {
		n := running.Add(1)
		defer running.Add(-1)
		if n > most.Load() {
			most.Store(n)
		}
		var args []string
		if err := json.Unmarshal(call.Args, &args); err != nil || len(args) != 1 {
			return nil, fmt.Errorf("args %s", call.Args)
		}
		order = append(order, args[0])
		time.Sleep(20 * time.Millisecond) // room for another call to overlap, were it run elsewhere
		switch args[0] {
		case "bad":
			return nil, fmt.Errorf("no %s today", args[0])
		case "boom":
			panic("secret detail")
		}
		return "hit " + args[0], nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := c.Run(ctx, pynox.Job{Code: "import asyncio\nfrom pynox_host import aio, HostError\n" +
		"async def one(x):\n    try:\n        return await aio.f(x)\n    except HostError as e:\n        return str(e)\n" +
		"async def main():\n    return await asyncio.gather(one('a'), one('bad'), one('boom'), one('b'))\nprint(asyncio.run(main()))",
		Functions: []string{"f"}, Host: host})
	require.NoError(t, err)
	requireOK(t, res)
	require.Equal(t, "['hit a', 'no bad today', 'the host function failed', 'hit b']\n", res.Stdout)
	require.Equal(t, int64(1), most.Load(), "inline host calls overlapped")
	require.ElementsMatch(t, []string{"a", "bad", "boom", "b"}, order)
	require.Equal(t, 4, res.Calls)
}
