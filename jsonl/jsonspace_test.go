package jsonl

import (
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// TestServeJSONWhitespaceOnly: only JSON's whitespace (space, tab, CR,
// LF) makes a line blank or may follow its object. A line holding a form
// feed, or an object followed by one (the fuzzer's "null\f"), is refused
// with one answer naming the problem, never skipped or accepted; blank
// lines are still skipped.
func TestServeJSONWhitespaceOnly(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	lines := serveLines(t, p, "\f\n \t\r\n{\"id\": 1, \"code\": \"print(1)\"}\f\n{\"id\": 2, \"code\": \"print(2)\"}\n")
	require.Len(t, lines, 4, "the ready event and three answers: %v", lines)
	var refused, ran int
	for _, l := range lines[1:] {
		if e, ok := l["error"].(map[string]any); ok && e["type"] == "RequestError" {
			refused++
			continue
		}
		require.Equal(t, "2\n", l["stdout"], "%v", l)
		ran++
	}
	require.Equal(t, 2, refused, "the form-feed line and the object followed by a form feed")
	require.Equal(t, 1, ran)
	_, err := decodeRequest([]byte("null\f"))
	require.NotNil(t, err)
}
