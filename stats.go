package pynox

import (
	"maps"
	"sync"
	"time"
)

// Stats is a snapshot of a pool's counters: the "stats" answer of the
// pool protocol. The outcome counters OK, Failed, Timeouts, Signals,
// RequestErrors, WorkerErrors and Cancelled are disjoint and add up to
// Jobs.
type Stats struct {
	UptimeMS       int64 `json:"uptime_ms"`
	Workers        int   `json:"workers"`
	SessionsActive int   `json:"sessions_active"`
	// Jobs counts every answered request.
	Jobs int64 `json:"jobs"`
	// OK counts jobs that exited 0.
	OK int64 `json:"ok"`
	// Failed counts jobs whose Python code raised or exited non-zero.
	Failed int64 `json:"failed"`
	// Timeouts counts jobs killed at their timeout.
	Timeouts int64 `json:"timeouts"`
	// Signals counts jobs killed by a signal (SignalError).
	Signals int64 `json:"signals"`
	// RequestErrors counts requests refused before anything ran.
	RequestErrors int64 `json:"request_errors"`
	// WorkerErrors counts jobs lost to the pool's side: a dead template, a
	// confinement step that could not be applied (SandboxSetupError), a
	// broken control protocol.
	WorkerErrors int64 `json:"worker_errors"`
	// Cancelled counts one-shot jobs a cancel request ended, queued or
	// running (CancelledError): their code neither raised nor exited.
	Cancelled int64 `json:"cancelled"`
	// DurationMSTotal and QueueUSTotal sum the results' duration_ms and
	// queue_us.
	DurationMSTotal int64 `json:"duration_ms_total"`
	QueueUSTotal    int64 `json:"queue_us_total"`
	// CPUMSTotal sums the results' usage.cpu_ms: the CPU time the kernel
	// counted for the jobs and steps, in milliseconds.
	CPUMSTotal float64 `json:"cpu_ms_total"`
	// Errors counts failed jobs by error type. A job can name its own
	// exception classes, so the map holds at most 256 names of at most
	// 128 bytes: failures of any further or longer type count under
	// "(other)".
	Errors map[string]int64 `json:"errors"`
}

// maxStatsErrorTypes bounds Stats.Errors: the first 256 error types seen
// get a key of their own, the rest count under statsOtherErrors.
const maxStatsErrorTypes = 256

// maxStatsErrorTypeLen bounds the length of Stats.Errors' keys: a job
// names its exception class, with no length bound of its own, so a
// longer type counts under statsOtherErrors.
const maxStatsErrorTypeLen = 128

// statsOtherErrors is Stats.Errors' key for error types past the bounds
// (a job may name a class so too, and then counts under it).
const statsOtherErrors = "(other)"

type statsCounters struct {
	mu sync.Mutex
	s  Stats // Errors is copied by snapshot
	// For the metrics (metrics.go), counted with s: the answered requests
	// by outcome and error type, session steps, and the run and queue
	// times of the requests that were not refused.
	byOutcome       [numOutcomes]map[string]int64
	steps           int64
	duration, queue histogram
}

func (c *statsCounters) record(r *Result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.s.Jobs++
	c.s.DurationMSTotal += r.DurationMS
	c.s.QueueUSTotal += r.QueueUS
	if r.Usage != nil {
		c.s.CPUMSTotal += r.Usage.CPUMS
	}
	if r.Error != nil {
		if c.s.Errors == nil {
			c.s.Errors = map[string]int64{}
		}
		key := r.Error.Type
		if _, seen := c.s.Errors[key]; len(key) > maxStatsErrorTypeLen || !seen && len(c.s.Errors) >= maxStatsErrorTypes {
			key = statsOtherErrors // a job names its own exception classes: bound the map
		}
		c.s.Errors[key]++
	}
	var outcome int
	switch {
	case r.cancelled:
		c.s.Cancelled++
		outcome = outcomeCancelled
	case r.kind == 0 || r.kind == KindRuntime:
		if r.Error == nil && r.Exit == 0 {
			c.s.OK++
			outcome = outcomeOK
		} else {
			c.s.Failed++
			outcome = outcomeFailed
		}
	case r.kind == KindTimeout:
		c.s.Timeouts++
		outcome = outcomeTimeout
	case r.kind == KindSignal:
		c.s.Signals++
		outcome = outcomeSignal
	case r.kind == KindRequest:
		c.s.RequestErrors++
		outcome = outcomeRequestError
	default:
		c.s.WorkerErrors++
		outcome = outcomeWorkerError
	}
	if c.byOutcome[outcome] == nil {
		c.byOutcome[outcome] = map[string]int64{}
	}
	c.byOutcome[outcome][errorTypeLabel(r.Error)]++
	if r.Step > 0 { // a session step's (Checkout.stamp)
		c.steps++
	}
	if r.kind != KindRequest {
		c.duration.observe(time.Duration(r.DurationUS) * time.Microsecond)
		c.queue.observe(time.Duration(r.QueueUS) * time.Microsecond)
	}
}

func (c *statsCounters) snapshot() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.s
	s.Errors = maps.Clone(c.s.Errors)
	if s.Errors == nil {
		s.Errors = map[string]int64{}
	}
	return s
}
