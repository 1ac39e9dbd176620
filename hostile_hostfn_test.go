package pynox

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
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
	p := newTestPool(t, Config{Workers: 1})
	var seen atomic.Int64
	host := func(ctx context.Context, c *Call) (any, error) {
		seen.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	res := run(t, p, Job{Functions: []string{"hold"}, Host: host, Code: forgeCalls("range(1, 66)")})
	require.Equal(t, "65 more than 64 host calls in flight\n", res.Stdout)
	require.Equal(t, int64(MaxInFlight), seen.Load())
	// It then reports with calls in flight: a protocol break.
	requireErrorType(t, res, "PoolWorkerError")

	seen.Store(0)
	res = run(t, p, Job{Functions: []string{"hold"}, Host: host, Code: forgeCalls("(5, 5)") + "print('unreached')"})
	requireErrorType(t, res, "PoolWorkerError")
	require.NotContains(t, res.Stdout, "unreached")
	require.Equal(t, int64(1), seen.Load())
}
