package pynox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A later step whose calls a HostFunc answers runs on Feed's own goroutine
// (issue 12: no relay goroutine per step). Finish must still kill it and
// Feed return ErrFinished, as for a first step (TestFinishKillsRunningStep).
func TestFinishKillsRunningLaterStep(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	h := newSignalHost()
	co := checkout(t, p, Job{Functions: signalFunctions, Host: h.host})
	ev, err := co.Feed(context.Background(), Step{Code: "x = 1"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	type outcome struct {
		ev  TurnEvent
		err error
	}
	fed := make(chan outcome, 1)
	go func() {
		ev, err := co.Feed(context.Background(), Step{Code: "from pynox_host import started\nimport time\nstarted()\ntime.sleep(60)\nprint('done')"})
		fed <- outcome{ev, err}
	}()
	h.wait(t)
	within(t, "Finish of a checkout with a running later step", func() {
		require.NoError(t, co.Finish(context.Background()))
	})
	var o outcome
	within(t, "the killed step's Feed", func() { o = <-fed })
	require.ErrorIs(t, o.err, ErrFinished, "the step was killed, not run to completion: %+v", o.ev.Result)
}
