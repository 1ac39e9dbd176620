package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/pynox/pynox/internal/frame"
)

// Namespace is a job's user and mount namespace (built by
// internal/mountns), as the child's job frame hands it over.
type Namespace struct {
	User  int      // the user namespace's descriptor
	Mount int      // the mount namespace's descriptor
	Rules []NSRule // Landlock rules on paths inside the namespace
	// Entered says the child entered its namespace before the job (a
	// leased one: see Child.TakeNSLease): User and Mount are not used.
	// Without Attach, the job's mounts have been attached to it already.
	Entered bool
	// Attach, with Entered, attaches the job's mounts to the namespace.
	// Run sends the job first and calls Attach while the child confines
	// itself; the child waits for word that it succeeded (an "attached"
	// frame) before it opens anything in the namespace or runs any
	// code. When Attach fails, Run kills the child: a setup error, no
	// code ran.
	Attach func() error
}

// errChildGone is afterSend's error when the child died before it could
// take the code.
var errChildGone = errors.New("the child is gone")

// attachedFrame tells a child waiting for its job's mounts (a job frame
// with "ns_wait") that they are attached (runner.py: await_attached).
var attachedFrame = []byte(`{"t":"attached"}`)

// NSLease is a prepared mount namespace leased for a ready ns spare
// (Options.NSLease), which enters it before its job.
type NSLease struct {
	// User and Mount are the namespace's descriptors (the lease's to
	// close); the template sends them to the spare and closes them, with
	// raw close(2)s (no os.File: its Close goes through syscall.Syscall,
	// which wakes the runtime's monitor thread when every P was idle: see
	// internal/rawsys).
	User, Mount int
	// ID is the lease's number at the pool's mounter.
	ID int64
	// Release ends the lease at the mounter; the child calls it when it
	// is closed while it still holds the lease (its job never came).
	Release func()
	// Data is the lessor's own (what the namespace holds, say); the
	// template does not look at it.
	Data any
}

// enterFrame asks a ready ns spare to enter the namespace whose user and
// mount namespace descriptors come with it (runner.py: Spare.main).
var enterFrame = []byte(`{"t":"enter"}`)

// ErrNSLeaseBusy is what an Options.NSLease returns when no namespace is
// ready to lease now (the mounter's stock is being rebuilt): the lease is
// tried again a little later, while the spare waits for its job.
var ErrNSLeaseBusy = errors.New("no prepared namespace is ready to lease")

// nsLeaseRetry is the wait before a ready ns spare's first lease tried
// again, doubled each time up to nsLeaseRetryMax: the lease is tried
// until one comes or the spare is taken.
const (
	nsLeaseRetry    = 2 * time.Millisecond
	nsLeaseRetryMax = 50 * time.Millisecond
)

// preEnter leases a namespace for c, a ready ns spare about to be
// delivered, and sends it to c to enter ahead of its job. When none is
// ready it tries again in the background, after c's delivery, until c is
// taken. Without a lease (the mounter failed, say, or the job came
// first), c enters its job's namespace when the job comes, as a spare
// without NSLease does.
func (t *Template) preEnter(c *Child) {
	if t.tryLease(c) == ErrNSLeaseBusy {
		go func() {
			wait := nsLeaseRetry
			for {
				timer := time.NewTimer(wait)
				select {
				case <-timer.C:
				case <-c.closed:
					timer.Stop()
					return
				case <-t.done:
					timer.Stop()
					return
				}
				if t.tryLease(c) != ErrNSLeaseBusy {
					return
				}
				wait = min(2*wait, nsLeaseRetryMax)
			}
		}()
	}
}

// tryLease leases a namespace for c and sends it to c, unless c was
// taken (or closed) already; it returns the lease's error, or nil.
func (t *Template) tryLease(c *Child) error {
	c.leaseMu.Lock()
	taken := c.leaseTaken
	c.leaseMu.Unlock()
	if taken {
		return nil
	}
	l, err := t.nsLease()
	if err != nil {
		return err
	}
	c.leaseMu.Lock()
	defer c.leaseMu.Unlock()
	if !c.leaseTaken {
		// Sent under leaseMu: a taker's job frame comes after it.
		err = c.sendRaw(enterFrame, []int{l.User, l.Mount})
	}
	rawClose(l.User)
	rawClose(l.Mount)
	l.User, l.Mount = -1, -1
	if c.leaseTaken || err != nil {
		// Taken meanwhile, or the spare cannot be told (it then fails or
		// dies with its job).
		go l.Release()
		return nil
	}
	c.lease = l
	return nil
}

// TakeNSLease returns the lease of the namespace the child entered ahead
// of its job, and hands it to the caller, who attaches the job's mounts
// to it (or releases it); nil when the child entered none (its job then
// brings a namespace of its own in Job.Namespace). From then on the child
// is sent no lease.
func (c *Child) TakeNSLease() *NSLease {
	c.leaseMu.Lock()
	defer c.leaseMu.Unlock()
	c.leaseTaken = true
	l := c.lease
	c.lease = nil
	return l
}

// releaseLease ends the lease the child still holds, if any.
func (c *Child) releaseLease() {
	if l := c.TakeNSLease(); l != nil && l.Release != nil {
		go l.Release()
	}
}

// NSRule is a Landlock rule on a path the child opens after entering its
// namespace: a mount of the namespace's own (an overlay), which no
// descriptor of the host names.
type NSRule struct {
	Path   string
	Access uint64
}

// MarshalJSON encodes the rule as [path, access].
func (r NSRule) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, "[%q,%d]", r.Path, r.Access), nil
}

// nsForkFrames are the fork requests of a spare that enters its job's
// namespace before its job layer (runner.py: _FORK_NS_KINDS).
var nsForkFrames = [2][]byte{
	kindDeny:  []byte(`{"t":"fork","kind":"deny","ns":true}`),
	kindAllow: []byte(`{"t":"fork","kind":"allow","ns":true}`),
}

// nsReadyRoute routes a forked ns spare to the template's ready ns spare
// of its kind (Template.nsSpares); compared by identity, never waited on.
var nsReadyRoute = &sessionWait{}

// TakeNS returns the template's ready spare for a job with a mount
// namespace (Job.Namespace) of the kind the job needs, waiting for it if
// the template is still forking it. Such a spare has done every step of
// a spare but its seccomp job layer, which it attaches only after
// entering the job's namespace (the layer denies setns and capset), so
// it can serve nothing but a job that brings one. The template keeps
// none until the first TakeNS of the kind asks for one; from then on it
// keeps one ready, as it does its spare. Closing the child asks for its
// replacement (see Child.Close, HoldRefill and RefillNow). TakeNS fails
// like Take: when the template dies, when cancel closes (a spare that
// comes later stays the template's), and when none comes within the
// spare timeout (the template is then declared wedged).
func (t *Template) TakeNS(network bool, cancel <-chan struct{}) (*Child, error) {
	kind, err := t.kindFor(network)
	if err != nil {
		return nil, err
	}
	select {
	case c := <-t.nsSpares[kind]:
		return c, nil
	default:
	}
	if isClosed(t.done) {
		return nil, t.Err()
	}
	t.mu.Lock()
	first := !t.nsKept[kind]
	t.nsKept[kind] = true
	h := t.nsHeld[kind]
	t.nsTaking[kind]++ // see Take
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.nsTaking[kind]--
		t.mu.Unlock()
	}()
	if first {
		if err := t.requestNSFork(kind, nsReadyRoute); err != nil {
			t.fail(fmt.Errorf("request fork: %w", err))
			return nil, err
		}
	} else if h != nil {
		// A session took the last ns spare and holds its replacement
		// back until its first step answers: a job does not wait for
		// that.
		h.RefillNow()
	}
	if takeWaitHook != nil {
		takeWaitHook(kind, true)
	}
	timer := time.NewTimer(t.spareTimeout)
	defer timer.Stop()
	select {
	case c := <-t.nsSpares[kind]:
		return c, nil
	case <-t.done:
		return nil, t.Err()
	case <-cancel:
		return nil, errCanceled
	case <-timer.C:
		err := fmt.Errorf("template forked no spare in %s", t.spareTimeout)
		t.fail(err)
		return nil, err
	}
}

// TakeNSSession returns a process for a session with a mount namespace:
// the template's ready ns spare of the kind when there is one, or else
// one forked for the session alone, as TakeSession does for a session
// without one. The replacement of a ready ns spare taken is asked for by
// the child's RefillNow (once the session's first step has answered) or
// by the next TakeNS that finds none, whichever comes first, or at once
// when a TakeNS already waits for one of the kind. The first
// call for a kind also asks for the template's ready ns spare of that
// kind, after the session's own. It fails like TakeSession.
func (t *Template) TakeNSSession(network bool, cancel <-chan struct{}) (*Child, error) {
	kind, err := t.kindFor(network)
	if err != nil {
		return nil, err
	}
	if c := t.holdReady(t.nsSpares[kind], &t.nsHeld[kind], &t.nsTaking[kind]); c != nil {
		return c, nil
	}
	if isClosed(t.done) {
		return nil, t.Err()
	}
	w := &sessionWait{ch: make(chan *Child, 1)}
	if err := t.requestNSFork(kind, w); err != nil {
		t.fail(fmt.Errorf("request fork: %w", err))
		return nil, err
	}
	t.mu.Lock()
	first := !t.nsKept[kind]
	t.nsKept[kind] = true
	t.mu.Unlock()
	if first {
		if err := t.requestNSFork(kind, nsReadyRoute); err != nil {
			t.fail(fmt.Errorf("request fork: %w", err))
			return nil, err
		}
	}
	return t.awaitFork(w, cancel)
}

// RetireNSSpares closes each ready ns spare whose lease retire approves
// and asks for its replacement (which leases anew): a lessor that no
// longer wants a namespace kept alive (the pool's namespaces attached
// ahead, once it went idle) gets it back now rather than at the spare's
// next job. A spare retire does not approve stays the ready one.
func (t *Template) RetireNSSpares(retire func(*NSLease) bool) {
	for kind := range t.nsSpares {
		var c *Child
		select {
		case c = <-t.nsSpares[kind]:
		default:
			continue
		}
		c.leaseMu.Lock()
		l := c.lease
		c.leaseMu.Unlock()
		if l == nil || !retire(l) {
			select {
			case t.nsSpares[kind] <- c:
				continue
			default:
			}
		}
		c.Close() // its lease is released with it
		c.RefillNow()
	}
}

// HasNSSpare reports whether the template holds a ready spare for a job
// with a mount namespace, with (or without) the network: a hint, stale
// as soon as it returns.
func (t *Template) HasNSSpare(network bool) bool {
	kind := kindDeny
	if network {
		kind = kindAllow
	}
	return len(t.nsSpares[kind]) > 0
}

// requestNSFork asks for an ns spare of kind that goes to w: the
// template's ready ns spare when w is nsReadyRoute.
func (t *Template) requestNSFork(kind int, w *sessionWait) error {
	payload := nsForkFrames[kind]
	buf := frame.Append(make([]byte, 0, len(payload)+frame.HeaderSize), payload)
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.mu.Lock()
	t.routes[kind] = append(t.routes[kind], w)
	t.mu.Unlock()
	_, err := t.connWrite(buf)
	return err
}

// refillChild asks for the replacement of c, a child done with: the
// next ready ns spare when c was one, else the next spare.
func (t *Template) refillChild(c *Child) {
	if !c.nsSpare {
		t.refill(c.kind)
		return
	}
	if isClosed(t.done) {
		return
	}
	if err := t.requestNSFork(c.kind, nsReadyRoute); err != nil {
		t.fail(fmt.Errorf("request fork: %w", err))
	}
}

// deliverNS makes c the template's ready ns spare of its kind. It is
// called with t.mu held, and unlocks it; it reports false when the
// template failed.
func (t *Template) deliverNS(c *Child, kind int) bool {
	select {
	case t.nsSpares[kind] <- c:
		t.mu.Unlock()
		return true
	default:
		t.mu.Unlock()
		// Never more than one ns spare of a kind is requested.
		t.fail(errors.New("template forked an ns spare nobody asked for"))
		c.Close() // after fail: it asks for no replacement
		return false
	}
}

// attachAfterSend is a turn's afterSend for a job whose mounts attach runs
// once the job is sent (Namespace.Attach): it attaches them and tells the
// child; nil without attach.
func (c *Child) attachAfterSend(attach func() error) func() error {
	if attach == nil {
		return nil
	}
	return func() error {
		if err := attach(); err != nil {
			return err
		}
		if err := c.sendRaw(attachedFrame, nil); err != nil {
			// It died before it could take the code (no code ran): the
			// job may go to another process.
			return fmt.Errorf("%w: %w", errChildGone, err)
		}
		return nil
	}
}
