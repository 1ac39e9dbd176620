package pynox

import (
	"fmt"
	"runtime/debug"

	"github.com/pynox/pynox/internal/worker"
)

// Stream names one of a job's two output streams, for [OutputFunc].
type Stream int

// The output streams.
const (
	// Stdout is what the job writes to descriptor 1 (print, sys.stdout).
	Stdout Stream = worker.Stdout
	// Stderr is what the job writes to descriptor 2 (sys.stderr,
	// warnings, the traceback of an uncaught exception).
	Stderr Stream = worker.Stderr
)

// String returns "stdout" or "stderr", the names the pool protocol's
// output events use.
func (s Stream) String() string {
	switch s {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	}
	return fmt.Sprintf("Stream(%d)", int(s))
}

// MarshalText writes the stream's name, "stdout" or "stderr".
func (s Stream) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// MaxOutputChunk is the most bytes of the job's output one [OutputFunc]
// call passes on (one read of the stream's pipe; bytes that are not
// UTF-8, each replaced by the three bytes of U+FFFD, can make the text up
// to three times longer).
const MaxOutputChunk = worker.MaxStreamChunk

// OutputFunc receives a job's (or session step's) output while it runs;
// see [Job.OnOutput] and [Step.OnOutput].
//
// The calls come one at a time, from a goroutine of the pool, in the
// order the output was read: each stream's text in the order the job
// wrote it (what the job writes to stdout and to stderr in quick
// succession may be read in either order, as the two are separate pipes).
// text is valid UTF-8 and never empty: a character the job wrote in two
// pieces is passed whole, and a byte that is not part of a UTF-8
// character becomes U+FFFD, as in the Result's JSON form. Small writes
// are coalesced: after a short read the pool waits 5 ms before reading
// that stream again, so a job printing many lines makes a call per batch.
//
// Every call returns before Pool.Run, Checkout.Feed or Checkout.Resume
// returns the turn's result (or error): none comes after it. (A Feed or
// Resume that returns a Call leaves its step running: the step's output
// may go on while the call waits for Resume.) A slow
// callback slows the job instead of growing the pool's memory: while a
// call runs, its stream is not read, the kernel's pipe (64 KiB) fills and
// the job's next write waits; the pool holds at most MaxOutputChunk bytes
// of each stream (plus the text passed on) besides what the Result keeps.
// The job's timeout still runs meanwhile. A callback that never returns
// holds its Run or Feed up for as long. A panic in the callback is logged
// and stops that turn's calls (the job runs on), as a host function's
// panic fails only its call.
//
// The stream carries everything the job writes, not only the first
// MaxOutput bytes that the Result keeps.
type OutputFunc func(stream Stream, text string)

// outputAdapter turns an OutputFunc into the worker's, recovering from
// its panics; nil for nil.
func (p *Pool) outputAdapter(jobID any, session string, fn OutputFunc) worker.OutputFunc {
	if fn == nil {
		return nil
	}
	broken := false // the worker makes one call at a time
	return func(stream int, text string) {
		if broken {
			return
		}
		defer func() {
			if v := recover(); v != nil {
				broken = true
				p.log.Error("an output callback panicked; the job's later output is not passed on", "id", jobID, "session", session,
					"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			}
		}()
		fn(Stream(stream), text)
	}
}
