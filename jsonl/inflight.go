package jsonl

import "github.com/pynox/pynox"

// ServeOptions are bounds of one [ServeWith] call beyond the protocol's
// own; the zero value adds none (it is [Serve]).
type ServeOptions struct {
	// MaxInFlight, when positive, bounds the requests of this call in
	// flight: one-shot jobs and session requests (steps, closes, dumps)
	// accepted and not yet answered. At the bound, a further job or
	// session step is answered at once with a RequestError that says so,
	// and the call serves on; closes and dumps are still accepted (each
	// session holds at most MaxPendingSteps requests anyway), as are
	// replies, stats, interrupts and cancels, which need no room. It
	// stops one connection of `pynox serve` from holding every session
	// and queue place of the pool.
	MaxInFlight int
	// LimitName names MaxInFlight's setting in that RequestError, as in
	// "--max-inflight-per-conn"; empty, the message says "the limit".
	LimitName string
}

// overLimit reports whether req is a job or a session step that the
// MaxInFlight bound refuses now. Only the reader adds to inFlight, so the
// bound is never passed.
func (s *server) overLimit(req request) bool {
	return s.limit.MaxInFlight > 0 && !req.Close && !req.Dump && s.inFlight.Load() >= int64(s.limit.MaxInFlight)
}

// limitError is the refusal of a request beyond MaxInFlight.
func (s *server) limitError() *pynox.Error {
	name := "the limit"
	if s.limit.LimitName != "" {
		name = "the limit, " + s.limit.LimitName
	}
	return requestErrorf("%d requests of this connection are in flight (%s); read their results before sending more", s.limit.MaxInFlight, name)
}

// answered counts a job or session request answered (or dropped unrun).
func (s *server) answered() { s.inFlight.Add(-1) }
