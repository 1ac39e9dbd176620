package pynox

import (
	"time"

	"github.com/pynox/pynox/internal/worker"
)

// Usage is a job's (or a session step's) resource usage as the kernel
// counted it; the job has no say in it. For a one-shot job it is the
// rusage of its process, which its template reads with wait4 when it
// reaps it, less the CPU time and faults the pool read from /proc/<pid>
// at the hand-over (the spare's own preparation after its fork, about a
// millisecond and a hundred or two faults): from the hand-over to the
// process's end, its exit included (unmapping its memory costs CPU time
// after the result is known, so CPUMS may exceed WallMS for a short
// job); its MaxRSSBytes is the process's whole life's. For a session's step it is what the process's
// counters in /proc/<pid> (read by the pool, with the process stopped,
// before and after the step) grew by during the step; its peak RSS is
// reset (clear_refs) before the step, so MaxRSSBytes is the step's own
// peak. A step that ends its process takes its end figures from the
// template's wait4 instead.
type Usage struct {
	// CPUMS is the user and system CPU time of all the process's threads,
	// in milliseconds.
	CPUMS float64 `json:"cpu_ms"`
	// MaxRSSBytes is the peak resident set size in bytes. A process
	// forked from the template counts the template's pages it maps (the
	// interpreter and the preloaded modules: tens of MiB) in its RSS.
	MaxRSSBytes int64 `json:"max_rss_bytes"`
	// MinorFaults counts the page faults served without I/O: roughly the
	// pages the job touched for the first time or copied from the
	// template.
	MinorFaults int64 `json:"minor_faults"`
	// WallMS is the wall-clock time from the hand-over of the code to the
	// result, in milliseconds (DurationUS/1000).
	WallMS float64 `json:"wall_ms"`
}

// usageOf converts a turn's usage; nil when the kernel's figures could
// not be read (the process vanished, or its template died).
func usageOf(out *worker.Outcome) *Usage {
	if out.Usage == nil {
		return nil
	}
	return &Usage{
		CPUMS:       roundMS(out.Usage.CPU),
		MaxRSSBytes: out.Usage.MaxRSS,
		MinorFaults: out.Usage.MinorFaults,
		WallMS:      roundMS(out.End.Sub(out.Start)),
	}
}

// roundMS is d in milliseconds, to the microsecond.
func roundMS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
