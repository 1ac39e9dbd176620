package jsonl

import (
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/pynox/pynox"
)

// dumpEvent answers a session's dump request: the dump (base64 in JSON),
// the globals left out of it, and the session's step count.
type dumpEvent struct {
	ID      any      `json:"id"`
	Session string   `json:"session"`
	Dump    []byte   `json:"dump"`
	Skipped []string `json:"skipped"`
	Steps   int      `json:"steps"`
}

// dumpSession answers a dump request with the session's dump, or refuses
// it: no such session, or the dump failed (the message says why).
func (s *server) dumpSession(ns *namedSession, co *pynox.Checkout, req request) {
	if co == nil {
		s.refuseSession(req, requestErrorf("no session named %q is open", req.Session))
		return
	}
	d, err := co.Dump(s.ctx)
	if err != nil {
		if errors.Is(err, pynox.ErrTimeout) || errors.Is(err, pynox.ErrCrashed) {
			// The dump ended the session's process: the next request
			// starts a new one, with the permissions it brings.
			ns.ended = true
		}
		s.refuseSession(req, requestErrorf("dump: %v", err))
		return
	}
	s.out.send(dumpEvent{ID: req.ID, Session: ns.name, Dump: d.Data, Skipped: nonNilStrings(d.Skipped), Steps: d.Steps})
}

// asRequestError returns err as the *pynox.Error a refusal carries.
func asRequestError(err error) *pynox.Error {
	var pe *pynox.Error
	if errors.As(err, &pe) && pe.Kind == pynox.KindRequest {
		return pe
	}
	return requestErrorf("%v", err)
}

// describeBase64Error says what is wrong with a dump sent as "restore"
// (the request's only base64 field) that is not base64.
func describeBase64Error(err error) (string, bool) {
	var ce base64.CorruptInputError
	if !errors.As(err, &ce) {
		return "", false
	}
	return fmt.Sprintf("restore: expected a dump in standard base64 (RFC 4648, with padding), as a dump answer gives it; invalid at byte %d", int64(ce)), true
}
