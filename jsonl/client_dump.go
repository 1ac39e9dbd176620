package jsonl

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/pynox/pynox"
)

// RestoreSession is [Client.Session] for a session whose first process
// loads the dump d (from [Session.Dump], or [pynox.Checkout.Dump]) before
// its first step: the first step's request carries it as "restore". Over
// the protocol a request line is at most MaxLine bytes, so d's base64
// must fit one.
func (c *Client) RestoreSession(name string, job pynox.Job, d []byte) *Session {
	s := c.Session(name, job)
	s.restore = d
	return s
}

// Dump returns the session's dump, as the server's "dump" answer gives
// it; the session goes on. A session that never ran a step has nothing
// to dump: Dump fails with a KindRequest error, as for a failed dump
// (the message says why).
func (s *Session) Dump(ctx context.Context) (*pynox.Dump, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	line, err := s.c.roundTrip(ctx, &request{Session: s.name, Dump: true}, nil)
	if err != nil {
		return nil, err
	}
	var ev struct {
		Dump    []byte           `json:"dump"`
		Skipped []string         `json:"skipped"`
		Steps   int              `json:"steps"`
		Error   *pynox.ErrorInfo `json:"error"`
	}
	if err := json.Unmarshal(line, &ev); err != nil {
		return nil, fmt.Errorf("jsonl: an unreadable dump answer: %v: %.200q", err, line)
	}
	if ev.Error != nil {
		return nil, &pynox.Error{Kind: pynox.KindRequest, Type: ev.Error.Type, Message: ev.Error.Message}
	}
	if ev.Dump == nil {
		return nil, fmt.Errorf("jsonl: a dump request answered %.200q", line)
	}
	return &pynox.Dump{Data: ev.Dump, Skipped: ev.Skipped, Steps: ev.Steps}, nil
}
