package worker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTakeSessionRefill: a session that takes the template's ready spare
// holds its replacement back (the pool asks for it once the first step
// has answered), but a job that finds no spare meanwhile gets the
// replacement forked at once: it never waits for the session. The
// session's process, closed, asks for no second replacement (the template
// would fail: a spare nobody asked for).
func TestTakeSessionRefill(t *testing.T) {
	tpl := startTestTemplate(t, false)
	require.Eventually(t, func() bool { return tpl.HasSpare(false) }, time.Minute, time.Millisecond)
	s, err := tpl.TakeSession(false, nil)
	require.NoError(t, err)
	// No RefillNow nor Close of s: the job's spare must come anyway.
	o := runTestJob(t, tpl, Job{Code: "print('job')"})
	require.Equal(t, "job\n", string(o.Stdout), "setup error: %s", o.SetupError)
	s.RefillNow() // asks for nothing more: the job's Take did
	s.Close()
	for i := 0; i < 3; i++ {
		o = runTestJob(t, tpl, Job{Code: "print('job')"})
		require.Equal(t, "job\n", string(o.Stdout))
	}

	// Without a job, RefillNow brings the replacement.
	require.Eventually(t, func() bool { return tpl.HasSpare(false) }, time.Minute, time.Millisecond)
	s, err = tpl.TakeSession(false, nil)
	require.NoError(t, err)
	s.RefillNow()
	require.Eventually(t, func() bool { return tpl.HasSpare(false) }, time.Minute, time.Millisecond)
	s.Close()
	o = runTestJob(t, tpl, Job{Code: "print('job')"})
	require.Equal(t, "job\n", string(o.Stdout))
	require.False(t, isClosed(tpl.Done()), "template failed: %v", tpl.Err())
}

// TestTakeSessionForksItsOwn: with the template's spare taken by a job
// (its replacement asked for only when the job ends), a session gets a
// spare forked for it alone, and the job's replacement still goes to the
// template's jobs, in whatever order the two are asked for.
func TestTakeSessionForksItsOwn(t *testing.T) {
	tpl := startTestTemplate(t, false)
	for i := 0; i < 2; i++ {
		job, err := tpl.Take(false, nil)
		require.NoError(t, err)
		job.HoldRefill()
		s, err := tpl.TakeSession(false, nil)
		require.NoError(t, err, "the session waits for no job")
		if i == 0 {
			job.Close() // asks for the job's replacement
			job.RefillNow()
			s.Close()
		} else {
			s.Close()
			job.RefillNow()
			job.Close()
		}
		o := runTestJob(t, tpl, Job{Code: "print('job')"})
		require.Equal(t, "job\n", string(o.Stdout), "setup error: %s", o.SetupError)
	}
	require.False(t, isClosed(tpl.Done()), "template failed: %v", tpl.Err())
}

// TestTakeSessionAbandoned: a session that gives up waiting for its own
// spare leaves nothing behind: the spare, when it comes, is closed and
// reaped, and the template serves on.
func TestTakeSessionAbandoned(t *testing.T) {
	tpl := startTestTemplate(t, false)
	job, err := tpl.Take(false, nil)
	require.NoError(t, err)
	canceled := make(chan struct{})
	close(canceled)
	for i := 0; i < 5; i++ {
		if s, err := tpl.TakeSession(false, canceled); err == nil {
			s.Close() // the spare came first
		}
	}
	require.Eventually(t, func() bool {
		tpl.mu.Lock()
		defer tpl.mu.Unlock()
		return len(tpl.children) == 1 && len(tpl.routes[kindDeny]) == 0
	}, time.Minute, 5*time.Millisecond, "the abandoned spares are reaped")
	job.Close()
	o := runTestJob(t, tpl, Job{Code: "print('job')"})
	require.Equal(t, "job\n", string(o.Stdout))
	require.False(t, isClosed(tpl.Done()), "template failed: %v", tpl.Err())
}
