package pynox

import "fmt"

// Kind classifies an [Error].
type Kind int

// The kinds of [Error]. Each job outcome that is not a plain Python
// exception has the error type named in its comment in results.
const (
	// KindRuntime: the job's Python code raised an exception (error.type is
	// the exception class) or exited non-zero.
	KindRuntime Kind = iota + 1
	// KindRequest: the request was malformed or outside the ceiling; nothing
	// ran ("RequestError").
	KindRequest
	// KindTimeout: the job outlived its timeout and was killed
	// ("TimeoutError").
	KindTimeout
	// KindSignal: the job was killed by a signal it did not ask for, such as
	// SIGSEGV ("SignalError").
	KindSignal
	// KindSandboxSetup: a confinement step could not be applied, so no user
	// code ran ("SandboxSetupError").
	KindSandboxSetup
	// KindCrashed: the worker serving the job failed: its template died, or
	// the job broke the control protocol ("PoolWorkerError").
	KindCrashed
	// KindSpawn: a template could not be started.
	KindSpawn
	// KindClosed: the pool is closed, or the Pool was not made by [New].
	KindClosed
	// KindExhausted: Config.MaxSessions sessions are open already.
	KindExhausted
	// KindFinished: the checkout was finished, by its caller
	// ([Checkout.Finish]) or for being idle (Config.SessionIdle). A
	// checkout that [Pool.Close] ended answers KindClosed instead.
	KindFinished
	// KindProtocol: the caller broke a checkout's turn order: Resume with
	// no call waiting, or Feed while one waits.
	KindProtocol
	// KindDisconnected: a remote pool's connection to its server (see
	// jsonl.Dial) ended while the call was under way, or could not be
	// made: a job or step in flight may or may not have run, and its
	// result is lost; a checkout of that connection has ended with it,
	// since the server's sessions end with their connection. New work
	// opens a new connection. Monty's Disconnected.
	KindDisconnected
)

var kindNames = map[Kind]string{
	KindRuntime:      "Runtime",
	KindRequest:      "RequestError",
	KindTimeout:      "TimeoutError",
	KindSignal:       "SignalError",
	KindSandboxSetup: "SandboxSetupError",
	KindCrashed:      "PoolWorkerError",
	KindSpawn:        "Spawn",
	KindClosed:       "Closed",
	KindExhausted:    "Exhausted",
	KindFinished:     "Finished",
	KindProtocol:     "Protocol",
	KindDisconnected: "Disconnected",
}

// String returns the kind's name; for the kinds that appear in results it
// is the error type used there.
func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Error is the one error type of this package.
type Error struct {
	Kind Kind
	// Type is the error type as it appears in results: the Python exception
	// class for KindRuntime, the kind's name otherwise.
	Type    string
	Message string
	Err     error // an underlying cause, if any
}

// Error formats the error as "Type: message".
func (e *Error) Error() string {
	t := e.Type
	if t == "" {
		t = e.Kind.String()
	}
	msg := t
	if e.Message != "" {
		msg += ": " + e.Message
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is the sentinel of e's kind, so that
// errors.Is(err, pynox.ErrTimeout) works for every error of that kind.
// Sentinels are recognised by identity, not by their fields: the package
// never returns a sentinel itself (every error it returns is a fresh
// value a caller may keep or change), and changing a sentinel's fields
// does not change what it matches.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	k, ok := sentinelKinds[t]
	return ok && k == e.Kind
}

// Sentinels for errors.Is, one per [Kind]. They are only ever compared
// against: an error of this package is never one of them.
var (
	ErrRuntime      = &Error{Kind: KindRuntime}
	ErrRequest      = &Error{Kind: KindRequest}
	ErrTimeout      = &Error{Kind: KindTimeout}
	ErrSignal       = &Error{Kind: KindSignal}
	ErrSandboxSetup = &Error{Kind: KindSandboxSetup}
	ErrCrashed      = &Error{Kind: KindCrashed}
	ErrSpawn        = &Error{Kind: KindSpawn}
	ErrClosed       = &Error{Kind: KindClosed}
	ErrExhausted    = &Error{Kind: KindExhausted}
	ErrFinished     = &Error{Kind: KindFinished}
	ErrProtocol     = &Error{Kind: KindProtocol}
	ErrDisconnected = &Error{Kind: KindDisconnected}
)

// sentinelKinds maps each sentinel to its kind, fixed at start-up.
var sentinelKinds = map[*Error]Kind{
	ErrRuntime:      KindRuntime,
	ErrRequest:      KindRequest,
	ErrTimeout:      KindTimeout,
	ErrSignal:       KindSignal,
	ErrSandboxSetup: KindSandboxSetup,
	ErrCrashed:      KindCrashed,
	ErrSpawn:        KindSpawn,
	ErrClosed:       KindClosed,
	ErrExhausted:    KindExhausted,
	ErrFinished:     KindFinished,
	ErrProtocol:     KindProtocol,
	ErrDisconnected: KindDisconnected,
}

// errClosed returns a fresh KindClosed error.
func errClosed() *Error { return newError(KindClosed, "the pool is closed") }

// errFinished returns a fresh KindFinished error for a checkout its
// caller finished.
func errFinished() *Error { return newError(KindFinished, "the checkout was finished") }

func newError(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Type: k.String(), Message: fmt.Sprintf(format, args...)}
}

// requestErrorf returns a KindRequest error.
func requestErrorf(format string, args ...any) *Error {
	return newError(KindRequest, format, args...)
}
