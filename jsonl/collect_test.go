package jsonl

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// TestCollectLines: "collect" and $PYNOX_OUTPUTS over the pool protocol,
// for a one-shot job and a session's steps (each step's own), with the
// contents in base64.
func TestCollectLines(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	lines := serveLines(t, p, `{"id": "a", "collect": ["$TMPDIR/*.csv"], "code": "import os\nopen(os.environ['TMPDIR'] + '/t.csv', 'w').write('a,b')"}
{"id": "s1", "session": "s", "code": "import os\nopen(os.environ['PYNOX_OUTPUTS'] + '/o.txt', 'w').write('hi')"}
{"id": "s2", "session": "s", "collect": ["$TMPDIR/*.txt"], "code": "open(os.environ['TMPDIR'] + '/k.txt', 'w').write('k')"}
{"id": "bad", "collect": ["/etc/*"], "code": "1"}
`)
	byID := map[string]map[string]any{}
	for _, l := range lines {
		if id, ok := l["id"].(string); ok {
			byID[id] = l
		}
	}
	one := func(id string) map[string]any {
		files, ok := byID[id]["files"].([]any)
		require.True(t, ok, "%s: %v", id, byID[id])
		require.Len(t, files, 1, id)
		return files[0].(map[string]any)
	}
	require.Equal(t, "YSxi", one("a")["data"]) // "a,b"
	require.Equal(t, "aGk=", one("s1")["data"])
	require.Equal(t, "aw==", one("s2")["data"]) // only the step's own: o.txt was removed once attached
	require.Equal(t, "RequestError", errType(byID["bad"]))
	require.Contains(t, errMessage(byID["bad"]), "collect[0]")
}
