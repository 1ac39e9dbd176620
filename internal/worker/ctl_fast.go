package worker

import "bytes"

// The reports an honest runner writes most, decoded without
// encoding/json: a step's "done" report in the exact bytes runner.py's
// session_loop and finish format it ({"t":"done","step":N,"exit":E,
// "error":null}, with ,"final":true before the brace for a last report).
// json.Unmarshal into a childMsg cost about 7 µs of the host's work
// between a session step's report and its result (issue 12): reflection
// over childMsg's fields and the field cache's lookups. Only these exact
// bytes take the short way, and decode them to what json.Unmarshal
// would; anything else (another frame, other spacing, a number written
// otherwise) goes to json.Unmarshal as before, so a child's frame means
// nothing new.

var (
	doneHead  = []byte(`{"t":"done","step":`)
	doneExit  = []byte(`,"exit":`)
	doneTail  = []byte(`,"error":null}`)
	doneFinal = []byte(`,"error":null,"final":true}`)
)

// decodeDone decodes payload into m when it is a "done" report in the
// runner's exact common format, and reports whether it was.
func decodeDone(payload []byte, m *childMsg) bool {
	rest, ok := bytes.CutPrefix(payload, doneHead)
	if !ok {
		return false
	}
	step, rest, ok := cutInt(rest)
	if !ok {
		return false
	}
	if rest, ok = bytes.CutPrefix(rest, doneExit); !ok {
		return false
	}
	exit, rest, ok := cutInt(rest)
	if !ok {
		return false
	}
	final := false
	switch {
	case bytes.Equal(rest, doneTail):
	case bytes.Equal(rest, doneFinal):
		final = true
	default:
		return false
	}
	e := int(exit)
	*m = childMsg{T: "done", Step: int(step), Exit: &e, Final: final}
	return true
}

// cutInt takes a JSON integer from the start of b: an optional minus
// sign and at most 15 digits, without leading zeros (so that it fits an
// int and a float64 alike, as json.Unmarshal would read it). It reports
// false for anything else.
func cutInt(b []byte) (int64, []byte, bool) {
	neg := false
	if len(b) > 0 && b[0] == '-' {
		neg, b = true, b[1:]
	}
	n := 0
	var v int64
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		v = v*10 + int64(b[n]-'0')
		n++
	}
	if n == 0 || n > 15 || (n > 1 && b[0] == '0') {
		return 0, nil, false
	}
	if neg {
		v = -v
	}
	return v, b[n:], true
}
