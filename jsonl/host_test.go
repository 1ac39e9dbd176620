package jsonl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

func TestHostFunctionsOverJSONL(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 2})
	ls := startLive(t, p)
	ls.send(`{"id": "t1", "functions": ["search", "fail"], "code": "from pynox_host import search, fail, HostError\nprint(search('pynox', limit=2))\ntry:\n    fail()\nexcept HostError as e:\n    print('caught', e)"}`)
	c := ls.call()
	require.Equal(t, "t1", c["id"])
	require.Equal(t, "search", c["function"])
	require.Equal(t, []any{"pynox"}, c["args"])
	require.Equal(t, map[string]any{"limit": json.Number("2")}, c["kwargs"])
	ls.send(fmt.Sprintf(`{"reply": {"call_id": %s, "result": ["first hit", "second hit"]}}`, c["call_id"]))
	c2 := ls.call()
	require.Equal(t, "fail", c2["function"])
	require.NotEqual(t, c["call_id"], c2["call_id"], "call ids are unique")
	ls.send(fmt.Sprintf(`{"reply": {"call_id": %s, "error": "backend unavailable"}}`, c2["call_id"]))
	r := ls.await("t1")
	requireLineOK(t, r)
	require.Equal(t, "['first hit', 'second hit']\ncaught backend unavailable\n", r["stdout"])
	require.Equal(t, json.Number("2"), r["calls"])

	// A reply to an answered call, to an unknown one, or malformed, is a
	// RequestError; none reaches a job.
	for i, line := range []string{
		fmt.Sprintf(`{"id": "late", "reply": {"call_id": %s, "result": 1}}`, c["call_id"]),
		`{"id": "unknown", "reply": {"call_id": 123456, "result": 1}}`,
		`{"id": "both", "reply": {"call_id": 1, "result": 1, "error": "x"}}`,
		`{"id": "neither", "reply": {"call_id": 1}}`,
		`{"id": "noid", "reply": {"result": 1}}`,
		`{"id": "extra", "reply": {"call_id": 1, "result": 1}, "code": "1"}`,
		`{"id": "field", "reply": {"call_id": 1, "result": 1, "bogus": 2}}`,
	} {
		ls.send(line)
		r := ls.next()
		require.Equal(t, "RequestError", errType(r), "line %d: %v", i, r)
	}

	// Only declared names exist; a call forged on the control channel to
	// any other name gets an error and the client never sees it.
	ls.send(`{"id": "t2", "functions": ["search"], "code": "` +
		`try:\n    from pynox_host import other\nexcept ImportError as e:\n    print('import', type(e).__name__)\n` +
		`import json, os, struct\n` +
		`def frame(o):\n    b = json.dumps(o).encode()\n    return struct.pack('<I', len(b)) + b\n` +
		`os.write(3, frame({'t': 'call', 'step': 1, 'function': 'secret', 'args': [], 'kwargs': {}}))\n` +
		`os.write(4, b'!')\n` +
		`n = struct.unpack('<I', os.read(3, 4))[0]\nreply = json.loads(os.read(3, n))\nprint(reply['t'], 'error' in reply, reply.get('error'))"}`)
	r = ls.await("t2")
	requireLineOK(t, r)
	require.Equal(t, "import ImportError\nreply True no host function named \"secret\"\n", r["stdout"])

	// A job without functions has no pynox_host.
	ls.send(`{"id": "t3", "code": "import pynox_host"}`)
	require.Equal(t, "ModuleNotFoundError", errType(ls.await("t3")))

	// Waiting for the host counts against the timeout; the unanswered call
	// is dropped and a late reply is refused.
	ls.send(`{"id": "t4", "functions": ["slow"], "timeout": "500ms", "code": "from pynox_host import slow\nslow()"}`)
	c = ls.call()
	r = ls.await("t4")
	require.Equal(t, "TimeoutError", errType(r))
	ls.send(fmt.Sprintf(`{"id": "after", "reply": {"call_id": %s, "result": 1}}`, c["call_id"]))
	require.Equal(t, "RequestError", errType(ls.await("after")))

	// Bad declarations are refused before anything runs.
	for _, fns := range []string{`["_private"]`, `["HostError"]`, `["a-b"]`, `["x", "x"]`, `["1x"]`, `[""]`} {
		ls.send(`{"id": "bad", "functions": ` + fns + `, "code": "1"}`)
		require.Equal(t, "RequestError", errType(ls.await("bad")), fns)
	}

	// In a session the first request declares the functions; every step
	// can use them.
	ls.send(`{"id": "s1", "session": "tools", "functions": ["kv"], "code": "from pynox_host import kv"}`)
	requireLineOK(t, ls.await("s1"))
	for i := 2; i <= 3; i++ {
		ls.send(fmt.Sprintf(`{"id": "s%d", "session": "tools", "code": "print(kv(%d))"}`, i, i))
		c := ls.call()
		require.Equal(t, fmt.Sprintf("s%d", i), c["id"])
		require.Equal(t, "tools", c["session"])
		ls.send(fmt.Sprintf(`{"reply": {"call_id": %s, "result": {"n": %d}}}`, c["call_id"], i*10))
		r := ls.await(fmt.Sprintf("s%d", i))
		requireLineOK(t, r)
		require.Equal(t, fmt.Sprintf("{'n': %d}\n", i*10), r["stdout"])
	}
	ls.send(`{"id": "s4", "session": "tools", "functions": ["other"], "code": "1"}`)
	require.Equal(t, "RequestError", errType(ls.await("s4")))
	require.Empty(t, ls.finish())
}

// TestHostCallsFailAtEndOfInput: once the client closes its input, a call
// waiting for a reply fails in its job at once.
func TestHostCallsFailAtEndOfInput(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	var out bytes.Buffer
	start := time.Now()
	in := `{"id": 1, "functions": ["f"], "timeout": "20s", "code": "from pynox_host import f, HostError\ntry:\n    f()\nexcept HostError as e:\n    print(e)"}` + "\n" +
		`{"id": 2, "code": "print(2)"}` + "\n"
	require.NoError(t, Serve(context.Background(), p, strings.NewReader(in), &out))
	require.Less(t, time.Since(start), 10*time.Second)
	require.Contains(t, out.String(), `"stdout":"the client closed its input, so no reply can come\n"`)
	require.Contains(t, out.String(), `"stdout":"2\n"`)
}

// TestHostRepliesBehindQueuedJobs pipelines more jobs than the pool holds,
// each calling the host, then answers the calls as they come: the replies
// must reach their calls although job lines sit before them.
func TestHostRepliesBehindQueuedJobs(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	const n = 8
	for i := 0; i < n; i++ {
		ls.send(fmt.Sprintf(`{"id": %d, "functions": ["f"], "timeout": "20s", "code": "from pynox_host import f\nprint(f(%d))"}`, i, i))
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		c := ls.call()
		ls.send(fmt.Sprintf(`{"reply": {"call_id": %s, "result": %s}}`, c["call_id"], c["args"].([]any)[0]))
	}
	for i := 0; i < n; i++ {
		r := ls.await(i)
		requireLineOK(t, r)
		require.Equal(t, fmt.Sprintf("%d\n", i), r["stdout"])
	}
	require.Less(t, time.Since(start), 15*time.Second, "answered well before the 20s timeouts")
	require.Empty(t, ls.finish())
}

// TestHostRepliesBehindManyQueuedJobs pipelines more host-calling jobs than
// the pool holds: those beyond what it holds are refused at once, and every
// reply still reaches its call, so no job waits for its timeout.
func TestHostRepliesBehindManyQueuedJobs(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	const n = 3 + 16 + 6 // slots, held, and some beyond
	for i := 0; i < n; i++ {
		ls.send(fmt.Sprintf(`{"id": %d, "functions": ["f"], "timeout": "30s", "code": "from pynox_host import f\nprint(f(%d))"}`, i, i))
	}
	ok, refused := 0, 0
	answered := map[int]bool{}
	for len(answered) < n {
		m := ls.take("a call or a result", func(map[string]any) bool { return true })
		if m["event"] == "call" {
			ls.send(fmt.Sprintf(`{"reply": {"call_id": %s, "result": %s}}`, m["call_id"], m["args"].([]any)[0]))
			continue
		}
		id, err := m["id"].(json.Number).Int64()
		require.NoError(t, err)
		require.False(t, answered[int(id)], "id %d answered twice", id)
		answered[int(id)] = true
		switch errType(m) {
		case "":
			require.Equal(t, fmt.Sprintf("%d\n", id), m["stdout"])
			ok++
		case "RequestError":
			require.Contains(t, errMessage(m), "waiting for a worker")
			refused++
		default:
			t.Fatalf("job %d: %v", id, m)
		}
	}
	require.Equal(t, n, ok+refused)
	require.GreaterOrEqual(t, ok, 19, "every job the pool holds runs")
	require.Empty(t, ls.finish())
}
