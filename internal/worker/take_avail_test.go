package worker

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/testenv"
)

// availSpareTimeout is the spare timeout of availTemplate: short, so that
// a Take starved of its spare fails (its template declared wedged) within
// seconds instead of a minute.
const availSpareTimeout = 3 * time.Second

// availTemplate starts a template that keeps spares with the network too,
// with the short availSpareTimeout.
func availTemplate(t *testing.T) *Template {
	t.Helper()
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock, so jobs cannot run confined: %v", err)
	}
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	tpl, err := Start(Options{Python: py, Dir: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}, Network: true,
		SpareTimeout: availSpareTimeout})
	require.NoError(t, err)
	t.Cleanup(func() { tpl.Close() })
	return tpl
}

// TestTakeNotStarvedBySessionRace: a job's Take (TakeNS) that finds no
// ready spare and no session holding one back, and then waits, gets the
// spare that comes next even when a session takes that spare first
// (TakeSession, TakeNSSession) in the moment between the job's look and
// its wait: the session's spare's replacement is then asked for at once,
// not once the session's first step has answered. Without that, the job
// waited for the session's first step, here for the whole spare timeout,
// after which its template was declared wedged. For every kind: without
// and with the network, plain spares and ns spares.
func TestTakeNotStarvedBySessionRace(t *testing.T) {
	testenv.Slow(t)
	t.Cleanup(func() { takeWaitHook = nil })
	for _, c := range []struct {
		name        string
		network, ns bool
	}{{"plain", false, false}, {"plain network", true, false}, {"ns", false, true}, {"ns network", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			tpl := availTemplate(t) // one each: a starved one is declared wedged
			take, takeSession, has := tpl.Take, tpl.TakeSession, tpl.HasSpare
			if c.ns {
				take, takeSession, has = tpl.TakeNS, tpl.TakeNSSession, tpl.HasNSSpare
			}
			// Take the ready spare (the first TakeNS of a kind asks for
			// one) and hold its replacement's request.
			require.Eventually(t, func() bool { return tpl.HasSpare(c.network) }, time.Minute, time.Millisecond)
			first, err := take(c.network, nil)
			require.NoError(t, err)
			first.HoldRefill()

			// The job finds no spare; as it starts waiting, the held
			// replacement comes and a session takes it.
			var session *Child
			var sessionErr error
			fired := false
			takeWaitHook = func(kind int, ns bool) {
				if fired {
					return
				}
				fired = true
				first.RefillNow()
				for !has(c.network) && !isClosed(tpl.Done()) {
					time.Sleep(time.Millisecond)
				}
				session, sessionErr = takeSession(c.network, nil)
			}
			job, err := take(c.network, nil)
			takeWaitHook = nil
			require.True(t, fired, "the job's Take found a ready spare")
			require.NoError(t, sessionErr)
			require.NoError(t, err, "the job waited for the session's first step")
			require.False(t, isClosed(tpl.Done()), "template failed: %v", tpl.Err())
			job.Close()
			first.Close()
			session.RefillNow() // asks for nothing more: the session's take did
			session.Close()
			// The template serves on, with one spare of the kind.
			for range 2 {
				require.Eventually(t, func() bool { return has(c.network) }, time.Minute, time.Millisecond)
				job, err = take(c.network, nil)
				require.NoError(t, err)
				job.Close()
			}
			require.False(t, isClosed(tpl.Done()), "template failed: %v", tpl.Err())
		})
	}
}
