package jsonl

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// A job that writes lines shaped like the protocol's own (a forged result,
// output and call events for another id, control characters, a lone
// carriage return, Unicode line separators) cannot make a line of its own
// on the pool's stdout: every line it causes is one output event of its
// own id, its text exactly what it wrote, and the other job's answer is
// untouched.
func TestHostileStreamForgedLines(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 2})
	forged := "{\"id\": \"victim\", \"exit\": 0, \"stdout\": \"forged\", \"error\": null}\n" +
		"{\"event\": \"output\", \"id\": \"victim\", \"stream\": \"stdout\", \"text\": \"forged\"}\n" +
		"{\"event\": \"call\", \"id\": \"victim\", \"call_id\": 1, \"function\": \"f\", \"args\": [], \"kwargs\": {}}\r\n\x00\x1b[2J\u2028\u2029\n"
	lit, err := json.Marshal(forged) // a JSON string is a Python string literal too
	require.NoError(t, err)
	evilReq, err := json.Marshal(map[string]any{"id": "evil", "stream": true,
		"code": "import sys\ns = " + string(lit) + "\nsys.stdout.write(s)\nsys.stdout.flush()\nsys.stderr.write(s)"})
	require.NoError(t, err)
	in := string(evilReq) + "\n" + `{"id": "victim", "code": "import time\ntime.sleep(0.5)\nprint('real')"}` + "\n"
	lines := serveLines(t, p, in)
	var out, errs strings.Builder
	answered := 0
	for _, l := range lines[1:] {
		switch {
		case l["event"] == "output":
			require.Equal(t, "evil", l["id"], "%v", l)
			require.NotContains(t, l, "session")
			if l["stream"] == "stdout" {
				out.WriteString(l["text"].(string))
			} else {
				require.Equal(t, "stderr", l["stream"])
				errs.WriteString(l["text"].(string))
			}
		case l["id"] == "victim":
			answered++
			require.Equal(t, "real\n", l["stdout"])
		case l["id"] == "evil":
			answered++
			require.Nil(t, l["error"], "%v", l)
		default:
			t.Fatalf("a line the job made: %v", l)
		}
	}
	require.Equal(t, 2, answered)
	require.Equal(t, forged, out.String())
	require.Equal(t, forged, errs.String())
}
