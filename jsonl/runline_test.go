package jsonl

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// TestRunLine: one request line in, one result line out; what needs the
// stream is refused naming the field, and a line beyond MaxLine is
// refused; nothing runs for a refusal.
func TestRunLine(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runLine := func(line string) map[string]any {
		b, err := RunLine(ctx, p, []byte(line))
		require.NoError(t, err)
		require.True(t, strings.HasSuffix(string(b), "}\n"), "one line: %q", b)
		require.Equal(t, 1, strings.Count(string(b), "\n"))
		m, err := decodeLine(b)
		require.NoError(t, err)
		return m
	}
	r := runLine(`{"id": "a", "code": "print(6 * 7)", "timeout": "5s"}`)
	require.Equal(t, "42\n", r["stdout"])
	require.Equal(t, "a", r["id"])
	for field, line := range map[string]string{
		"session":   `{"id": 1, "session": "nb", "code": "1"}`,
		"close":     `{"id": 1, "close": true}`,
		"functions": `{"id": 1, "functions": ["f"], "code": "1"}`,
		"reply":     `{"reply": {"call_id": 1, "result": 1}}`,
		"stats":     `{"id": 1, "stats": true}`,
		"stream":    `{"id": 1, "stream": true, "code": "1"}`,
		"interrupt": `{"id": 1, "interrupt": true}`,
		"cancel":    `{"id": 1, "cancel": 2}`,
		"dump":      `{"id": 1, "dump": true}`,
		"restore":   `{"id": 1, "restore": "AAAA", "code": "1"}`,
	} {
		r := runLine(line)
		require.Equal(t, "RequestError", errType(r), field)
		require.True(t, strings.HasPrefix(errMessage(r), field+": a single request"), "%s: %s", field, errMessage(r))
	}
	r = runLine(`{"id": "x", "code": 5}`)
	require.Equal(t, "x", r["id"])
	require.Contains(t, errMessage(r), "code: expected a string")
	r = runLine(`{"code": "` + strings.Repeat("x", MaxLine) + `"}`)
	require.Contains(t, errMessage(r), "exceeds")
	stats := p.Stats()
	require.Equal(t, int64(1), stats.OK, "only the first line ran")

	_, err := RunLine(ctx, &pynox.Pool{}, []byte(`{"code": "1"}`))
	require.Error(t, err)
}
