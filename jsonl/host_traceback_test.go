package jsonl

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// A host function's failure raises pynox_host.HostError from the runner's
// call wrapper; the job's author must see their own frames only, not the
// runner's (`File "<string>", line 811, in call`), in a job and in a
// session step alike, and for an exception chained from it. A job's own
// exec("...") frames, also named "<string>", stay.
func TestHostErrorTracebackHidesRunner(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)

	check := func(r map[string]any, wantFrames ...string) {
		t.Helper()
		stderr, _ := r["stderr"].(string)
		require.Contains(t, stderr, "Traceback (most recent call last):", "%v", r)
		require.NotContains(t, stderr, "in call\n", "a runner frame shows: %s", stderr)
		require.NotContains(t, stderr, "in run\n", "a runner frame shows: %s", stderr)
		require.NotContains(t, stderr, `File "<string>", line 8`, "a runner frame shows: %s", stderr)
		for _, f := range wantFrames {
			require.Contains(t, stderr, f, "%s", stderr)
		}
		e := r["error"].(map[string]any)
		require.Equal(t, "<code>", e["file"], "%v", e)
	}

	code := `from pynox_host import lookup\ndef helper():\n    return lookup('x')\nhelper()`
	ls.send(`{"id": "job", "functions": ["lookup"], "code": "` + code + `"}`)
	c := ls.call()
	ls.send(fmt.Sprintf(`{"reply": {"call_id": %s, "error": "backend unavailable"}}`, c["call_id"]))
	r := ls.await("job")
	require.Equal(t, "HostError", errType(r), "%v", r)
	check(r, `File "<code>", line 4, in <module>`, `File "<code>", line 3, in helper`, "HostError: backend unavailable")
	require.Equal(t, 3, toInt(r["error"].(map[string]any)["line"]), "the innermost frame of the job's own code")

	// Chained: the cause's traceback is filtered too; the job's own
	// exec("...") frame is kept.
	code = `from pynox_host import lookup\ntry:\n    exec('lookup(1)')\nexcept Exception as e:\n    raise ValueError('wrapped') from e`
	ls.send(`{"id": "chain", "functions": ["lookup"], "code": "` + code + `"}`)
	c = ls.call()
	ls.send(fmt.Sprintf(`{"reply": {"call_id": %s, "error": "no"}}`, c["call_id"]))
	r = ls.await("chain")
	require.Equal(t, "ValueError", errType(r), "%v", r)
	check(r, `File "<string>", line 1, in <module>`, "HostError: no", "ValueError: wrapped")
	stderr := r["stderr"].(string)
	require.Equal(t, 1, strings.Count(stderr, `File "<string>"`), "only the job's own exec frame: %s", stderr)

	// A runaway recursion is still cut to its innermost frames.
	ls.send(`{"id": "deep", "code": "def f(n):\n    return f(n + 1)\nf(0)"}`)
	r = ls.await("deep")
	require.Equal(t, "RecursionError", errType(r), "%v", r)
	stderr = r["stderr"].(string)
	require.Contains(t, stderr, "[traceback cut to its innermost 100 frames]")
	require.LessOrEqual(t, strings.Count(stderr, `File "<code>", line 2, in f`), 100, "%s", stderr)
	require.NotContains(t, stderr, "in run\n")
}

func toInt(v any) int {
	var n int
	fmt.Sscan(fmt.Sprint(v), &n)
	return n
}
