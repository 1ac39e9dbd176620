package jsonl

import "github.com/pynox/pynox"

// outputEvent is the "output" line of the pool protocol: a piece of a
// streamed job's or session step's output (a request with "stream": true),
// written before the request's result.
type outputEvent struct {
	Event   string       `json:"event"` // "output"
	ID      any          `json:"id"`
	Session string       `json:"session,omitempty"`
	Stream  pynox.Stream `json:"stream"` // "stdout" or "stderr"
	Text    string       `json:"text"`
}

// outputFor returns the OutputFunc of a streamed request: each piece of
// output becomes an output event, written at once. The pool makes every
// call before it returns the result, which is written after it, so no
// output event follows its result; a client slow to read holds the
// writer, and so the job's writes, up.
func (s *server) outputFor(id any, session string) pynox.OutputFunc {
	return func(stream pynox.Stream, text string) {
		s.out.send(outputEvent{Event: "output", ID: id, Session: session, Stream: stream, Text: text})
	}
}

// displayEvent is the "display" line of the pool protocol: a rich output
// (a figure, a table) of a streamed job or session step, checked by the
// pool, written before the request's result.
type displayEvent struct {
	Event   string `json:"event"` // "display"
	ID      any    `json:"id"`
	Session string `json:"session,omitempty"`
	MIME    string `json:"mime"`
	Data    string `json:"data"`
}

// displayFor returns the DisplayFunc of a streamed request: each rich
// output becomes a display event, written at once. As for output events,
// every call returns before the result is written.
func (s *server) displayFor(id any, session string) pynox.DisplayFunc {
	return func(out pynox.Output) {
		s.out.send(displayEvent{Event: "display", ID: id, Session: session, MIME: out.MIME, Data: out.Data})
	}
}
