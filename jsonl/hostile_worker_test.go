package jsonl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/pynox/pynox/internal/probes"
	"os/exec"
	"strings"
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// TestHostileCallArgumentsOnTheStream forges the same calls under `pynox
// pool`'s protocol: every line the pool writes must be one Python's json
// module reads (the reference client's reader dies on the first that is
// not, and every request then hangs).
func TestHostileCallArgumentsOnTheStream(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3 to read the stream with")
	}
	p := newTestPool(t, pynox.Config{Workers: 1})
	var in strings.Builder
	for i, tc := range probes.BadCallArgs {
		req, err := json.Marshal(map[string]any{"id": fmt.Sprintf("forger-%d", i), "functions": []string{"f"}, "timeout": "5s",
			"code": probes.ForgeCall + "call(" + tc.Frame + ")"})
		require.NoError(t, err)
		in.Write(req)
		in.WriteString("\n")
	}
	in.WriteString(`{"id": "after", "code": "print('after')"}` + "\n")
	var out bytes.Buffer
	require.NoError(t, Serve(context.Background(), p, strings.NewReader(in.String()), &out))

	check := exec.Command(py, "-c", "import json, sys\n"+
		"for line in sys.stdin.buffer:\n"+
		"    try:\n"+
		"        m = json.loads(line)\n"+
		"    except Exception as e:\n"+
		"        print('UNREADABLE %s: %r' % (type(e).__name__, line[:120]))\n"+
		"        continue\n"+
		"    print(m.get('event') or m.get('id'), m.get('error') and m['error']['type'], (m.get('stdout') or '').strip())\n")
	check.Stdin = bytes.NewReader(out.Bytes())
	got, err := check.CombinedOutput()
	require.NoError(t, err, string(got))
	lines := strings.Split(strings.TrimSpace(string(got)), "\n")
	require.Len(t, lines, len(probes.BadCallArgs)+2, "%s", got)
	require.Equal(t, "ready None ", lines[0])
	for _, l := range lines[1:] {
		require.NotContains(t, l, "UNREADABLE")
		require.NotContains(t, l, "call ", "a forged call reached the client: %s", l)
		if strings.HasPrefix(l, "forger-") {
			require.Contains(t, l, `"error":"the arguments to f cannot be passed on: `)
		}
	}
	require.Contains(t, lines, "after None after")
}

// probes.ForgeCall and probes.BadCallArgs are the root package tests' (hostile_worker_test.go).
