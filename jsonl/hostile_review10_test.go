package jsonl

import (
	"context"
	"encoding/base64"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// A tenth outside review, on the remote client (jsonl.Dial).

// A session's code decides how large its dump is, up to
// pynox.MaxDumpSize, and the server sends a dump as one message of its
// base64. Before, the remote client accepted messages of 64 MiB, less
// than a dump of more than 48 MiB takes: such a dump ended the whole
// connection, and every job and session of the client's in flight on it
// failed with KindDisconnected, their results lost because one session
// held a large value. Now the default read limit holds the largest
// dump answer the server can send (TestDefaultReadLimitHoldsLargestDump
// checks the bound on every run; this probe moves 56 MiB through the
// server, ~14 s on a loaded 2-CPU machine, so it runs with PYNOX_LONG).
func TestHostileReview10LargeDumpKeepsConnection(t *testing.T) {
	requireLong(t, "moves a 56 MiB dump through a pynox serve")
	t.Parallel()
	s := startRemoteServer(t, t.TempDir(), "127.0.0.1:0", writeTokenFile(t))
	p := dialTest(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	co, err := p.Checkout(ctx, pynox.Job{Memory: 512 << 20, Timeout: 30 * time.Second})
	require.NoError(t, err)
	defer co.Finish(context.Background())
	ev, err := co.Feed(ctx, pynox.Step{Code: "blob = b'x' * (56 << 20)\nprint('held')"})
	require.NoError(t, err)
	require.NotNil(t, ev.Result)
	require.Equal(t, "held\n", ev.Result.Stdout)

	// Another job of the same client, in flight while the dump arrives.
	other := make(chan *pynox.Result, 1)
	go func() {
		res, err := p.Run(ctx, pynox.Job{Code: "import time\ntime.sleep(1)\nprint('other')"})
		if err != nil {
			res = &pynox.Result{Error: &pynox.ErrorInfo{Type: "Go", Message: err.Error()}}
		}
		other <- res
	}()
	d, err := co.Dump(ctx)
	require.NoError(t, err, "the dump's answer ended the connection")
	require.Greater(t, len(d.Data), 56<<20)
	res := <-other
	require.Nil(t, res.Error, "the other job's result was lost: %+v", res.Error)
	require.Equal(t, "other\n", res.Stdout)
	res = run(t, p, pynox.Job{Code: "print(6 * 7)"})
	require.Equal(t, "42\n", res.Stdout)
}

// The default read limit holds the largest dump answer: the base64 of
// MaxDumpSize bytes, with room for the event's other fields (the id and
// session name a request line brought, the skipped names of a report).
func TestDefaultReadLimitHoldsLargestDump(t *testing.T) {
	need := int64(base64.StdEncoding.EncodedLen(pynox.MaxDumpSize)) + 2*MaxLine + 6*(64<<10)
	require.GreaterOrEqual(t, int64(defaultReadLimit), need)
}
