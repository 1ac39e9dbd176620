package main

// jsonl.Client.SetInlineHost (issue 12): a client of StartCmd whose host
// functions are declared cheap answers each call on the goroutine that
// read its call event; without it, each call runs on a goroutine of its
// own, so that calls that block run concurrently.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// With SetInlineHost, a job's host calls run on its Run caller's own
// goroutine (the one reading the pool's output), and are answered right.
func TestStartCmdClientInlineHostRunsOnReader(t *testing.T) {
	t.Parallel()
	c, stderr := startClientIn(t, t.TempDir(), "--python=/usr/bin/python3", "--workers=1")
	c.SetInlineHost(true)
	me := goroutineID()
	var mu sync.Mutex // without SetInlineHost the calls run on goroutines of their own
	var seen []string
	host := func(_ context.Context, call *pynox.Call) (any, error) {
		mu.Lock()
		seen = append(seen, goroutineID())
		mu.Unlock()
		var args []int
		if err := json.Unmarshal(call.Args, &args); err != nil || len(args) != 1 {
			return nil, fmt.Errorf("args %s", call.Args)
		}
		if args[0] == 3 {
			panic("secret detail")
		}
		return args[0] + 1, nil
	}
	r, err := c.Run(context.Background(), pynox.Job{Code: "from pynox_host import f, HostError\nx = 0\n" +
		"for i in range(3):\n    x = f(x)\ntry:\n    f(x)\nexcept HostError as e:\n    print(e)\nprint(x)",
		Functions: []string{"f"}, Host: host})
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.Equal(t, 0, r.Exit, "%+v", r)
	require.Equal(t, "the host function failed\n3\n", r.Stdout)
	require.Len(t, seen, 4)
	for _, g := range seen {
		require.Equal(t, me, g, "the host function ran on goroutine %s, not on the reading caller's %s", g, me)
	}

	// Off again: each call runs on a goroutine of its own.
	c.SetInlineHost(false)
	mu.Lock()
	seen = nil
	mu.Unlock()
	r, err = c.Run(context.Background(), pynox.Job{Code: "from pynox_host import f\nprint(f(f(0)))",
		Functions: []string{"f"}, Host: host})
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.Equal(t, "2\n", r.Stdout, "%+v", r)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2)
	for _, g := range seen {
		require.NotEqual(t, me, g, "without SetInlineHost the host function ran on the caller's goroutine")
	}
}

// With SetInlineHost, a host function that makes calls of its own through
// the same client (one with a ctx that cannot end, one with a ctx that
// can) gets their answers: the reader hands on its turn to read before it
// runs the host function.
func TestStartCmdClientInlineHostCallsNest(t *testing.T) {
	t.Parallel()
	c, stderr := startClientIn(t, t.TempDir(), "--python=/usr/bin/python3", "--workers=2")
	c.SetInlineHost(true)
	host := func(ctx context.Context, call *pynox.Call) (any, error) {
		var args []int
		if err := json.Unmarshal(call.Args, &args); err != nil || len(args) != 1 {
			return nil, fmt.Errorf("args %s", call.Args)
		}
		inner := context.Background()
		if args[0]%2 == 1 {
			var cancel context.CancelFunc
			inner, cancel = context.WithTimeout(ctx, time.Minute)
			defer cancel()
		}
		r, err := c.Run(inner, pynox.Job{Code: fmt.Sprintf("print(%d + 1)", args[0])})
		if err != nil {
			return nil, err
		}
		return strconv.Atoi(r.Stdout[:len(r.Stdout)-1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := c.Run(ctx, pynox.Job{Code: "from pynox_host import f\nx = 0\nfor i in range(6):\n    x = f(x)\nprint(x)",
		Functions: []string{"f"}, Host: host})
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.Equal(t, 0, r.Exit, "%+v", r)
	require.Equal(t, "6\n", r.Stdout)
}

// Without SetInlineHost, a job's calls awaited together run concurrently:
// a host function that waits for another call of the same job to start
// gets it.
func TestStartCmdClientHostCallsRunConcurrently(t *testing.T) {
	t.Parallel()
	c, stderr := startClientIn(t, t.TempDir(), "--python=/usr/bin/python3", "--workers=1")
	var mu sync.Mutex
	started := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	host := func(ctx context.Context, call *pynox.Call) (any, error) {
		var args []string
		if err := json.Unmarshal(call.Args, &args); err != nil || len(args) != 1 {
			return nil, fmt.Errorf("args %s", call.Args)
		}
		me, other := args[0], "b"
		if me == "b" {
			other = "a"
		}
		mu.Lock()
		close(started[me])
		mu.Unlock()
		select {
		case <-started[other]:
			return "both " + me, nil
		case <-time.After(time.Minute):
			return nil, fmt.Errorf("call %s never saw call %s start", me, other)
		}
	}
	r, err := c.Run(context.Background(), pynox.Job{Code: "import asyncio\nfrom pynox_host import aio\n" +
		"async def main():\n    return await asyncio.gather(aio.f('a'), aio.f('b'))\nprint(asyncio.run(main()))",
		Functions: []string{"f"}, Host: host, Timeout: 30 * time.Second})
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.Equal(t, 0, r.Exit, "%+v %+v", r, r.Error)
	require.Equal(t, "['both a', 'both b']\n", r.Stdout)
}
