package pynox

import (
	"context"
	"time"

	"github.com/pynox/pynox/internal/poolhook"
)

func init() { poolhook.Impl = protocolHooks{} }

// protocolHooks gives the protocol package (jsonl) what it needs beyond
// the public API; see internal/poolhook. Its methods are exported only to
// satisfy the interface jsonl asserts: the type is not.
type protocolHooks struct{}

// Usable fails for a Pool that New did not make.
func (protocolHooks) Usable(p *Pool) error { return p.usable() }

// Run is Pool.Run, but leaves the request for the worker's next spare to
// the caller (refill, never nil), to make once the answer is written.
func (protocolHooks) Run(p *Pool, ctx context.Context, job Job) (*Result, func(), error) {
	return p.run(ctx, job)
}

// Checkout is Pool.Checkout for a session the protocol names: name
// appears in its results, calls and log records, and onEnd runs once when
// the checkout ends, whatever ends it.
func (protocolHooks) Checkout(p *Pool, ctx context.Context, job Job, name string, onEnd func(*Checkout)) (*Checkout, error) {
	return p.checkout(ctx, job, name, onEnd)
}

// Reconfigure gives a checkout whose process ended the permissions of a
// new creating request, keeping its template.
func (protocolHooks) Reconfigure(c *Checkout, job Job) error { return c.reconfigure(job) }

// SetRestore makes the next process of a checkout with no live process
// load the dump d (see Pool.Restore); it fails with a KindRequest error
// for a dump Pool.Restore would refuse.
func (protocolHooks) SetRestore(c *Checkout, d []byte) error { return c.setRestore(d) }

// Finished returns why the checkout ended, or nil while it is open.
func (protocolHooks) Finished(c *Checkout) error { return c.isFinished() }

// Refuse answers a request that runs nothing with e's message as a
// RequestError, for the named session if any, counting and logging it.
func (protocolHooks) Refuse(p *Pool, job *Job, session string, e *Error) *Result {
	res := p.refused(job, e)
	res.Session = session
	p.finish(job, res)
	return res
}

// Fail answers a session request the pool could not run with a
// PoolWorkerError that ends the session, counting and logging it.
func (protocolHooks) Fail(p *Pool, job *Job, session, msg string, accepted time.Time) *Result {
	res := p.failed(job, nil, KindCrashed, msg, accepted)
	res.Session = session
	res.SessionEnded = true
	p.finish(job, res)
	return res
}

// Cancelled answers a one-shot job that a cancel request ended, queued
// or running, with error type CancelledError and exit -1, counting and
// logging it.
func (protocolHooks) Cancelled(p *Pool, job *Job, accepted time.Time) *Result {
	res := p.failed(job, nil, KindRuntime, "the job was cancelled by a cancel request", accepted)
	res.Error.Type = "CancelledError"
	res.cancelled = true
	p.finish(job, res)
	return res
}

// PathProblem says why a configured path is refused, in the words of
// [ConfigError.Problem], so that the configuration file's errors read like
// New's.
func (protocolHooks) PathProblem(err error, want string) string { return pathProblem(err, want) }

// EmptyPath is the reason an empty path in a ceiling, a profile or the
// package directories is refused, the same for the file as for [New].
func (protocolHooks) EmptyPath() error { return errEmptyPath }
