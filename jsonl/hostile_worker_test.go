package jsonl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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
	for i, tc := range badCallArgs {
		req, err := json.Marshal(map[string]any{"id": fmt.Sprintf("forger-%d", i), "functions": []string{"f"}, "timeout": "5s",
			"code": forgeCall + "call(" + tc.frame + ")"})
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
	require.Len(t, lines, len(badCallArgs)+2, "%s", got)
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

// forgeCall and badCallArgs are the root package tests' (hostile_worker_test.go).

// forgeCall is Python defining call(payload): it writes payload (bytes, a
// whole "call" frame's JSON) on the control channel, rings the bell, and
// prints the host's reply frame.
const forgeCall = "import os, struct\n" +
	"def read(n):\n" +
	"    b = b''\n" +
	"    while len(b) < n:\n" +
	"        c = os.read(3, n - len(b))\n" +
	"        if not c:\n" +
	"            raise SystemExit('channel closed')\n" +
	"        b += c\n" +
	"    return b\n" +
	"def call(payload):\n" +
	"    os.write(3, struct.pack('<I', len(payload)) + payload)\n" +
	"    os.write(4, b'!')\n" +
	"    n = struct.unpack('<I', read(4))[0]\n" +
	"    print(read(n).decode())\n"

// badCallArgs are forged call frames (Python bytes expressions) whose
// arguments Go's JSON decoder accepts but Python's json module does not.
var badCallArgs = []struct{ name, frame string }{
	{"invalid UTF-8 in args", `b'{"t":"call","step":1,"function":"f","args":["\xff\xfe"],"kwargs":{}}'`},
	{"invalid UTF-8 in kwargs", `b'{"t":"call","step":1,"function":"f","args":[],"kwargs":{"k":"a\xc3"}}'`},
	{"5,000-deep args", `b'{"t":"call","step":1,"function":"f","args":' + b'[' * 5000 + b']' * 5000 + b',"kwargs":{}}'`},
	{"5,000-deep kwargs", `b'{"t":"call","step":1,"function":"f","args":[],"kwargs":{"k":' + b'{"k":' * 4999 + b'1' + b'}' * 4999 + b'}}'`},
	{"5,000-digit integer", `b'{"t":"call","step":1,"function":"f","args":[' + b'7' * 5000 + b'],"kwargs":{}}'`},
	{"5,000-digit kwarg", `b'{"t":"call","step":1,"function":"f","args":[],"kwargs":{"n":-' + b'7' * 5000 + b'}}'`},
}
