package worker

// checkedReply returns r, or an error reply in its place when its result
// is JSON the runner cannot decode. A host's result is JSON the host
// wrote (a `pynox pool` client's reply line, a Go host's
// json.RawMessage), which encoding/json checks for syntax only: not for
// UTF-8 inside its strings, nor for how deep it nests or how long its
// numbers are. The runner decodes a reply frame with Python's json
// module, and a frame it could not decode (bytes that are not UTF-8: a
// UnicodeDecodeError; 5,000 nested arrays: a RecursionError) left the
// call owed for good: the job's call raised that error and the job then
// hung until its timeout, waiting for a reply that had come (review 19).
// The result is held to the rule of a call's arguments (checkCallJSON:
// valid UTF-8, at most MaxCallDepth levels, numbers of at most
// MaxCallNumber characters, no key repeated in an object), and the job
// sees a HostError saying why it was not.
func checkedReply(r Reply) Reply {
	if r.Result == nil {
		return r
	}
	if err := checkCallJSON(r.Result); err != nil {
		msg := "the host's reply could not be encoded: its result: " + err.Error()
		return Reply{Error: &msg}
	}
	return r
}
