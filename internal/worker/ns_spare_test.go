package worker

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// nsTestJob is a job that, if it ever ran, would print "ran" and leave a
// file behind.
func nsTestJob(t *testing.T) (Job, string) {
	flag := filepath.Join(t.TempDir(), "ran")
	return Job{Name: "<code>", Code: "open(" + quotePy(flag) + ", 'w').write('x')\nprint('ran')",
		Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10}, Timeout: 10 * time.Second, MaxOutput: 1 << 16}, flag
}

func quotePy(s string) string { return "'" + s + "'" } // test paths hold no quote

// requireNeverRan checks that a job handed to an ns spare was refused
// before any of its code ran.
func requireNeverRan(t *testing.T, o *Outcome, flag, want string) {
	t.Helper()
	require.False(t, o.Started, "the job started; stdout %q", o.Stdout)
	require.Contains(t, o.SetupError, want)
	require.Empty(t, string(o.Stdout))
	_, err := os.Stat(flag)
	require.True(t, os.IsNotExist(err), "the job's code ran")
}

// TestNSSpareKeptLazily: a template keeps no ns spare until the first
// TakeNS of a kind; from then on it keeps one ready, replaced when the
// one taken is closed, and TakeNS returns it at once.
func TestNSSpareKeptLazily(t *testing.T) {
	tpl := startTestTemplate(t, false)
	require.Eventually(t, func() bool { return tpl.HasSpare(false) }, time.Minute, time.Millisecond)
	runTestJob(t, tpl, Job{Code: "pass"})
	time.Sleep(100 * time.Millisecond)
	require.False(t, tpl.HasNSSpare(false), "an ns spare before any TakeNS")
	c, err := tpl.TakeNS(false, nil)
	require.NoError(t, err)
	require.False(t, tpl.HasNSSpare(false), "the replacement is asked for when the child is closed")
	c.Close()
	for range 3 {
		require.Eventually(t, func() bool { return tpl.HasNSSpare(false) }, time.Minute, time.Millisecond)
		c, err = tpl.TakeNS(false, nil)
		require.NoError(t, err)
		require.False(t, tpl.HasNSSpare(false))
		c.Close()
	}
	require.Eventually(t, func() bool { return tpl.HasNSSpare(false) }, time.Minute, time.Millisecond)
	require.False(t, isClosed(tpl.Done()), "template failed: %v", tpl.Err())
}

// TestNSSpareCanceledTake: a TakeNS whose cancel closes while it waits
// returns, and the ns spare that comes later stays the template's, for
// the next TakeNS (as a spare does after a Take is canceled).
func TestNSSpareCanceledTake(t *testing.T) {
	tpl := startTestTemplate(t, false)
	canceled := make(chan struct{})
	close(canceled)
	_, err := tpl.TakeNS(false, canceled)
	require.ErrorIs(t, err, errCanceled)
	require.Eventually(t, func() bool { return tpl.HasNSSpare(false) }, time.Minute, time.Millisecond)
	c, err := tpl.TakeNS(false, canceled) // a ready one is handed over whatever cancel says
	require.NoError(t, err)
	c.Close()
	require.Eventually(t, func() bool { return tpl.HasNSSpare(false) }, time.Minute, time.Millisecond)
	require.False(t, isClosed(tpl.Done()), "template failed: %v", tpl.Err())
}

// TestNSSpareForgedFrames: a ready ns spare (one that waited) refuses,
// with a setup error and before any code of the job runs, a job frame
// without a namespace, one that names other descriptors as its
// namespaces, and a forged frame that says "ns" but carries no
// descriptor at all; and a session's ns spare likewise.
func TestNSSpareForgedFrames(t *testing.T) {
	testenv.Slow(t)
	tpl := startTestTemplate(t, false)
	_, err := tpl.TakeNS(false, closedChan) // the first asks for the ready one
	require.ErrorIs(t, err, errCanceled)
	take := func() *Child {
		require.Eventually(t, func() bool { return tpl.HasNSSpare(false) }, time.Minute, time.Millisecond)
		time.Sleep(50 * time.Millisecond) // it has prepared and waits for its job
		c, err := tpl.TakeNS(false, nil)
		require.NoError(t, err)
		return c
	}

	// No namespace: the frame says ns false.
	job, flag := nsTestJob(t)
	c := take()
	requireNeverRan(t, c.Run(&job, nil), flag, "cannot serve a job without one")

	// Descriptors that are no namespaces: setns refuses them.
	dir, err := unix.Open(t.TempDir(), unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(dir)
	null, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(null)
	job, flag = nsTestJob(t)
	job.Namespace = &Namespace{User: dir, Mount: null}
	requireNeverRan(t, take().Run(&job, nil), flag, "setns(user namespace)")

	// The session path's ns spare (the template's ready one).
	job, flag = nsTestJob(t)
	job.Namespace = &Namespace{User: null, Mount: dir}
	require.Eventually(t, func() bool { return tpl.HasNSSpare(false) }, time.Minute, time.Millisecond)
	s, err := tpl.TakeNSSession(false, nil)
	require.NoError(t, err)
	job.Session = true
	requireNeverRan(t, s.Run(&job, nil), flag, "setns(user namespace)")
	s.RefillNow()

	// A forged frame that says ns but brings no descriptor.
	job, flag = nsTestJob(t)
	c = take()
	f := jobFrame{T: "job", Code: job.Code, Name: job.Name, Limits: job.Limits, Step: 1, NS: true, Rules: []uint64{}}
	b, err := marshalFrame(&f)
	require.NoError(t, err)
	o := c.turn(turnSpec{send: func() error { return c.sendRaw(b, nil) }, timeout: job.Timeout, maxOutput: job.MaxOutput}, nil)
	c.Close()
	requireNeverRan(t, o, flag, "mount namespace descriptors missing")
	require.False(t, isClosed(tpl.Done()), "template failed: %v", tpl.Err())
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
