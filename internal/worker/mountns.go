package worker

import (
	"fmt"

	"github.com/pynox/pynox/internal/frame"
)

// Namespace is a job's user and mount namespace (built by
// internal/mountns), as the child's job frame hands it over.
type Namespace struct {
	User  int      // the user namespace's descriptor
	Mount int      // the mount namespace's descriptor
	Rules []NSRule // Landlock rules on paths inside the namespace
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

// TakeNS returns a process forked for one job with a mount namespace
// (Job.Namespace): it attaches its seccomp job layer only after entering
// the namespace, so no ready spare can serve such a job. Closing it asks
// for no replacement. It fails like TakeSession.
func (t *Template) TakeNS(network bool, cancel <-chan struct{}) (*Child, error) {
	kind, err := t.kindFor(network)
	if err != nil {
		return nil, err
	}
	if isClosed(t.done) {
		return nil, t.Err()
	}
	w := &sessionWait{ch: make(chan *Child, 1)}
	payload := nsForkFrames[kind]
	buf := frame.Append(make([]byte, 0, len(payload)+frame.HeaderSize), payload)
	t.wmu.Lock()
	t.mu.Lock()
	t.routes[kind] = append(t.routes[kind], w)
	t.mu.Unlock()
	_, err = t.conn.Write(buf)
	t.wmu.Unlock()
	if err != nil {
		t.fail(fmt.Errorf("request fork: %w", err))
		return nil, err
	}
	return t.awaitFork(w, cancel)
}
