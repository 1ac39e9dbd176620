package jsonl

import (
	"fmt"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// runnerGoroutines counts the goroutines parked in or running a runner's
// loop.
func runnerGoroutines() int {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	return strings.Count(b.String(), "jsonl.(*runners).loop")
}

// TestServeReusesRunnerGoroutines: one-shot jobs sent one after another
// run on the runner goroutines that earlier jobs left idle rather than on
// a new goroutine each (a fresh goroutine grew its stack again for every
// job), every job still gets its own answer, and the runners end when
// Serve returns.
func TestServeReusesRunnerGoroutines(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	const n = 20
	before := runnersStarted.Load()
	for i := range n {
		ls.send(fmt.Sprintf(`{"id": %d, "code": "print(%d)"}`, i, i*7))
		res := ls.await(i)
		require.Equal(t, "0", fmt.Sprint(res["exit"]), "job %d: %v", i, res)
		require.Equal(t, fmt.Sprintf("%d\n", i*7), res["stdout"], "job %d", i)
	}
	started := runnersStarted.Load() - before
	require.GreaterOrEqual(t, started, int64(1))
	require.LessOrEqual(t, started, int64(n/2), "%d sequential jobs started %d runner goroutines", n, started)
	require.Positive(t, runnerGoroutines(), "the runners wait for the next job")
	ls.in.Close()
	select {
	case err := <-ls.done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("Serve did not return after end of input")
	}
	require.Eventually(t, func() bool { return runnerGoroutines() == 0 }, 10*time.Second, 10*time.Millisecond,
		"runner goroutines left after Serve returned")
}
