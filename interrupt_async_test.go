package pynox

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestInterruptDuringConcurrentCalls: an interrupt that lands while an
// asyncio.gather of host calls is in flight (the event loop reading the
// channel, the replies not yet in) ends the step with KeyboardInterrupt;
// the replies still come, are read and dropped, and the session's next
// step, with its calls, works on a channel in step. So do sync calls
// from several threads.
func TestInterruptDuringConcurrentCalls(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	var calls atomic.Int64
	host := func(ctx context.Context, call *Call) (any, error) {
		calls.Add(1)
		time.Sleep(300 * time.Millisecond)
		return 7, nil
	}
	co, err := p.Checkout(ctx, Job{AllowWrite: []string{p.Config().Dir}, Timeout: 30 * time.Second, Functions: []string{"slow"}, Host: host})
	require.NoError(t, err)
	dir := p.Config().Dir

	mark := filepath.Join(dir, "gathering")
	ch := feedAsync(ctx, co, Step{Code: "import asyncio\nfrom pynox_host import aio\ny = 1\n" + startedMark(mark) +
		"async def main():\n    return await asyncio.gather(*(aio.slow() for _ in range(3)))\nprint('after', asyncio.run(main()))"})
	awaitFile(t, mark, ch)
	require.Eventually(t, func() bool { return calls.Load() == 3 }, 10*time.Second, time.Millisecond)
	require.True(t, co.Interrupt())
	ev := <-ch
	requireErrorType(t, ev.Result, "KeyboardInterrupt")
	require.False(t, ev.Result.SessionEnded)
	require.NotContains(t, ev.Result.Stdout, "after")

	mark = filepath.Join(dir, "threads")
	ch = feedAsync(ctx, co, Step{Code: "import threading\nfrom pynox_host import slow\n" + startedMark(mark) +
		"out = []\nts = [threading.Thread(target=lambda: out.append(slow())) for _ in range(3)]\n[t.start() for t in ts]\n[t.join() for t in ts]\nprint('after', out)"})
	awaitFile(t, mark, ch)
	require.Eventually(t, func() bool { return calls.Load() == 6 }, 10*time.Second, time.Millisecond)
	require.True(t, co.Interrupt())
	ev = <-ch
	requireErrorType(t, ev.Result, "KeyboardInterrupt")
	require.False(t, ev.Result.SessionEnded)

	ev, err = co.Feed(ctx, Step{Code: "import asyncio\nfrom pynox_host import aio, slow\nasync def main():\n    return await asyncio.gather(aio.slow(), aio.slow())\nprint(y, slow(), asyncio.run(main()))"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "1 7 [7, 7]\n", ev.Result.Stdout)
}
