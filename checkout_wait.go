package pynox

import (
	"context"
	"time"
)

// checkoutQueue holds the Checkout calls that wait for a session slot, in
// order of arrival. A slot that frees while some wait is reserved for the
// first of them (reserved counts those not yet taken), so that a newcomer
// that does not wait — a `pynox pool` session, or a Checkout arriving
// later — cannot take it first. Guarded by Pool.coMu.
type checkoutQueue struct {
	waiters  []*slotWaiter
	reserved int
}

// slotWaiter is one waiting Checkout call.
type slotWaiter struct {
	ready chan struct{} // closed once a slot is reserved for it
	woken bool          // a slot is reserved for it
	used  bool          // it took its slot, or gave it back
}

// slotKey is the context key under which a woken waiter's checkout
// carries its reservation.
type slotKey struct{}

// claim takes the slot reserved for the waiter ctx carries, if any;
// p.coMu is held.
func (q *checkoutQueue) claim(ctx context.Context) bool {
	w, _ := ctx.Value(slotKey{}).(*slotWaiter)
	if w == nil || !w.woken || w.used {
		return false
	}
	w.used = true
	q.reserved--
	return true
}

// wakeCheckoutLocked reserves each free slot for the longest waiter and
// wakes it: one waiter per slot; p.coMu is held.
func (p *Pool) wakeCheckoutLocked() {
	q := &p.coWait
	for len(q.waiters) > 0 && len(p.checkouts)+q.reserved < p.cfg.MaxSessions {
		w := q.waiters[0]
		q.waiters = q.waiters[1:]
		w.woken = true
		q.reserved++
		close(w.ready)
	}
}

// abandon removes a waiter that gives up, handing a slot reserved for it
// meanwhile to the next one.
func (p *Pool) abandon(w *slotWaiter) {
	p.coMu.Lock()
	defer p.coMu.Unlock()
	q := &p.coWait
	if !w.woken {
		for i, x := range q.waiters {
			if x == w {
				q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
				break
			}
		}
		return
	}
	if !w.used {
		w.used = true
		q.reserved--
		p.wakeCheckoutLocked()
	}
}

// checkoutWaiting is Checkout at Config.MaxSessions: it waits in line for
// a slot until Config.CheckoutTimeout passes (ErrExhausted), ctx ends
// (ctx.Err()) or the pool closes (ErrClosed).
func (p *Pool) checkoutWaiting(ctx context.Context, job Job) (*Checkout, error) {
	timer := time.NewTimer(p.cfg.CheckoutTimeout)
	defer timer.Stop()
	w := &slotWaiter{ready: make(chan struct{})}
	p.coMu.Lock()
	p.coWait.waiters = append(p.coWait.waiters, w)
	p.wakeCheckoutLocked() // a slot that freed since the refusal
	p.coMu.Unlock()
	select {
	case <-w.ready:
		co, err := p.checkout(context.WithValue(ctx, slotKey{}, w), job, "", nil)
		p.abandon(w) // a checkout that failed before taking its slot gives it back
		return co, err
	case <-timer.C:
		p.abandon(w)
		return nil, newError(KindExhausted, "max_sessions sessions are open and none finished within the checkout timeout of %s", p.cfg.CheckoutTimeout)
	case <-ctx.Done():
		p.abandon(w)
		return nil, ctx.Err()
	case <-p.closing:
		p.abandon(w)
		return nil, errClosed()
	}
}
