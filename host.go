package pynox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/pynox/pynox/internal/worker"
)

// Host-function bounds of the pool protocol.
const (
	// MaxCallBytes bounds a host call's arguments and its result, each as
	// JSON.
	MaxCallBytes = worker.MaxCall
	// MaxCalls is how many host calls one job, or one session step, may
	// make; later calls raise pynox_host.HostError in the job.
	MaxCalls = 1000
	// MaxFunctions is how many host functions a job may declare.
	MaxFunctions = 64
	// MaxInFlight is how many host calls a job may have in flight at
	// once (awaited together through pynox_host.aio, or made from several
	// threads): a further call waits in the job until one is answered.
	// With Job.Host set, up to this many of a job's calls run at once,
	// each on its own goroutine.
	MaxInFlight = worker.MaxInFlight
)

// Call is a host-function call made by a job: the CodeAct pattern, where
// code written by a model calls the application's tools directly. Its
// JSON form is the "call" event of `pynox pool`.
type Call struct {
	// JobID is the ID of the job (or session step) that made the call.
	JobID any `json:"id"`
	// Session names the session of a step's call; empty for one-shot jobs.
	Session string `json:"session,omitempty"`
	// ID is unique within the pool; a reply names it.
	ID int64 `json:"call_id"`
	// Function is one of the job's declared Functions.
	Function string `json:"function"`
	// Args and Kwargs are the call's arguments: a JSON array and a JSON
	// object, written by untrusted code. The pool guarantees valid UTF-8,
	// at most 256 levels, numbers of at most 4,300 characters and no key
	// repeated exactly within an object; keys that differ only in case
	// ("a" and "A", both valid Python keyword names) are distinct. Go's
	// encoding/json matches struct fields case-insensitively (and with
	// Unicode folding), keeping the last match: a host that checks the
	// arguments as a map and then decodes them into a struct could act on
	// a value it never checked. Check and use the same decoded value, or
	// decode into a map.
	Args   json.RawMessage `json:"args"`
	Kwargs json.RawMessage `json:"kwargs"`
}

// HostFunc answers a job's host calls. Its result is encoded as JSON (a
// json.RawMessage is passed on as it is) and returned to the job; an error
// raises pynox_host.HostError in the job with the error's text. ctx ends
// when the job does (a timeout, say): the answer is then dropped.
//
// HostFunc runs on a goroutine of its own while the job waits, so it may
// block; the time it takes counts against the job's timeout.
//
// A HostFunc that panics (or returns a value whose encoding panics) fails
// only that call, as net/http does for a handler: the job sees HostError
// with a generic message that reveals nothing of the host, and the panic
// value and its stack are logged at level Error through Config.Logger.
type HostFunc func(ctx context.Context, call *Call) (any, error)

// ResumeValue answers a [Call] surfaced by a [Checkout] as a [TurnEvent]:
// build it with [Return] or [Raise], and pass it to [Checkout.Resume]
// with the call's ID.
type ResumeValue struct {
	result  any
	err     *string
	errType string
}

// Return answers a call with a value, which is encoded as JSON (a
// json.RawMessage is passed on as it is).
func Return(v any) ResumeValue { return ResumeValue{result: v} }

// Raise answers a call with an error: the job sees pynox_host.HostError
// with this message.
func Raise(message string) ResumeValue { return ResumeValue{err: &message} }

// HostError is an error a host function raises as a given builtin Python
// exception type: [RaiseAs] makes one. A [HostFunc] returns it (possibly
// wrapped: errors.As finds it) to raise that type in the job, and
// [RaiseError] turns it into the [ResumeValue] of a [Checkout.Resume].
//
// The job sees a class named Type that derives from both the builtin type
// and pynox_host.HostError, so `except KeyError` and `except HostError`
// both catch it. The class is made inside the sandbox from a fixed list
// of names ([HostErrorTypes]); a type name is never evaluated.
type HostError struct {
	// Type is the builtin exception type's name, one of HostErrorTypes.
	// Any other name (an empty one included) raises plain
	// pynox_host.HostError.
	Type string
	// Message is the exception's text.
	Message string
}

// Error returns the message, prefixed by the type.
func (e *HostError) Error() string {
	if e.Type == "" {
		return e.Message
	}
	return e.Type + ": " + e.Message
}

// RaiseAs returns an error that raises the builtin exception pyType (one
// of [HostErrorTypes], such as "KeyError" or "PermissionError") with
// message in the job, as an instance of pynox_host.HostError too:
//
//	return nil, pynox.RaiseAs("KeyError", "no such page")
//
// A pyType outside the list raises plain pynox_host.HostError with the
// message, and the pool logs a warning.
func RaiseAs(pyType, message string) *HostError {
	return &HostError{Type: pyType, Message: message}
}

// RaiseError answers a call with an error for [Checkout.Resume]: a
// [*HostError] anywhere in err's chain raises its type with its message,
// and any other error raises pynox_host.HostError with err's text.
func RaiseError(err error) ResumeValue {
	if he, ok := errors.AsType[*HostError](err); ok {
		msg := he.Message
		return ResumeValue{err: &msg, errType: he.Type}
	}
	msg := err.Error()
	return ResumeValue{err: &msg}
}

// hostErrorTypes lists the builtin exception types a host may raise in a
// job; runner.py's HOST_ERROR_TYPES is the same list.
var hostErrorTypes = []string{
	"ValueError", "TypeError", "KeyError", "IndexError", "LookupError", "AttributeError",
	"PermissionError", "FileNotFoundError", "FileExistsError", "IsADirectoryError",
	"NotADirectoryError", "OSError", "TimeoutError", "ConnectionError",
	"ConnectionRefusedError", "ConnectionResetError", "RuntimeError",
	"NotImplementedError", "ZeroDivisionError", "OverflowError",
}

// HostErrorTypes returns the names of the builtin exception types that
// [RaiseAs] and a reply's "error_type" may name, in a new slice.
func HostErrorTypes() []string { return slices.Clone(hostErrorTypes) }

// IsHostErrorType reports whether name is one of [HostErrorTypes].
func IsHostErrorType(name string) bool { return slices.Contains(hostErrorTypes, name) }

// reply encodes v for the job; a value that cannot be encoded, or is too
// large, becomes an error the job sees.
func (v ResumeValue) reply() worker.Reply {
	if v.err != nil {
		r := worker.Reply{Error: v.err}
		if IsHostErrorType(v.errType) {
			r.ErrorType = v.errType
		}
		return r
	}
	var b []byte
	var err error
	if raw, ok := v.result.(json.RawMessage); ok {
		if !json.Valid(raw) {
			err = errors.New("the result is not valid JSON")
		}
		b = raw
	} else {
		b, err = json.Marshal(v.result)
	}
	if err == nil && len(b) > MaxCallBytes {
		err = fmt.Errorf("the result is %d bytes of JSON; the limit is %d", len(b), MaxCallBytes)
	}
	if err != nil {
		msg := "the host's result could not be passed on: " + err.Error()
		return worker.Reply{Error: &msg}
	}
	return worker.Reply{Result: b}
}

// hostPanicMessage is what a job sees when its host function panicked.
const hostPanicMessage = "the host function failed"

// newCall numbers a job's call pool-wide.
func (p *Pool) newCall(jobID any, session string, c worker.Call) *Call {
	return &Call{JobID: jobID, Session: session, ID: p.callSeq.Add(1), Function: c.Function, Args: c.Args, Kwargs: c.Kwargs}
}

// hostAdapter turns a HostFunc into the worker's callback, numbering the
// calls pool-wide.
func (p *Pool) hostAdapter(jobID any, session string, host HostFunc) worker.HostFunc {
	if host == nil {
		return nil
	}
	return func(ctx context.Context, c worker.Call) (r worker.Reply) {
		call := p.newCall(jobID, session, c)
		start := time.Now()
		defer func() { p.hostCallTime.observe(time.Since(start)) }()
		// A panic fails this call only, as net/http does for a handler:
		// the job sees a generic HostError, the operator the panic.
		defer func() {
			if v := recover(); v != nil {
				p.log.Error("a host function panicked", "id", jobID, "session", session, "call_id", call.ID,
					"function", call.Function, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				r = Raise(hostPanicMessage).reply()
			}
		}()
		v, err := host(ctx, call)
		if err != nil {
			rv := RaiseError(err)
			if rv.errType != "" && !IsHostErrorType(rv.errType) {
				p.log.Warn("a host function raised an exception type that is not allowed; the job sees HostError",
					"id", jobID, "session", session, "call_id", call.ID, "function", call.Function, "error_type", rv.errType)
			}
			return rv.reply()
		}
		return Return(v).reply()
	}
}

// checkFunctions validates declared host-function names.
func checkFunctions(names []string) *Error {
	if len(names) > MaxFunctions {
		return requestErrorf("functions: %d declared; at most %d are allowed", len(names), MaxFunctions)
	}
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if !isIdentifier(n) || strings.HasPrefix(n, "_") || n == "HostError" || n == "aio" || len(n) > 64 {
			return requestErrorf("functions: %q is not allowed: a name must be a Python identifier of at most 64 characters, not starting with _ and not HostError or aio", n)
		}
		if seen[n] {
			return requestErrorf("functions: %q is declared twice", n)
		}
		seen[n] = true
	}
	return nil
}

// isIdentifier reports whether s is an ASCII Python identifier.
func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if r > unicode.MaxASCII || !(r == '_' || unicode.IsLetter(r) || (i > 0 && unicode.IsDigit(r))) {
			return false
		}
	}
	return true
}
