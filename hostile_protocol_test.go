package pynox

// Adversarial suite (helpers in hostile_test.go): the control protocol,
// forged frames, results and descriptors (the forger against the JSON
// Lines stream is jsonl.TestHostileProtocol).

import (
	"context"
	"github.com/pynox/pynox/internal/probes"
	"github.com/pynox/pynox/internal/testenv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHostileProtocol, which runs the forger through Serve, is in package
// jsonl.

// A job that queues its own pipe ends on its control socket used to wedge
// its worker for good (found by this suite): the host now closes the
// socket once it stops reading it and bounds the wait for the pipes.
func TestHostileProtocolDescriptorPassing(t *testing.T) {
	testenv.Slow(t)
	requireSandbox(t)
	// Not newTestPool: if the hole is open, Close would hang with the
	// wedged job, so the pool is closed only when the job came back.
	p, err := New(Config{Workers: 1, Dir: t.TempDir(), Python: testPython()})
	require.NoError(t, err)
	fds := advWarm(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan *Result, 1)
	go func() {
		r, _ := p.Run(ctx, Job{Code: probes.Forger, Env: map[string]string{"VICTIMS": `["x"]`, "MODE": "rights"}, Timeout: 2 * time.Second})
		done <- r
	}()
	select {
	case r := <-done:
		defer p.Close()
		require.NotNil(t, r, "the caller's context ended first")
		if typ := r.Err(); r.Error != nil {
			require.Equal(t, "PoolWorkerError", r.Error.Type, "%v", typ)
		}
		require.Equal(t, fds, advSteadyFDs(t), "descriptors the job sent landed in the host")
		advServes(t, p)
	case <-time.After(15 * time.Second):
		t.Fatal("Pool.Run did not return 13s after its job's timeout and the caller's context: the worker is wedged")
	}
}
