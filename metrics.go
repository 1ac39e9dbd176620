package pynox

import (
	"maps"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Prometheus metrics. The library registers nothing anywhere: an
// embedder registers [Pool.Collector] in a registry of its own, and
// `pynox serve` serves its registry at /metrics. The collector reads the
// pool's counters at scrape time, the same ones [Pool.Stats] reads, so
// the two agree; the pool keeps them with atomic adds, or under the lock
// its Stats already take, and allocates nothing per job for them.

// latencyBuckets are the upper bounds, in seconds, of the pool's
// histograms: from half a millisecond (a warm job's hand-over) to five
// minutes (a long job or a slow host call).
var latencyBuckets = [...]float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// histogram counts observations into latencyBuckets with atomic adds, so
// that it needs no lock of its own: counts[i] holds the observations in
// (latencyBuckets[i-1], latencyBuckets[i]], and the last one those above
// every bound.
type histogram struct {
	counts [len(latencyBuckets) + 1]atomic.Uint64
	sumNS  atomic.Int64
}

// observe counts one observation of d.
func (h *histogram) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(latencyBuckets) && s > latencyBuckets[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sumNS.Add(int64(d))
}

// metric returns the histogram as a constant Prometheus metric.
func (h *histogram) metric(desc *prometheus.Desc) prometheus.Metric {
	buckets := make(map[float64]uint64, len(latencyBuckets))
	var n uint64
	for i, le := range latencyBuckets {
		n += h.counts[i].Load()
		buckets[le] = n
	}
	n += h.counts[len(latencyBuckets)].Load()
	return prometheus.MustNewConstHistogram(desc, n, time.Duration(h.sumNS.Load()).Seconds(), buckets)
}

// Outcomes of an answered request: the outcome label of
// pynox_jobs_total, named as the Stats counters.
const (
	outcomeOK = iota
	outcomeFailed
	outcomeTimeout
	outcomeSignal
	outcomeRequestError
	outcomeWorkerError
	outcomeCancelled
	numOutcomes
)

// outcomeNames are the outcomes' label values.
var outcomeNames = [numOutcomes]string{"ok", "failed", "timeout", "signal", "request_error", "worker_error", "cancelled"}

// errorTypeLabel is the error_type label of a result's error type: the
// type itself for Python's builtin exceptions and pynox's own error types,
// "other" for the rest (a job names its own exception classes, and must
// not be able to grow the label set without bound), "none" without an
// error.
func errorTypeLabel(e *ErrorInfo) string {
	switch {
	case e == nil:
		return "none"
	case labelledErrorTypes[e.Type]:
		return e.Type
	default:
		return "other"
	}
}

// labelledErrorTypes are the error types pynox_jobs_total names: Python's
// builtin exceptions (3.8 to 3.13) and the error types of pynox's results.
var labelledErrorTypes = func() map[string]bool {
	m := map[string]bool{}
	for _, t := range []string{
		"ArithmeticError", "AssertionError", "AttributeError", "BaseException", "BaseExceptionGroup",
		"BlockingIOError", "BrokenPipeError", "BufferError", "BytesWarning", "ChildProcessError",
		"ConnectionAbortedError", "ConnectionError", "ConnectionRefusedError", "ConnectionResetError",
		"DeprecationWarning", "EOFError", "EncodingWarning", "EnvironmentError", "Exception", "ExceptionGroup",
		"FileExistsError", "FileNotFoundError", "FloatingPointError", "FutureWarning", "GeneratorExit",
		"IOError", "ImportError", "ImportWarning", "IndentationError", "IndexError", "InterruptedError",
		"IsADirectoryError", "KeyError", "KeyboardInterrupt", "LookupError", "MemoryError",
		"ModuleNotFoundError", "NameError", "NotADirectoryError", "NotImplementedError", "OSError",
		"OverflowError", "PendingDeprecationWarning", "PermissionError", "ProcessLookupError",
		"PythonFinalizationError", "RecursionError", "ReferenceError", "ResourceWarning", "RuntimeError",
		"RuntimeWarning", "StopAsyncIteration", "StopIteration", "SyntaxError", "SyntaxWarning",
		"SystemError", "SystemExit", "TabError", "TimeoutError", "TypeError", "UnboundLocalError",
		"UnicodeDecodeError", "UnicodeEncodeError", "UnicodeError", "UnicodeTranslateError",
		"UnicodeWarning", "UserWarning", "ValueError", "Warning", "ZeroDivisionError",
		"HostError", "CancelledError",
	} {
		m[t] = true
	}
	for k := range kindNames {
		m[k.String()] = true
	}
	return m
}()

// The descriptions of the pool's metrics.
var (
	descJobs = prometheus.NewDesc("pynox_jobs_total",
		"Requests the pool answered (jobs, session steps and refused requests), by outcome (ok, failed, timeout, signal, request_error, worker_error: "+
			"the Stats counters of those names) and error type (a Python builtin exception or a pynox error type; other for the rest; none without an error). "+
			"Their sum is Stats.Jobs.",
		[]string{"outcome", "error_type"}, nil)
	descJobDuration = prometheus.NewDesc("pynox_job_duration_seconds",
		"Run time of jobs and session steps, from hand-over to the child until its result (the results' duration_us); refused requests are not observed.",
		nil, nil)
	descJobQueue = prometheus.NewDesc("pynox_job_queue_seconds",
		"Time jobs and session steps waited from acceptance until a child started them (the results' queue_us); refused requests are not observed.",
		nil, nil)
	descJobCPU = prometheus.NewDesc("pynox_job_cpu_seconds_total",
		"CPU time the kernel counted for jobs and session steps (Stats.CPUMSTotal in seconds).",
		nil, nil)
	descSessionsActive = prometheus.NewDesc("pynox_sessions_active",
		"Sessions (checkouts) open (Stats.SessionsActive).",
		nil, nil)
	descSessionsWaiting = prometheus.NewDesc("pynox_sessions_waiting",
		"Checkout calls waiting for a session slot (max_sessions are open).",
		nil, nil)
	descSessionSteps = prometheus.NewDesc("pynox_session_steps_total",
		"Session steps answered; they count in pynox_jobs_total too.",
		nil, nil)
	descStepsRunning = prometheus.NewDesc("pynox_session_steps_running",
		"Session steps under way (a step waiting for the answer to a host call included).",
		nil, nil)
	descHostCalls = prometheus.NewDesc("pynox_host_calls_total",
		"Host-function calls made by jobs and session steps (the count that numbers Call.ID).",
		nil, nil)
	descHostCallDuration = prometheus.NewDesc("pynox_host_call_duration_seconds",
		"Time from a host-function call to its answer (the host function's run, or the wait for Resume).",
		nil, nil)
	descTemplateRestarts = prometheus.NewDesc("pynox_template_restarts_total",
		"Dead templates replaced by a new one.",
		nil, nil)
	descTemplateRestartFailures = prometheus.NewDesc("pynox_template_restart_failures_total",
		"Attempts to replace a dead template that failed (the worker serves nothing until one succeeds).",
		nil, nil)
	descTemplatesUp = prometheus.NewDesc("pynox_templates_up",
		"Templates alive; pynox_workers when all are.",
		nil, nil)
	descSpares = prometheus.NewDesc("pynox_spares_ready",
		"Templates holding a pre-forked child ready for the next job, by the network the child's filter allows (deny, or allow on a pool that grants it).",
		[]string{"network"}, nil)
	descNSSpares = prometheus.NewDesc("pynox_ns_spares_ready",
		"Templates holding a pre-forked child ready for the next job with a mount namespace (kept from a template's first such job on), by the network the child's filter allows.",
		[]string{"network"}, nil)
	descWorkers = prometheus.NewDesc("pynox_workers",
		"Templates the pool runs (Config.Workers): how many jobs run at once.",
		nil, nil)
	descWorkersBusy = prometheus.NewDesc("pynox_workers_busy",
		"Workers not idle: running a job, or having their template replaced.",
		nil, nil)
	descJobsQueued = prometheus.NewDesc("pynox_jobs_queued",
		"Run calls waiting for a worker.",
		nil, nil)
)

// Collector returns a Prometheus collector of the pool's metrics, named
// pynox_* (see the README's "Metrics" section). The pool registers
// nothing itself: register the collector in a registry of your own, as
// in reg.MustRegister(p.Collector()). Each call returns a new collector of
// the same metrics; register one per registry. The counters are the ones
// [Pool.Stats] reads, so pynox_jobs_total summed is Stats.Jobs, and so
// on. Collecting takes the pool's counters' lock briefly and waits for
// no job.
func (p *Pool) Collector() prometheus.Collector { return poolCollector{p} }

type poolCollector struct{ p *Pool }

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descJobs, descJobDuration, descJobQueue, descJobCPU,
		descSessionsActive, descSessionsWaiting, descSessionSteps, descStepsRunning,
		descHostCalls, descHostCallDuration, descTemplateRestarts, descTemplateRestartFailures,
		descTemplatesUp, descSpares, descNSSpares, descWorkers, descWorkersBusy, descJobsQueued} {
		ch <- d
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.p
	if p.usable() != nil {
		return // a Pool that New did not make has nothing to report
	}
	// The counters Stats reads, and the job histograms, in one snapshot.
	p.stats.mu.Lock()
	var jobs [numOutcomes]map[string]int64
	for o, m := range p.stats.byOutcome {
		jobs[o] = maps.Clone(m)
	}
	steps := p.stats.steps
	cpu := p.stats.s.CPUMSTotal / 1000
	duration := p.stats.duration.metric(descJobDuration)
	queue := p.stats.queue.metric(descJobQueue)
	p.stats.mu.Unlock()
	for o, m := range jobs {
		for errorType, n := range m {
			ch <- prometheus.MustNewConstMetric(descJobs, prometheus.CounterValue, float64(n), outcomeNames[o], errorType)
		}
	}
	ch <- duration
	ch <- queue
	ch <- prometheus.MustNewConstMetric(descJobCPU, prometheus.CounterValue, cpu)
	ch <- prometheus.MustNewConstMetric(descSessionSteps, prometheus.CounterValue, float64(steps))

	p.coMu.Lock()
	active, waiting := len(p.checkouts), len(p.coWait.waiters)
	p.coMu.Unlock()
	ch <- prometheus.MustNewConstMetric(descSessionsActive, prometheus.GaugeValue, float64(active))
	ch <- prometheus.MustNewConstMetric(descSessionsWaiting, prometheus.GaugeValue, float64(waiting))
	ch <- prometheus.MustNewConstMetric(descStepsRunning, prometheus.GaugeValue, float64(p.stepsRunning.Load()))

	ch <- prometheus.MustNewConstMetric(descHostCalls, prometheus.CounterValue, float64(p.callSeq.Load()))
	ch <- p.hostCallTime.metric(descHostCallDuration)

	ch <- prometheus.MustNewConstMetric(descTemplateRestarts, prometheus.CounterValue, float64(p.templateRestarts.Load()))
	ch <- prometheus.MustNewConstMetric(descTemplateRestartFailures, prometheus.CounterValue, float64(p.templateRestartFailures.Load()))
	up, spareDeny, spareAllow, nsDeny, nsAllow := 0, 0, 0, 0, 0
	for _, w := range p.workers {
		tpl := w.live.Load()
		if tpl == nil || isDone(tpl.Done()) {
			continue
		}
		up++
		if tpl.HasSpare(false) {
			spareDeny++
		}
		if p.cfg.Limits.AllowNetwork && tpl.HasSpare(true) {
			spareAllow++
		}
		if tpl.HasNSSpare(false) {
			nsDeny++
		}
		if p.cfg.Limits.AllowNetwork && tpl.HasNSSpare(true) {
			nsAllow++
		}
	}
	ch <- prometheus.MustNewConstMetric(descTemplatesUp, prometheus.GaugeValue, float64(up))
	ch <- prometheus.MustNewConstMetric(descSpares, prometheus.GaugeValue, float64(spareDeny), "deny")
	if p.cfg.Limits.AllowNetwork {
		ch <- prometheus.MustNewConstMetric(descSpares, prometheus.GaugeValue, float64(spareAllow), "allow")
	}
	ch <- prometheus.MustNewConstMetric(descNSSpares, prometheus.GaugeValue, float64(nsDeny), "deny")
	if p.cfg.Limits.AllowNetwork {
		ch <- prometheus.MustNewConstMetric(descNSSpares, prometheus.GaugeValue, float64(nsAllow), "allow")
	}
	ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(p.cfg.Workers))
	ch <- prometheus.MustNewConstMetric(descWorkersBusy, prometheus.GaugeValue, float64(p.cfg.Workers-len(p.idle)))
	ch <- prometheus.MustNewConstMetric(descJobsQueued, prometheus.GaugeValue, float64(p.waiting.Load()))
}
