// Package jsonl is the pool protocol of pynox: JSON Lines over a pair of
// byte streams, as `pynox pool` speaks it on its standard input and
// output. It stands beside the library (package pynox) as net/rpc/jsonrpc
// stands beside net/rpc: the library runs jobs and sessions, this package
// reads requests, answers them through a [pynox.Pool] and writes results,
// call events and stats.
//
// [Serve] is the server: the ready event, then one JSON request per line
// and one JSON answer per line, in completion order, with backpressure
// (see its documentation for the bounds). Request lines are decoded
// strictly: keys must be exactly the protocol's field names, each at most
// once per object (encoding/json alone folds case and keeps the last of
// two equal keys), and every malformed line gets exactly one RequestError
// answer that names what is wrong. [MaxLine] bounds a line, and
// [MaxPendingSteps] a named session's queue; [ServeWith] adds a bound of
// its own per call ([ServeOptions]: requests in flight, which `pynox
// serve` sets per WebSocket connection). [NewLogHandler] renders the
// pool's job records as the protocol's JSON log, and [LoadConfig] reads
// the TOML configuration file of `pynox pool --config`.
//
// [Client] is the other end: it starts `pynox pool` ([StartCmd]) or wraps
// any pair of streams ([NewClient]) and offers [Client.Run],
// [Client.Session] and [Client.Stats], safe for concurrent use, with host
// calls answered by each request's HostFunc. A client of StartCmd reads
// the pool's output on the goroutines of the calls that wait for it, so
// that an answer reaches its call without a hand-over between goroutines
// (see [StartCmd]); a client whose host functions never block may have
// them run on that reading goroutine too ([Client.SetInlineHost]), with
// no goroutine and no wake-up of another thread per call. pynox-bench
// and the command's tests use it, and so does [Dial]: it connects to a `pynox serve`
// server's WebSocket and returns a [pynox.Pool] whose Run, Checkout and
// the rest go over a Client on that connection (see "Remote pools" in
// package pynox's documentation). There is one Go client of the
// protocol, this one.
//
// The protocol itself — every request and result field, events, errors,
// limits — is specified in the pool protocol document
// (spec/pool-protocol.txt in the design notes, docs/protocol.md in the
// repository).
//
// # Layering
//
// Imports flow one way: cmd/pynox → jsonl → pynox → internal/... . This
// package uses the library's public API, plus a few entry points that
// belong to no library user (internal/poolhook): a job run that forks
// the worker's next spare only once the answer is written, sessions known
// by the protocol's name (in their results, calls and log records), a
// session whose process ended taking the permissions of the next creating
// request, and refusals counted and logged like the pool's own. Dial
// makes a remote Pool through internal/poolhook as well (package pynox
// routes a remote Pool's methods to this package's implementation).
package jsonl
