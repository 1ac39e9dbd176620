package jsonl

// Interrupting a session's step and cancelling a one-shot job.

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pynox/pynox"
)

// interruptedEvent answers an interrupt request: whether a step of the
// session was running, and so was interrupted (its result follows).
type interruptedEvent struct {
	ID          any    `json:"id"`
	Session     string `json:"session"`
	Interrupted bool   `json:"interrupted"`
}

// cancelEvent answers a cancel request: whether a queued or running
// one-shot job had the id (each such job's CancelledError result follows).
type cancelEvent struct {
	ID        any  `json:"id"`
	Cancel    any  `json:"cancel"`
	Cancelled bool `json:"cancelled"`
}

// jobEntry is a one-shot job from the time it is read until it is
// answered: a cancel request ends its ctx.
type jobEntry struct {
	job       pynox.Job
	key       string // its id as JSON: what a cancel request names
	accepted  time.Time
	ctx       context.Context
	stop      context.CancelFunc
	cancelled atomic.Bool // a cancel request ended it
}

// cancelTable holds the one-shot jobs by id.
type cancelTable struct {
	mu   sync.Mutex
	jobs map[string][]*jobEntry
}

// idKey is an id's canonical form: 1 and "1" differ, 1 and 1.0 do too
// (ids are echoed as written, so they are compared as written).
func idKey(id any) string {
	b, _ := json.Marshal(id)
	return string(b)
}

// add tracks a job read from the input.
func (t *cancelTable) add(parent context.Context, job pynox.Job) *jobEntry {
	e := &jobEntry{job: job, key: idKey(job.ID), accepted: time.Now()}
	e.ctx, e.stop = context.WithCancel(parent)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.jobs == nil {
		t.jobs = map[string][]*jobEntry{}
	}
	t.jobs[e.key] = append(t.jobs[e.key], e)
	return e
}

// remove forgets an answered job.
func (t *cancelTable) remove(e *jobEntry) {
	e.stop()
	t.mu.Lock()
	defer t.mu.Unlock()
	list := t.jobs[e.key]
	for i, x := range list {
		if x == e {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(t.jobs, e.key)
	} else {
		t.jobs[e.key] = list
	}
}

// take marks the jobs with the key cancelled and returns them.
func (t *cancelTable) take(key string) []*jobEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	list := append([]*jobEntry(nil), t.jobs[key]...)
	for _, e := range list {
		e.cancelled.Store(true)
	}
	return list
}

// cancel answers a cancel request, ending the one-shot jobs with the id
// it names: those still queued (held) are answered at once and dropped
// from the queue it returns; those running are killed, and answer once
// they are gone. The request's own answer comes first.
func (s *server) cancel(req request, held []*jobEntry) []*jobEntry {
	if extra := setFields(req); len(extra) != 1 || req.Session != "" || req.Close || req.Reply != nil {
		s.out.send(refuse(s.p, &pynox.Job{ID: req.ID}, requestErrorf("a cancel request takes no other fields than id and cancel")))
		return held
	}
	dec := json.NewDecoder(bytes.NewReader(req.Cancel))
	dec.UseNumber()
	var id any
	if dec.Decode(&id) != nil || id == nil || checkID(id) != nil {
		s.out.send(refuse(s.p, &pynox.Job{ID: req.ID}, requestErrorf("cancel: expected the id of a job (a string or a number), got %s", req.Cancel)))
		return held
	}
	found := s.cancels.take(idKey(id))
	s.out.send(cancelEvent{ID: req.ID, Cancel: id, Cancelled: len(found) > 0})
	queued := map[*jobEntry]bool{}
	for _, e := range held {
		if e.cancelled.Load() {
			queued[e] = true
		}
	}
	if len(queued) > 0 {
		kept := held[:0]
		for _, e := range held {
			if !queued[e] {
				kept = append(kept, e)
			}
		}
		clear(held[len(kept):])
		held = kept
	}
	for _, e := range found {
		if queued[e] {
			s.cancels.remove(e)
			s.answered()
			s.out.send(hooks.Cancelled(s.p, &e.job, e.accepted))
		} else {
			e.stop() // its Run returns, and it answers CancelledError
		}
	}
	return held
}

// interrupt answers an interrupt request: the session's running step, if
// any, gets KeyboardInterrupt (see pynox.Checkout.Interrupt). The answer
// is written before the step's result can be.
func (s *server) interrupt(req request) {
	switch {
	case req.Session == "":
		s.out.send(refuse(s.p, &pynox.Job{ID: req.ID}, requestErrorf("interrupt needs the session whose step to interrupt")))
		return
	case len(setFields(req)) != 1 || req.Close || req.Reply != nil:
		s.refuseSession(req, requestErrorf("an interrupt request takes no other fields than id, session and interrupt"))
		return
	}
	s.mu.Lock()
	ns := s.sessions[req.Session]
	var co *pynox.Checkout
	if ns != nil {
		co = ns.co
	}
	s.mu.Unlock()
	if ns == nil {
		s.refuseSession(req, requestErrorf("no session named %q is open", req.Session))
		return
	}
	s.out.sendWith(func() any {
		return interruptedEvent{ID: req.ID, Session: req.Session, Interrupted: co != nil && co.Interrupt()}
	})
}

// sendWith writes the line f returns, calling f under the writer's lock:
// a line another goroutine sends because of what f did comes after it.
func (lw *lineWriter) sendWith(f func() any) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.err != nil {
		f()
		return
	}
	b, err := marshalLine(f())
	if err != nil {
		b, _ = marshalLine(map[string]any{"event": "error", "message": err.Error()})
	}
	if _, err := lw.bw.Write(b); err != nil {
		lw.err = err
		return
	}
	lw.err = lw.bw.Flush()
}
