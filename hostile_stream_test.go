package pynox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// A session step that keeps a copy of its stdout in a thread that writes
// on: its output stops with its result (the process is stopped at its
// report and the pipe cut off after the drain), no call comes after the
// result, and the next step's stream carries only that step's output, not
// the old thread's.
func TestHostileStreamKeptStdoutAcrossSteps(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(ctx)
	first := &outputLog{}
	ev, err := co.Feed(ctx, Step{Code: `
import os, threading
fd = os.dup(1)
def w():
    while True:
        os.write(fd, b"smuggled\n")
threading.Thread(target=w, daemon=True).start()
import time; time.sleep(0.1)
print("first", flush=True)
`, OnOutput: first.fn})
	first.returned.Store(true)
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Contains(t, first.text(Stdout), "first\n")

	second := &outputLog{}
	ev, err = co.Feed(ctx, Step{Code: "import time\ntime.sleep(0.3)\nprint('second')", OnOutput: second.fn})
	second.returned.Store(true)
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "second\n", second.text(Stdout))
	require.Equal(t, "second\n", ev.Result.Stdout)
	time.Sleep(100 * time.Millisecond)
	require.Zero(t, first.late.Load())
	require.Zero(t, second.late.Load())
	require.False(t, strings.Contains(second.text(Stdout), "smuggled"))
}
