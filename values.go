package pynox

// Inputs of a job or step, and the value of its last expression.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/pynox/pynox/internal/worker"
)

// Bounds of inputs and values.
const (
	// MaxInputsBytes bounds a job's or step's Inputs, encoded as one JSON
	// object.
	MaxInputsBytes = 1 << 20
	// MaxValueBytes bounds Result.Value: a last expression whose JSON
	// encoding is longer is reported by its repr (Result.ValueRepr).
	MaxValueBytes = worker.MaxValue
	// MaxValueReprBytes bounds Result.ValueRepr, in bytes of UTF-8; a
	// longer repr is cut.
	MaxValueReprBytes = worker.MaxValueRepr
)

// pythonKeywords are the names Python reserves (soft keywords such as
// match and case are ordinary names): no input and no parameter of a
// declared tool may have one.
var pythonKeywords = []string{
	"False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
	"def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in",
	"is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
}

// checkInputName reports why name cannot be an input, or "". Names are
// an allow list: ASCII Python identifiers that are not keywords, and not
// dunder names (__name__, __builtins__ and their kin belong to Python).
func checkInputName(name string) string {
	if name == "" {
		return "a name must not be empty"
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		letter := c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
		if !letter && !(i > 0 && '0' <= c && c <= '9') {
			return fmt.Sprintf("%q is not a name: names are ASCII Python identifiers (a letter or _, then letters, digits or _)", name)
		}
	}
	if slices.Contains(pythonKeywords, name) {
		return fmt.Sprintf("%q is a Python keyword, not a name", name)
	}
	if len(name) > 4 && strings.HasPrefix(name, "__") && strings.HasSuffix(name, "__") {
		return fmt.Sprintf("%q is a dunder name, which Python's own module attributes use", name)
	}
	return ""
}

// encodeInputs checks inputs and encodes them as the JSON object the job
// receives; nil for none.
func encodeInputs(inputs map[string]any) (json.RawMessage, *Error) {
	if len(inputs) == 0 {
		return nil, nil
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range inputs {
			if !yield(k) {
				return
			}
		}
	})
	for _, name := range names {
		if why := checkInputName(name); why != "" {
			return nil, requestErrorf("inputs: %s", why)
		}
	}
	// Without HTML escapes (<, > and & as \u003c...): the size is that of
	// the JSON a client would write.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err := enc.Encode(inputs)
	raw := json.RawMessage(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
	if err != nil {
		for _, name := range names {
			if _, err := json.Marshal(inputs[name]); err != nil {
				return nil, requestErrorf("inputs: %s: expected a JSON value: %s", name, strings.TrimPrefix(err.Error(), "json: "))
			}
		}
		return nil, requestErrorf("inputs: expected JSON values: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if len(raw) > MaxInputsBytes {
		return nil, requestErrorf("inputs: %d bytes of JSON; the limit is %d", len(raw), MaxInputsBytes)
	}
	if err := worker.CheckJSON(raw); err != nil {
		return nil, requestErrorf("inputs: cannot be passed to Python: %v", err)
	}
	return raw, nil
}

// setValue copies the value a child reported into the result.
func (r *Result) setValue(out *worker.Outcome) {
	if len(out.Value) > 0 {
		r.Value = out.Value
	}
	r.ValueRepr = out.ValueRepr
}
