package pynox

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// forgeCalls is job code that writes call frames on its control channel
// itself, bypassing pynox_host, with the given ids, then reads one reply.
func forgeCalls(ids string) string {
	return `import json, os, struct
def frame(o):
    b = json.dumps(o).encode()
    return struct.pack('<I', len(b)) + b
for i in ` + ids + `:
    os.write(3, frame({'t': 'call', 'id': i, 'step': 1, 'function': 'hold', 'args': [], 'kwargs': {}}))
    os.write(4, b'!')
n = struct.unpack('<I', os.read(3, 4))[0]
r = json.loads(os.read(3, n))
print(r['id'], r.get('error'), flush=True)
`
}

// TestHostileHostCallsInFlight: a job that forges more than MaxInFlight
// concurrent calls gets the one beyond refused (the host sees
// MaxInFlight), and one that reuses the id of a call in flight breaks the
// protocol and is killed.
func TestHostileHostCallsInFlight(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	var seen atomic.Int64
	host := func(ctx context.Context, c *Call) (any, error) {
		seen.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	res := run(t, p, Job{Functions: []string{"hold"}, Host: host, Code: forgeCalls("range(1, 66)")})
	require.Equal(t, "65 more than 64 host calls in flight\n", res.Stdout)
	// Each call's handler starts on a goroutine of its own, which may run
	// after the job has ended: wait for them, then check no 65th came.
	require.Eventually(t, func() bool { return seen.Load() >= int64(MaxInFlight) }, 10*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	require.Equal(t, int64(MaxInFlight), seen.Load())
	// It then reports with calls in flight: a protocol break.
	requireErrorType(t, res, "PoolWorkerError")

	seen.Store(0)
	res = run(t, p, Job{Functions: []string{"hold"}, Host: host, Code: forgeCalls("(5, 5)") + "print('unreached')"})
	requireErrorType(t, res, "PoolWorkerError")
	require.NotContains(t, res.Stdout, "unreached")
	require.Equal(t, int64(1), seen.Load())
}

// TestHostileUnreadRepliesKeepTheTimeout: a job with many calls in
// flight that stops reading its channel (here an event loop blocked in
// time.sleep) fills the socket with replies; the pool's writes of the
// rest wait on a goroutine of their own, so the job's timeout still ends
// it.
func TestHostileUnreadRepliesKeepTheTimeout(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	big := strings.Repeat("x", 30000)
	host := func(ctx context.Context, c *Call) (any, error) { return big, nil }
	code := `import asyncio, time
from pynox_host import aio
async def main():
    ts = [asyncio.ensure_future(aio.big(i)) for i in range(64)]
    await asyncio.sleep(0)
    time.sleep(120)
asyncio.run(main())
`
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := p.Run(ctx, Job{Functions: []string{"big"}, Host: host, Timeout: 2 * time.Second, Code: code})
	require.NoError(t, err, "the job's timeout did not end it")
	requireErrorType(t, res, "TimeoutError")
}
