package jsonl

import (
	"strings"
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// Request errors a person can act on (issue 10 item 6): each names the
// field or the column and says what is expected, in the protocol's words
// rather than Go's.
func TestServeRequestErrorsSayWhatIsExpected(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	cases := []struct {
		line string
		want []string
	}{
		{`not json at all`, []string{"not valid JSON at column 2", `such as {"id": 1, "code": "print(1)"}`}},
		{`{"id": "ü", "code": "1",, "x": 1}`, []string{"not valid JSON at column 25"}},
		{`{"id": 1, "code": "1"`, []string{"not valid JSON", "the line ends at column 22"}},
		{`{"id": 2, "code": "pass", "timeout": 5}`, []string{`timeout: expected a duration string such as "5s"`, "got a JSON number"}},
		{`{"id": 3, "code": "pass", "timeout": "5"}`, []string{`timeout: invalid duration "5"`, `"5s"`}},
		{`{"id": 4, "code": "pass", "max_file_size": "lots"}`, []string{`max_file_size: invalid size "lots"`}},
		{`{"id": 5, "code": "pass", "memory": true}`, []string{`memory: invalid size true: want a positive integer of bytes or a string such as "512m"`}},
		{`{"id": 6, "code": 7}`, []string{"code: expected a string, got a JSON number"}},
		{`{"id": 7, "code": "pass", "allow_read": "data"}`, []string{"allow_read: expected an array of strings, got a JSON string"}},
		{`{"id": 8, "reply": {"call_id": "x", "result": 1}}`, []string{"reply.call_id: expected an integer, got a JSON string"}},
		{`{"id": 9, "code": "pass", "profile": "analysis"}`, []string{`profile: unknown profile "analysis": this pool has no profiles configured`, "[profiles.NAME]"}},
		{`[1]`, []string{"the request must be a JSON object"}},
		{`{"id": 10, "code": "pass", "allow_read": ["nope"]}`, []string{"allow_read: nope: no such file or directory (a relative path resolves against the pool's working directory, " + p.Config().Dir + ")"}},
	}
	input := ""
	for _, c := range cases {
		input += c.line + "\n"
	}
	lines := serveLines(t, p, input)
	require.Len(t, lines, len(cases)+1)
	// Refusals of lines that reach the planner may come after later ones.
	var msgs []string
	for _, r := range lines[1:] {
		require.Equal(t, "RequestError", errType(r), "%v", r)
		msg := r["error"].(map[string]any)["message"].(string)
		require.NotContains(t, msg, "cannot use a JSON", "%v", r)
		require.NotContains(t, msg, "pynox.", "Go type names: %v", r)
		msgs = append(msgs, msg)
	}
	for _, c := range cases {
		found := false
		for _, msg := range msgs {
			ok := true
			for _, w := range c.want {
				ok = ok && strings.Contains(msg, w)
			}
			found = found || ok
		}
		require.True(t, found, "no answer to %s says %q; answers:\n%s", c.line, c.want, strings.Join(msgs, "\n"))
	}
}
