// Package poolhook hands the protocol package (jsonl) the few entry points
// of package pynox that it needs and that are not part of the library's
// API: a job run whose next spare is forked only once its answer is
// written, sessions named by the protocol, and results for requests the
// protocol refuses, counted and logged like the pool's own.
//
// Imports flow one way (cmd/pynox → jsonl → pynox → internal/...), so this
// package cannot name the root package's types: package pynox stores a
// value in Impl from its init, and jsonl asserts the interface it expects
// of it in its own init (a mismatch panics there, at the first test or
// start). Nothing else sets or reads Impl.
package poolhook

// Impl is package pynox's implementation of the hooks; set once, by
// package pynox's init, before any other package's init reads it.
var Impl any

// Remote is package pynox's constructor of a remote Pool (a Pool whose
// methods go to a `pynox serve` server), which jsonl.Dial asserts and
// uses; set once, by package pynox's init.
var Remote any
