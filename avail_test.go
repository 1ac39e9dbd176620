package pynox

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// Availability: a session that takes a template's ready spare holds back
// the request for its replacement until its first step has answered (see
// worker.Template.TakeSession). A one-shot job that needs that kind of
// spare meanwhile must not wait for the session: its spare is forked at
// once. Each case below parks a session's first step in a host call that
// is answered only at the end, then runs one-shot jobs of the same kind
// with a deadline far under the spare timeout (a minute): a job that
// waited for the session would end with the deadline, and its template
// would later be declared wedged.

// availJobDeadline bounds each one-shot job: a fork and a job take
// milliseconds; the spare timeout a job starved by a session would wait
// for is a minute.
const availJobDeadline = 25 * time.Second

// availParkFirstStep checks out a session with job's settings and starts
// its first step, which waits in a host call until the returned release
// is called (at the latest when the test ends). It returns once the step
// is in the call, so the session holds the template's spare.
func availParkFirstStep(t *testing.T, p *Pool, job Job) (release func()) {
	t.Helper()
	job.Functions = []string{"park"}
	co := checkout(t, p, job)
	inCall, unpark := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		ev, err := co.Feed(context.Background(), Step{Code: "from pynox_host import park\npark()\nprint('session')",
			Host: func(context.Context, *Call) (any, error) {
				close(inCall)
				<-unpark
				return nil, nil
			}})
		if err == nil && (ev.Result == nil || ev.Result.Stdout != "session\n") {
			err = context.Canceled
		}
		done <- err
	}()
	select {
	case <-inCall:
	case err := <-done:
		t.Fatalf("the session's first step ended before its host call: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the session's first step never reached its host call")
	}
	var released bool
	release = func() {
		if released {
			return
		}
		released = true
		close(unpark)
		require.NoError(t, <-done, "the session's first step")
	}
	t.Cleanup(release)
	return release
}

// availSpareReady waits until the pool's template holds a ready spare of
// the kind (so that the next session takes it rather than a process
// forked for it alone).
func availSpareReady(t *testing.T, p *Pool, network, ns bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, tpl := p.sessionTemplate(network)
		if tpl == nil {
			return false
		}
		if ns {
			return tpl.HasNSSpare(network)
		}
		return tpl.HasSpare(network)
	}, time.Minute, time.Millisecond, "the template keeps no ready spare of the kind")
}

// availRunJobs runs n one-shot jobs with job's settings, each within
// availJobDeadline, and checks each printed "job".
func availRunJobs(t *testing.T, p *Pool, job Job, n int) {
	t.Helper()
	job.Code = "print('job')"
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), availJobDeadline)
		res, err := p.Run(ctx, job)
		cancel()
		require.NoError(t, err, "job %d waited for the session's first step", i)
		requireOK(t, res)
		require.Equal(t, "job\n", res.Stdout)
	}
}

// TestAvailJobNotStarvedBySession: on a pool with one worker, sessions
// of each kind (without and with the network, without and with a mount
// namespace) park their first step, and one-shot jobs of the same kind
// run meanwhile, each promptly; then the sessions' steps answer and the
// pool serves on.
func TestAvailJobNotStarvedBySession(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, Limits: Limits{AllowNetwork: true}})
	dir := p.Config().Dir
	data := filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("hello"), 0o644))
	mounts := []MountSpec{{HostPath: data, Path: "/data-avail"}}
	kinds := []struct {
		name string
		job  Job
		ns   bool
	}{
		{"plain", Job{}, false},
		{"network", Job{AllowNetwork: true}, false},
		{"ns", Job{Mounts: mounts}, true},
		{"ns network", Job{Mounts: mounts, AllowNetwork: true}, true},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			if k.ns {
				requireNS(t, p)
			}
			// A first job of the kind makes the template keep a ready
			// spare of it (ns spares are kept from the first such job on).
			availRunJobs(t, p, k.job, 1)
			availSpareReady(t, p, k.job.AllowNetwork, k.ns)
			release := availParkFirstStep(t, p, k.job)
			availRunJobs(t, p, k.job, 3)
			// Two sessions at once: the second forks its own process or
			// takes the spare the jobs left; neither holds a job back.
			availSpareReady(t, p, k.job.AllowNetwork, k.ns)
			release2 := availParkFirstStep(t, p, k.job)
			availRunJobs(t, p, k.job, 2)
			release()
			release2()
			availRunJobs(t, p, k.job, 1)
		})
	}
}
