package pynox

import (
	"context"
	"encoding/json"
	"time"

	"github.com/pynox/pynox/internal/poolhook"
)

// A remote pool is a *Pool whose work runs on a `pynox serve` server over
// its WebSocket (GET /v1/pool), made by jsonl.Dial. The protocol client
// lives in package jsonl, which imports this one, so this package only
// routes a remote Pool's and Checkout's methods to the two interfaces
// below; jsonl implements them on its one protocol client (jsonl.Client).

// remoteBackend is a pool served over the network.
type remoteBackend interface {
	Run(ctx context.Context, job Job) (*Result, error)
	// Checkout opens a session on the server (restore, when not nil, is
	// a dump its first process loads); the value is a remoteCheckout.
	Checkout(ctx context.Context, job Job, restore []byte) (any, error)
	Stats(ctx context.Context) (Stats, error)
	Close() error
	Shutdown(ctx context.Context) error
}

// remoteCheckout is a session on the server.
type remoteCheckout interface {
	Feed(ctx context.Context, step Step) (TurnEvent, error)
	// Resume answers callID with a JSON result, or with the error errMsg
	// raised as errType (one of HostErrorTypes, or "").
	Resume(ctx context.Context, callID int64, result json.RawMessage, errMsg *string, errType string) (TurnEvent, error)
	Wait(ctx context.Context) (TurnEvent, error)
	Interrupt() bool
	Finish(ctx context.Context) error
	Done() <-chan struct{}
	Err() error
	Dump(ctx context.Context) (*Dump, error)
}

// remoteInfo is what a remote server's ready event says of its pool that
// a Pool has no other field for (the rest goes to cfg, info and self):
// [Pool.Cgroups] and [Pool.Mounts] return it.
type remoteInfo struct {
	cgroups string
	mounts  MountSupport
}

// remotePoolHooks gives package jsonl the constructor of a remote Pool
// (internal/poolhook.Remote).
type remotePoolHooks struct{}

func init() { poolhook.Remote = remotePoolHooks{} }

// NewRemote returns a Pool whose methods go to b, which must implement
// remoteBackend (a mismatch panics at once, in jsonl's tests); the other
// arguments are the server's ready event's.
func (remotePoolHooks) NewRemote(b any, workers int, preloaded []string, pidNamespace bool, cgroups string,
	self SelfConfinement, mounts MountSupport) *Pool {
	p := &Pool{remote: b.(remoteBackend), start: time.Now()}
	p.cfg.Workers = workers
	p.info.Preloaded = preloaded
	p.info.PIDNamespace = pidNamespace
	p.self = self
	p.remoteInfo = remoteInfo{cgroups: cgroups, mounts: mounts}
	return p
}

// IsRemote reports whether the pool runs its work on a `pynox serve`
// server (a Pool made by jsonl.Dial) rather than in this process.
func (p *Pool) IsRemote() bool { return p.remote != nil }

// remoteCheckoutOf wraps a remote session as a Checkout.
func (p *Pool) remoteCheckoutOf(rc any, err error) (*Checkout, error) {
	if err != nil {
		return nil, err
	}
	return &Checkout{pool: p, remote: rc.(remoteCheckout)}, nil
}

// remoteResume is Checkout.Resume on a remote checkout: the value is
// encoded here, with the same rules and limits as for a local one.
func (c *Checkout) remoteResume(ctx context.Context, callID int64, v ResumeValue) (TurnEvent, error) {
	r := v.reply()
	return c.remote.Resume(ctx, callID, r.Result, r.Error, r.ErrorType)
}

// remoteStatsTimeout bounds the round trip of a remote Pool's Stats.
const remoteStatsTimeout = 10 * time.Second

// StatsContext returns a snapshot of the pool's counters, as [Pool.Stats]
// does. For a remote pool it asks the server (a stats request), and fails
// when no answer comes before ctx ends or the connection cannot be made
// (KindDisconnected); for a local pool it never fails.
func (p *Pool) StatsContext(ctx context.Context) (Stats, error) {
	if p.remote != nil {
		return p.remote.Stats(ctx)
	}
	return p.Stats(), nil
}

// remoteStats is Pool.Stats of a remote pool: the server's counters, or
// zero Stats when they cannot be had within remoteStatsTimeout (use
// StatsContext to see why).
func (p *Pool) remoteStats() Stats {
	ctx, cancel := context.WithTimeout(context.Background(), remoteStatsTimeout)
	defer cancel()
	s, _ := p.remote.Stats(ctx)
	return s
}
