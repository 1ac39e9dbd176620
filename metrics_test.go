package pynox

import (
	"context"
	"math"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// gatherPynox gathers reg and returns its pynox_* families by name.
func gatherPynox(t *testing.T, g prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "pynox_") {
			out[mf.GetName()] = mf
		}
	}
	return out
}

// metricValue returns the value of the family's series whose labels
// include want (a counter's or gauge's value, a histogram's count), and
// whether there is one.
func metricValue(mf *dto.MetricFamily, want map[string]string) (float64, bool) {
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// requireMetricsMatchStats checks the pynox_* families against a Stats
// snapshot taken with no work under way: every count the two share is
// the same.
func requireMetricsMatchStats(t *testing.T, fams map[string]*dto.MetricFamily, s Stats) {
	t.Helper()
	jobs := fams["pynox_jobs_total"]
	require.NotNil(t, jobs)
	byOutcome := map[string]float64{}
	byType := map[string]float64{}
	var total float64
	for _, m := range jobs.GetMetric() {
		var outcome, typ string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "outcome":
				outcome = l.GetValue()
			case "error_type":
				typ = l.GetValue()
			}
		}
		v := m.GetCounter().GetValue()
		total += v
		byOutcome[outcome] += v
		byType[typ] += v
	}
	require.Equal(t, float64(s.Jobs), total, "pynox_jobs_total summed against Stats.Jobs")
	require.Equal(t, float64(s.OK), byOutcome["ok"])
	require.Equal(t, float64(s.Failed), byOutcome["failed"])
	require.Equal(t, float64(s.Timeouts), byOutcome["timeout"])
	require.Equal(t, float64(s.Signals), byOutcome["signal"])
	require.Equal(t, float64(s.RequestErrors), byOutcome["request_error"])
	require.Equal(t, float64(s.WorkerErrors), byOutcome["worker_error"])
	require.Equal(t, float64(s.Cancelled), byOutcome["cancelled"])
	var other int64
	for typ, n := range s.Errors {
		if labelledErrorTypes[typ] {
			require.Equal(t, float64(n), byType[typ], "error_type=%s against Stats.Errors", typ)
		} else {
			other += n
		}
	}
	require.Equal(t, float64(other), byType["other"], "error_type=other against the Stats.Errors of other types")

	dur := fams["pynox_job_duration_seconds"].GetMetric()[0].GetHistogram()
	require.Equal(t, uint64(s.Jobs-s.RequestErrors), dur.GetSampleCount(), "one duration per request not refused")
	// duration_ms is duration_us rounded: they differ by half a millisecond a job at most.
	require.InDelta(t, float64(s.DurationMSTotal), dur.GetSampleSum()*1000, 0.5*float64(s.Jobs)+1e-6)
	queue := fams["pynox_job_queue_seconds"].GetMetric()[0].GetHistogram()
	require.Equal(t, uint64(s.Jobs-s.RequestErrors), queue.GetSampleCount())
	require.InDelta(t, float64(s.QueueUSTotal), queue.GetSampleSum()*1e6, 1e-3*float64(s.Jobs)+1e-6)
	cpu, _ := metricValue(fams["pynox_job_cpu_seconds_total"], nil)
	require.InDelta(t, s.CPUMSTotal, cpu*1000, 1e-6)
	active, _ := metricValue(fams["pynox_sessions_active"], nil)
	require.Equal(t, float64(s.SessionsActive), active)
	workers, _ := metricValue(fams["pynox_workers"], nil)
	require.Equal(t, float64(s.Workers), workers)
}

// TestCollectorMatchesStats registers a pool's collector in a fresh
// registry and runs a known mix of real jobs: successes, a
// ZeroDivisionError, an exception class of the job's own, a timeout, a
// refused request, a host call and a session of two steps. The metrics
// count exactly that mix, and agree with Stats.
func TestCollectorMatchesStats(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	reg := prometheus.NewRegistry()
	reg.MustRegister(p.Collector())
	ctx := context.Background()

	// Before any job: every family but pynox_jobs_total (no outcome yet)
	// and pynox_spares_ready{network="allow"} (a pool without network).
	n, err := testutil.GatherAndCount(reg, "pynox_jobs_total", "pynox_workers", "pynox_templates_up", "pynox_spares_ready")
	require.NoError(t, err)
	require.Equal(t, 3, n)

	requireOK(t, run(t, p, Job{Code: "print(1)"}))
	requireOK(t, run(t, p, Job{Code: "x = 2"}))
	requireErrorType(t, run(t, p, Job{Code: "1/0"}), "ZeroDivisionError")
	requireErrorType(t, run(t, p, Job{Code: "class Boom(Exception): pass\nraise Boom()"}), "Boom")
	requireErrorType(t, run(t, p, Job{Code: "while True: pass", Timeout: 300 * time.Millisecond}), "TimeoutError")
	requireErrorType(t, run(t, p, Job{Code: "1", Functions: []string{"_hidden"}, Host: func(context.Context, *Call) (any, error) { return nil, nil }}), "RequestError")
	res := run(t, p, Job{Code: "from pynox_host import add\nprint(add(2, 3))", Functions: []string{"add"},
		Host: func(_ context.Context, c *Call) (any, error) { return 5, nil }})
	requireOK(t, res)
	require.Equal(t, "5\n", res.Stdout)

	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	for _, code := range []string{"x = 41", "print(x + 1)"} {
		ev, err := co.Feed(ctx, Step{Code: code})
		require.NoError(t, err)
		requireOK(t, ev.Result)
	}

	fams := gatherPynox(t, reg)
	s := p.Stats()
	require.Equal(t, int64(9), s.Jobs)
	requireMetricsMatchStats(t, fams, s)
	for _, c := range []struct {
		outcome, typ string
		want         float64
	}{
		{"ok", "none", 5}, {"failed", "ZeroDivisionError", 1}, {"failed", "other", 1},
		{"timeout", "TimeoutError", 1}, {"request_error", "RequestError", 1},
	} {
		v, ok := metricValue(fams["pynox_jobs_total"], map[string]string{"outcome": c.outcome, "error_type": c.typ})
		require.True(t, ok, "pynox_jobs_total{outcome=%q,error_type=%q} missing", c.outcome, c.typ)
		require.Equal(t, c.want, v, "pynox_jobs_total{outcome=%q,error_type=%q}", c.outcome, c.typ)
	}
	require.Len(t, fams["pynox_jobs_total"].GetMetric(), 5)
	for name, want := range map[string]float64{
		"pynox_session_steps_total":        2,
		"pynox_sessions_active":            1,
		"pynox_host_calls_total":           1,
		"pynox_host_call_duration_seconds": 1,
		"pynox_template_restarts_total":    0,
		"pynox_workers":                    1,
		"pynox_templates_up":               1,
		"pynox_session_steps_running":      0,
		"pynox_jobs_queued":                0,
	} {
		v, ok := metricValue(fams[name], nil)
		require.True(t, ok, "%s missing", name)
		require.Equal(t, want, v, name)
	}
	// The timeout ran for 300 ms at least: its duration is in a bucket
	// above 0.25 s.
	dur := fams["pynox_job_duration_seconds"].GetMetric()[0].GetHistogram()
	for _, b := range dur.GetBucket() {
		if b.GetUpperBound() == 0.25 {
			require.Less(t, b.GetCumulativeCount(), dur.GetSampleCount())
		}
	}

	require.NoError(t, co.Finish(ctx))
	fams = gatherPynox(t, reg)
	requireMetricsMatchStats(t, fams, p.Stats())
	active, _ := metricValue(fams["pynox_sessions_active"], nil)
	require.Equal(t, 0.0, active)
}

// TestCollectorGaugesOfWorkInFlight holds a job in a host call, a second
// job waiting for the pool's one worker, and a session step waiting for
// Resume, and reads the gauges of work in flight meanwhile.
func TestCollectorGaugesOfWorkInFlight(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	reg := prometheus.NewRegistry()
	reg.MustRegister(p.Collector())
	ctx := context.Background()

	called, release := make(chan struct{}), make(chan struct{})
	host := func(context.Context, *Call) (any, error) {
		called <- struct{}{}
		<-release
		return 1, nil
	}
	first, second := make(chan *Result, 1), make(chan *Result, 1)
	go func() {
		res, _ := p.Run(ctx, Job{Code: "from pynox_host import hold\nhold()", Functions: []string{"hold"}, Host: host})
		first <- res
	}()
	<-called
	go func() {
		res, _ := p.Run(ctx, Job{Code: "print(2)"})
		second <- res
	}()
	require.Eventually(t, func() bool { return p.waiting.Load() == 1 }, time.Minute, 5*time.Millisecond)
	co, err := p.Checkout(ctx, Job{Functions: []string{"ask"}})
	require.NoError(t, err)
	ev, err := co.Feed(ctx, Step{Code: "from pynox_host import ask\nprint(ask())"})
	require.NoError(t, err)
	require.NotNil(t, ev.Call)

	fams := gatherPynox(t, reg)
	for name, want := range map[string]float64{
		"pynox_workers_busy":          1,
		"pynox_jobs_queued":           1,
		"pynox_session_steps_running": 1,
		"pynox_sessions_active":       1,
		"pynox_host_calls_total":      2,
		// Neither call has been answered.
		"pynox_host_call_duration_seconds": 0,
	} {
		v, ok := metricValue(fams[name], nil)
		require.True(t, ok, "%s missing", name)
		require.Equal(t, want, v, name)
	}

	close(release)
	requireOK(t, <-first)
	requireOK(t, <-second)
	ev, err = co.Resume(ctx, ev.Call.ID, Return(7))
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "7\n", ev.Result.Stdout)
	fams = gatherPynox(t, reg)
	for name, want := range map[string]float64{
		"pynox_jobs_queued":                0,
		"pynox_session_steps_running":      0,
		"pynox_host_call_duration_seconds": 2,
	} {
		v, _ := metricValue(fams[name], nil)
		require.Equal(t, want, v, name)
	}
	requireMetricsMatchStats(t, fams, p.Stats())
}

// TestCollectorTemplateRestart kills the pool's template: the restart is
// counted, and the replacement is up with its spare ready.
func TestCollectorTemplateRestart(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 1})
	reg := prometheus.NewRegistry()
	reg.MustRegister(p.Collector())
	requireOK(t, run(t, p, Job{Code: "1"}))
	pids := p.templatePIDs()
	require.Len(t, pids, 1)
	require.NoError(t, syscall.Kill(pids[0], syscall.SIGKILL))
	awaitNewTemplate(t, p, pids[0])
	fams := gatherPynox(t, reg)
	v, _ := metricValue(fams["pynox_template_restarts_total"], nil)
	require.Equal(t, 1.0, v)
	v, _ = metricValue(fams["pynox_template_restart_failures_total"], nil)
	require.Equal(t, 0.0, v)
	requireOK(t, run(t, p, Job{Code: "1"}))
	require.Eventually(t, func() bool {
		fams := gatherPynox(t, reg)
		up, _ := metricValue(fams["pynox_templates_up"], nil)
		spare, _ := metricValue(fams["pynox_spares_ready"], map[string]string{"network": "deny"})
		return up == 1 && spare == 1
	}, time.Minute, 10*time.Millisecond, "the replacement template has no spare ready")
}

// TestCollectorRegistersNothingGlobally checks that making a pool,
// running a job and making its collector registers nothing in
// prometheus.DefaultRegisterer.
func TestCollectorRegistersNothingGlobally(t *testing.T) {
	names := func() []string {
		mfs, err := prometheus.DefaultGatherer.Gather()
		require.NoError(t, err)
		var out []string
		for _, mf := range mfs {
			out = append(out, mf.GetName())
		}
		return out
	}
	before := names()
	p := newTestPool(t, Config{Workers: 1})
	requireOK(t, run(t, p, Job{Code: "1"}))
	c := p.Collector()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	require.NotEmpty(t, gatherPynox(t, reg))
	after := names()
	require.Equal(t, before, after)
	for _, n := range after {
		require.False(t, strings.HasPrefix(n, "pynox_"), "%s is registered globally", n)
	}
	// Registering the pool's collector in the default registry is the
	// embedder's choice, and works.
	require.NoError(t, prometheus.DefaultRegisterer.Register(c))
	defer prometheus.DefaultRegisterer.Unregister(c)
	require.Contains(t, names(), "pynox_jobs_total")
}

// TestHistogramBuckets checks the bucket bounds: an observation equal to
// a bound counts in that bound's bucket, and one above every bound only
// in +Inf.
func TestHistogramBuckets(t *testing.T) {
	var h histogram
	h.observe(500 * time.Microsecond)
	h.observe(501 * time.Microsecond)
	h.observe(10 * time.Minute)
	desc := prometheus.NewDesc("x_seconds", "x", nil, nil)
	var m dto.Metric
	require.NoError(t, h.metric(desc).Write(&m))
	hist := m.GetHistogram()
	require.Equal(t, uint64(3), hist.GetSampleCount())
	require.InDelta(t, 600.001001, hist.GetSampleSum(), 1e-9)
	got := map[float64]uint64{}
	for _, b := range hist.GetBucket() {
		got[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	require.Equal(t, uint64(1), got[0.0005])
	require.Equal(t, uint64(2), got[0.001])
	require.Equal(t, uint64(2), got[300])
	require.False(t, math.IsInf(hist.GetBucket()[len(hist.GetBucket())-1].GetUpperBound(), 1))
}
