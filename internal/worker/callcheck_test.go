package worker

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckCallJSON checks the argument check on JSON Go accepts: only
// what breaks a client is refused, and nothing inside a string counts as
// nesting or a number.
func TestCheckCallJSON(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	long := strings.Repeat("7", MaxCallNumber)
	tests := []struct {
		in   string
		want string // "" when accepted
	}{
		{`[]`, ""},
		{`{}`, ""},
		{`["naïve 🐍", "\u00e9\ud800", true, false, null, -1.5e300, 0]`, ""},
		{deep(MaxCallDepth), ""},
		{deep(MaxCallDepth + 1), "nest deeper than 256"},
		{`[` + long + `]`, ""},
		{`[-` + long + `]`, "longer than 4300"},
		{`[1.` + long + `]`, "longer than 4300"},
		{"[\"\xff\"]", "not valid UTF-8"},
		{"{\"k\":\"a\xc3\"}", "not valid UTF-8"},
		// Brackets, quotes and digits inside strings are text.
		{`["` + strings.Repeat("[", 5000) + `"]`, ""},
		{`["\"` + strings.Repeat("{", 5000) + `\\"]`, ""},
		{`["` + strings.Repeat("9", 10000) + `"]`, ""},
		{`{"` + strings.Repeat("1", 5000) + `": 1}`, ""},
		// Numbers separated by other tokens are each their own.
		{`[` + long + `, ` + long + `]`, ""},
		// A key twice in one object, as decoded, anywhere; the same key in
		// different objects, or as a value, is fine.
		{`{"path":"a","path":"b"}`, `repeats the key "path"`},
		{`{"path":"a","p\u0061th":"b"}`, `repeats the key "path"`},
		{`[1, {"a": {"x": 1, "y": [{"k": 1, "k": 2}]}}]`, `repeats the key "k"`},
		{`{"a": {"b": 1}, "b": {"a": 1}, "c": ["a", "a"], "d": "d"}`, ""},
		{`{"a": 1, "A": 2, "b": {}, "c": [], "e": 1e400}`, ""},
		{`[{"a": 1}, {"a": 2}]`, ""},
	}
	for _, tc := range tests {
		require.True(t, json.Valid([]byte(tc.in)), "Go's decoder accepts it: %.60q", tc.in)
		err := checkCallJSON(json.RawMessage(tc.in))
		if tc.want == "" {
			require.NoError(t, err, "%.60q", tc.in)
		} else {
			require.ErrorContains(t, err, tc.want, "%.60q", tc.in)
		}
	}
}
