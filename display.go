package pynox

// Rich outputs of a job: charts, tables and other MIME-typed data that the
// job shows with pynox_display.display or matplotlib.

import (
	"fmt"
	"runtime/debug"

	"github.com/pynox/pynox/internal/worker"
)

// Bounds of a job's (or session step's) rich outputs, Result.Outputs.
// An output beyond them, or one the pool refuses (a MIME type not in
// [OutputMIMETypes], data that is not valid base64 or UTF-8, an image
// whose bytes are not of its type), is dropped and counted in
// Result.OutputsDropped, and a text/plain marker ends Outputs; the job
// is not stopped.
const (
	// MaxOutputs is how many rich outputs a job or step keeps.
	MaxOutputs = worker.MaxOutputs
	// MaxOutputsBytes bounds the data of a job's or step's outputs
	// together (base64 text for images).
	MaxOutputsBytes = worker.MaxOutputsBytes
	// MaxOutputBytes bounds the data of one output.
	MaxOutputBytes = worker.MaxOutputBytes
)

// OutputMIMETypes returns the MIME types a rich output may have: image/png
// and image/jpeg (data in base64), image/svg+xml, text/html,
// text/markdown, text/plain and application/json (data as UTF-8 text).
func OutputMIMETypes() []string {
	return []string{"image/png", "image/jpeg", "image/svg+xml", "text/html", "text/markdown", "text/plain", "application/json"}
}

// Output is one rich output of a job: a figure, a table, anything shown
// with pynox_display.display. Its JSON form is {"mime": ..., "data": ...}.
type Output struct {
	// MIME is the output's MIME type, one of [OutputMIMETypes].
	MIME string `json:"mime"`
	// Data is the output's data: base64 (standard alphabet, padded) for
	// image/png and image/jpeg, the text itself for the other types.
	Data string `json:"data"`
}

// DisplayFunc receives a job's (or session step's) rich outputs while it
// runs, each once the pool has checked it, in the order the job showed
// them; see [Job.OnDisplay]. The calls come one at a time from a goroutine
// of the pool, and all of them return before the turn's result does. A
// slow callback does not slow the job (the pool queues up to MaxOutputs
// outputs), but holds up its result. A panic in it is logged and stops
// that turn's calls.
type DisplayFunc func(out Output)

// displayAdapter turns a DisplayFunc into the worker's, recovering from
// its panics; nil for nil.
func (p *Pool) displayAdapter(jobID any, session string, fn DisplayFunc) worker.DisplayFunc {
	if fn == nil {
		return nil
	}
	broken := false // the worker makes one call at a time
	return func(out worker.Output) {
		if broken {
			return
		}
		defer func() {
			if v := recover(); v != nil {
				broken = true
				p.log.Error("a display callback panicked; the job's later outputs are not passed on", "id", jobID, "session", session,
					"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			}
		}()
		fn(Output{MIME: out.MIME, Data: out.Data})
	}
}

// setOutputs copies a turn's rich outputs into r, and ends them with a
// marker when some were dropped.
func (r *Result) setOutputs(out *worker.Outcome) {
	if len(out.Outputs) == 0 && out.OutputsDropped == 0 {
		return
	}
	r.Outputs = make([]Output, 0, len(out.Outputs)+1)
	for _, o := range out.Outputs {
		r.Outputs = append(r.Outputs, Output{MIME: o.MIME, Data: o.Data})
	}
	if out.OutputsDropped > 0 {
		r.OutputsDropped = out.OutputsDropped
		r.Outputs = append(r.Outputs, Output{MIME: "text/plain",
			Data: fmt.Sprintf("[pynox: %d display output(s) dropped; the first because %s]", out.OutputsDropped, out.DroppedWhy)})
	}
}
