package worker

// The value of a job's last expression, as its child reports it: checked
// here before it leaves the worker, since the child is hostile once user
// code runs.

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// MaxValue bounds the JSON value of a job's last expression, in bytes.
// The runner reports a larger one by its repr instead.
const MaxValue = 1 << 20

// MaxValueRepr bounds the repr of a last expression's value that has no
// JSON value, in bytes of UTF-8; the runner cuts a longer one.
const MaxValueRepr = 64 << 10

// checkValue checks the value a "done" report carries and returns why it
// is refused, or "". An honest runner reports a JSON value only when
// every client reads it back the same (the checks of host-call
// arguments: checkCallJSON), of at most MaxValue bytes, or else a repr of
// at most MaxValueRepr bytes; never both. JSON null counts as no value.
func checkValue(m *childMsg) string {
	if bytes.Equal(bytes.TrimSpace(m.Value), []byte("null")) {
		m.Value = nil
	}
	switch {
	case len(m.Value) > 0 && m.ValueRepr != nil:
		return "its report carried both a value and a value_repr"
	case len(m.Value) > MaxValue:
		return fmt.Sprintf("the value it reported is %d bytes of JSON; the limit is %d", len(m.Value), MaxValue)
	case m.ValueRepr != nil && len(*m.ValueRepr) > MaxValueRepr:
		return fmt.Sprintf("the value_repr it reported is %d bytes; the limit is %d", len(*m.ValueRepr), MaxValueRepr)
	case len(m.Value) > 0:
		if err := checkCallJSON(m.Value); err != nil {
			return fmt.Sprintf("the value it reported cannot be passed on: %v", err)
		}
	}
	return ""
}

// CheckJSON checks JSON that encoding/json produced or accepted against
// what every client, and the job's own json module, reads back the same:
// valid UTF-8, at most MaxCallDepth levels, numbers of at most
// MaxCallNumber characters, no object that repeats a key.
func CheckJSON(raw []byte) error { return checkCallJSON(raw) }

// marshalFrame encodes a frame to a child without HTML escapes: a job's
// inputs (and code) of "<" and "&" keep their size instead of growing
// sixfold as \u003c and \u0026.
func marshalFrame(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
