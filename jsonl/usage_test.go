package jsonl

import (
	"encoding/json"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// TestUsageLines: results carry the kernel's "usage" object, the JSON
// log line its cpu_ms, and stats the total.
func TestUsageLines(t *testing.T) {
	t.Parallel()
	logFile, err := os.CreateTemp(t.TempDir(), "log")
	require.NoError(t, err)
	defer logFile.Close()
	p := newTestPool(t, pynox.Config{Workers: 1, Logger: slog.New(NewLogHandler(logFile))})
	lines := serveLines(t, p, `{"id": "a", "code": "sum(range(100000))"}
{"id": "b", "session": "s", "code": "x = bytearray(1 << 20)"}
{"id": "bad", "code": 1}
`)
	byID := map[string]map[string]any{}
	for _, l := range lines {
		if id, ok := l["id"].(string); ok {
			byID[id] = l
		}
	}
	for _, id := range []string{"a", "b"} {
		u, ok := byID[id]["usage"].(map[string]any)
		require.True(t, ok, "%s: %v", id, byID[id])
		require.Len(t, u, 4)
		for _, k := range []string{"cpu_ms", "max_rss_bytes", "minor_faults", "wall_ms"} {
			n, ok := u[k].(json.Number)
			require.True(t, ok, "%s: %s", id, k)
			f, err := n.Float64()
			require.NoError(t, err)
			require.Positive(t, f, "%s: %s", id, k)
		}
	}
	require.NotContains(t, byID["bad"], "usage")
	require.Positive(t, p.Stats().CPUMSTotal)

	logged, err := os.ReadFile(logFile.Name())
	require.NoError(t, err)
	seen := map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(string(logged)), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		if m["event"] == "job" {
			seen[m["id"].(string)] = m["cpu_ms"]
		}
	}
	require.Positive(t, seen["a"])
	require.Positive(t, seen["b"])
	require.Contains(t, seen, "bad")
	require.Nil(t, seen["bad"])
}
