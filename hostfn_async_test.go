package pynox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// gatherCode awaits aio.echo(i) for i < n together and prints the list.
func gatherCode(n int) string {
	return fmt.Sprintf("import asyncio\nfrom pynox_host import aio\n"+
		"async def main():\n    return await asyncio.gather(*(aio.echo(i) for i in range(%d)))\n"+
		"print(asyncio.run(main()))", n)
}

// TestAsyncHostCallsRunConcurrently: calls awaited together are all in
// the host at once (each handler waits until the three have arrived), and
// the gathered result is right.
func TestAsyncHostCallsRunConcurrently(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	var arrived sync.WaitGroup
	arrived.Add(3)
	all := make(chan struct{})
	go func() { arrived.Wait(); close(all) }()
	host := func(ctx context.Context, c *Call) (any, error) {
		var args []int
		require.NoError(t, json.Unmarshal(c.Args, &args))
		arrived.Done()
		select {
		case <-all:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return args[0] * 10, nil
	}
	res := run(t, p, Job{Functions: []string{"echo"}, Host: host, Timeout: 30 * time.Second, Code: gatherCode(3)})
	requireOK(t, res)
	require.Equal(t, "[0, 10, 20]\n", res.Stdout)
	require.Equal(t, 3, res.Calls)
}

// TestAsyncHostCallsCap: of 100 calls awaited together (or made by 100
// threads), exactly MaxInFlight are in flight at once: the others wait in
// the job (no deadlock), and every result is right.
func TestAsyncHostCallsCap(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	var cur, most atomic.Int64
	full := make(chan struct{})
	var once sync.Once
	host := func(ctx context.Context, c *Call) (any, error) {
		n := cur.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		if n == MaxInFlight {
			once.Do(func() { close(full) })
		}
		select {
		case <-full:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		cur.Add(-1)
		return json.RawMessage(c.Args), nil
	}
	want := make([]string, 100)
	for i := range want {
		want[i] = fmt.Sprintf("[%d]", i)
	}
	threads := "import threading\nthreading.stack_size(256 << 10)\nfrom pynox_host import echo\nout = [None] * 100\n" +
		"def w(i):\n    out[i] = echo(i)\nts = [threading.Thread(target=w, args=(i,)) for i in range(100)]\n" +
		"[t.start() for t in ts]\n[t.join() for t in ts]\nprint(out)"
	// Threads beyond the default 64 tasks of a job, for the sync calls.
	pt := newTestPool(t, Config{Workers: 1, Limits: Limits{Threads: 200}})
	for i, code := range []string{gatherCode(100), threads} {
		if i == 1 {
			p = pt
		}
		cur.Store(0)
		most.Store(0)
		full = make(chan struct{})
		once = sync.Once{}
		res := run(t, p, Job{Functions: []string{"echo"}, Host: host, Timeout: 30 * time.Second, Code: code})
		requireOK(t, res)
		require.Equal(t, fmt.Sprintf("%v\n", want), fmt.Sprintf("%v\n", parsePyList(res.Stdout)))
		require.Equal(t, int64(MaxInFlight), most.Load())
		require.Equal(t, 100, res.Calls)
	}
}

// parsePyList splits the printed list of one-element lists.
func parsePyList(s string) []string {
	var out []string
	var v [][]int
	if json.Unmarshal([]byte(s), &v) != nil {
		return []string{s}
	}
	for _, x := range v {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

// TestAsyncHostCallsCheckout: driving a checkout by hand, three awaited
// calls are all waiting before any answer (Wait collects them), are
// answered in reverse order by call id, and the gathered result is right.
func TestAsyncHostCallsCheckout(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{Functions: []string{"echo"}})
	require.NoError(t, err)
	defer co.Finish(ctx)
	ev, err := co.Feed(ctx, Step{Code: gatherCode(3)})
	require.NoError(t, err)
	require.NotNil(t, ev.Call)
	for len(ev.Calls) < 3 {
		ev, err = co.Wait(ctx)
		require.NoError(t, err)
		require.Nil(t, ev.Result)
	}
	byArg := map[string]int64{}
	for _, c := range ev.Calls {
		byArg[string(c.Args)] = c.ID
	}
	require.Len(t, byArg, 3)
	for i := 2; i >= 0; i-- {
		ev, err = co.Resume(ctx, byArg[fmt.Sprintf("[%d]", i)], Return(i*10))
		require.NoError(t, err)
		if i > 0 {
			require.Len(t, ev.Calls, i, "the others still wait")
			require.Equal(t, ev.Calls[0], ev.Call, "Call is the oldest waiting")
		}
	}
	require.NotNil(t, ev.Result)
	requireOK(t, ev.Result)
	require.Equal(t, "[0, 10, 20]\n", ev.Result.Stdout)

	// An answer to a call that is not waiting is refused.
	_, err = co.Resume(ctx, byArg["[0]"], Return(1))
	require.ErrorIs(t, err, ErrProtocol)
	_, err = co.Wait(ctx)
	require.ErrorIs(t, err, ErrProtocol)
}

// TestAsyncHostCallsMixed: a sync call made inside a coroutine while
// awaited calls are in flight, and an await that is cancelled (its reply
// comes later and is dropped), leave the job's calls consistent.
func TestAsyncHostCallsMixed(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	release := make(chan struct{})
	var once sync.Once
	host := func(ctx context.Context, c *Call) (any, error) {
		switch c.Function {
		case "slow":
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return "late", nil
		case "release":
			once.Do(func() { close(release) })
			return "released", nil
		}
		return json.RawMessage(c.Args), nil
	}
	code := `import asyncio
from pynox_host import aio, echo, release
async def main():
    t = asyncio.gather(aio.echo(1), aio.echo(2))
    await asyncio.sleep(0)
    s = echo(3)
    try:
        await asyncio.wait_for(aio.slow(), 0.01)
    except asyncio.TimeoutError:
        print('timed out')
    return s, await t
print(asyncio.run(main()))
print(release())
print(asyncio.run(aio.echo(4)))
`
	res := run(t, p, Job{Functions: []string{"echo", "slow", "release"}, Host: host, Timeout: 30 * time.Second, Code: code})
	requireOK(t, res)
	require.Equal(t, "timed out\n([3], [[1], [2]])\nreleased\n[4]\n", res.Stdout)
	require.Equal(t, 6, res.Calls)
}

// TestAsyncHostCallsCheckoutSimpleDriver: a driver that answers each
// event's Call in turn, as for sync code, answers concurrent calls too.
func TestAsyncHostCallsCheckoutSimpleDriver(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{Functions: []string{"echo"}})
	require.NoError(t, err)
	defer co.Finish(ctx)
	ev, err := co.Feed(ctx, Step{Code: gatherCode(5)})
	answered := 0
	for err == nil && ev.Call != nil {
		answered++
		ev, err = co.Resume(ctx, ev.Call.ID, Return(json.RawMessage(ev.Call.Args)))
	}
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "[[0], [1], [2], [3], [4]]\n", ev.Result.Stdout)
	require.Equal(t, 5, answered)
}

// TestAsyncHostCallCancelledInSession: a step whose code cancels an
// await reports only once that call is answered (its answer is dropped),
// and the session's next step runs in the same process.
func TestAsyncHostCallCancelledInSession(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{Functions: []string{"slow"}})
	require.NoError(t, err)
	defer co.Finish(ctx)
	ev, err := co.Feed(ctx, Step{Code: `import asyncio
from pynox_host import aio
async def main():
    t = asyncio.ensure_future(aio.slow())
    await asyncio.sleep(0)
    t.cancel()
    try:
        await t
    except asyncio.CancelledError:
        print('cancelled')
asyncio.run(main())
`})
	require.NoError(t, err)
	require.NotNil(t, ev.Call, "the cancelled call is still made: %+v", ev.Result)
	ev, err = co.Resume(ctx, ev.Call.ID, Return("late"))
	require.NoError(t, err)
	require.NotNil(t, ev.Result)
	requireOK(t, ev.Result)
	require.Equal(t, "cancelled\n", ev.Result.Stdout)
	require.False(t, ev.Result.SessionEnded)
	pid := co.Pid()
	ev, err = co.Feed(ctx, Step{Code: "print('alive')"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "alive\n", ev.Result.Stdout)
	require.Equal(t, pid, co.Pid())
}

// TestAsyncHostCallsLargeResults: large results of calls in flight
// together (more than the control socket holds) reach the job whole and
// each to its own call.
func TestAsyncHostCallsLargeResults(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	host := func(ctx context.Context, c *Call) (any, error) {
		var args []int
		if err := json.Unmarshal(c.Args, &args); err != nil {
			return nil, err
		}
		return strings.Repeat(fmt.Sprint(args[0]%10), 300000+args[0]), nil
	}
	code := `import asyncio
from pynox_host import aio, echo
async def main():
    return await asyncio.gather(*(aio.echo(i) for i in range(12)))
rs = asyncio.run(main())
print(all(r == str(i % 10) * (300000 + i) for i, r in enumerate(rs)), len(echo(3)))
`
	res := run(t, p, Job{Functions: []string{"echo"}, Host: host, Timeout: 30 * time.Second, Code: code})
	requireOK(t, res)
	require.Equal(t, "True 300003\n", res.Stdout)
}
