package pynox

import (
	"time"

	"github.com/pynox/pynox/internal/worker"
)

// reapWait bounds how long a checkout's end waits for its killed process
// to be reaped by its template (which takes microseconds unless the
// machine is starved).
const reapWait = 5 * time.Second

// sessionChild returns a new process for a session, forked from one of
// the pool's warm templates: a template's ready spare when one has it, or
// else one forked for the session alone. The replacement of a spare taken
// is asked for once the session's first step has answered (Feed), at once
// when jobs wait for a worker, or when a job needs it first. It takes no worker: a session never holds
// the slot of a one-shot job, nor waits for one. A template found dead is
// replaced as a job would replace it; a template that dies while forking
// is given up for another, once. It fails when cancel closes, and when no
// template can fork.
func (p *Pool) sessionChild(network bool, cancel <-chan struct{}) (*worker.Child, error) {
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		w, tpl := p.sessionTemplate(network)
		if tpl == nil {
			var err error
			if tpl, err = w.template(); err != nil {
				return nil, err
			}
		}
		child, err := tpl.TakeSession(network, cancel)
		if err == nil {
			if p.waiting.Load() > 0 {
				// Jobs wait for a worker: the template's next spare is
				// needed now, not after the session's first step.
				child.RefillNow()
			}
			return child, nil
		}
		if isDone(cancel) {
			return nil, err
		}
		lastErr = err
	}
	return nil, lastErr
}

// sessionTemplate picks the template a session's process comes from: the
// first live one, in a rotation over the workers, that holds a ready
// spare; else the first live one; else it returns the worker to start a
// template for (and a nil template).
func (p *Pool) sessionTemplate(network bool) (*poolWorker, *worker.Template) {
	return p.pickSessionTemplate(func(t *worker.Template) bool { return t.HasSpare(network) })
}

// pickSessionTemplate is sessionTemplate with ready telling which
// template holds the process wanted.
func (p *Pool) pickSessionTemplate(ready func(*worker.Template) bool) (*poolWorker, *worker.Template) {
	n := len(p.workers)
	first := int(p.sessionSeq.Add(1) % uint64(n))
	var live *worker.Template
	for i := range n {
		w := p.workers[(first+i)%n]
		w.mu.Lock()
		t := w.tpl
		w.mu.Unlock()
		if t == nil || isDone(t.Done()) {
			continue
		}
		if ready(t) {
			return w, t
		}
		if live == nil {
			live = t
		}
	}
	return p.workers[first], live
}

// Done returns a channel that is closed once the checkout has ended —
// finished by [Checkout.Finish], closed for being idle for
// Config.SessionIdle, or ended by [Pool.Close] — and its process is gone
// and its slot among Config.MaxSessions free. [Checkout.Err] then says
// why. The end of one process (an exit, a crash, its template's death)
// does not end the checkout: the next step starts another.
func (c *Checkout) Done() <-chan struct{} {
	if c.remote != nil {
		return c.remote.Done()
	}
	return c.ended
}

// Err returns nil while the checkout is open, and why it ended once it
// has begun to end (Done is closed a moment later, once its process is
// gone): an error matching [ErrFinished] when its caller finished it or
// it was idle (the message says which), [ErrClosed] when the pool was
// closed. It is the error every later call on the checkout returns.
func (c *Checkout) Err() error {
	if c.remote != nil {
		return c.remote.Err()
	}
	return c.endErr()
}
