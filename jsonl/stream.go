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
