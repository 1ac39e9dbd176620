package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// A protocol transport: how a test reaches the pool protocol. Both carry
// the same lines; the shared table below runs over each of them.
type protocolTransport struct {
	name string
	// open starts a server and returns a connection to it and the ready
	// event it got.
	open func(t *testing.T) (lineConn, map[string]any)
}

// protocolTransports are the pipe (`pynox pool` on stdin and stdout) and
// the WebSocket (`pynox serve` on 127.0.0.1:0, /v1/pool), both real
// binaries with two workers.
var protocolTransports = []protocolTransport{
	{"pipe", func(t *testing.T) (lineConn, map[string]any) {
		p := startPoolIn(t, t.TempDir(), "--python="+testenv.Python(), "--workers=2")
		return p, p.ready
	}},
	{"websocket", func(t *testing.T) (lineConn, map[string]any) {
		s := startServe(t, t.TempDir(), "--workers=2")
		w, _, err := dialPool(t, s, "")
		require.NoError(t, err)
		return w, w.ready
	}},
}

// awaitID reads lines until the one whose id is id (as fmt prints it),
// returning it and the lines before it.
func awaitID(t *testing.T, c lineConn, id string) (map[string]any, []map[string]any) {
	t.Helper()
	var before []map[string]any
	for {
		l := c.next(t)
		if fmt.Sprint(l["id"]) == id && l["event"] == nil {
			return l, before
		}
		before = append(before, l)
	}
}

// lineErr returns the type and message of a line's error, or "".
func lineErr(l map[string]any) (string, string) {
	e, _ := l["error"].(map[string]any)
	if e == nil {
		return "", ""
	}
	typ, _ := e["type"].(string)
	msg, _ := e["message"].(string)
	return typ, msg
}

// exactlyOne sends a bad line and requires exactly one answer for it:
// the next line is its RequestError (with id want, "<nil>" for none)
// naming field, and the line after that answers a marker request sent
// behind it.
func exactlyOne(t *testing.T, c lineConn, line, want, field string) {
	t.Helper()
	c.send(t, line)
	c.send(t, `{"id": "marker", "stats": true}`)
	l := c.next(t)
	typ, msg := lineErr(l)
	require.Equal(t, "RequestError", typ, "%s: %v", line, l)
	require.Equal(t, want, fmt.Sprint(l["id"]), line)
	require.Contains(t, msg, field, line)
	require.Equal(t, "-1", fmt.Sprint(l["exit"]), line)
	m := c.next(t)
	require.Equal(t, "marker", m["id"], "%s is answered once: %v", line, m)
	require.Equal(t, "stats", m["event"])
}

// protocolCases is the protocol table both transports pass: each case
// gets the same connection, in order, after the ready event.
var protocolCases = []struct {
	name string
	run  func(t *testing.T, c lineConn)
}{
	{"job result", func(t *testing.T, c lineConn) {
		c.send(t, `{"id": "task-1", "code": "import json\nprint(json.dumps({'ok': True}))", "name": "step.py", "timeout": "5s", "memory": "512m"}`)
		r, _ := awaitID(t, c, "task-1")
		require.Equal(t, "{\"ok\": true}\n", r["stdout"])
		require.EqualValues(t, 0, r["exit"])
		require.Nil(t, r["error"])
		for _, k := range []string{"id", "exit", "stdout", "stderr", "error", "stdout_truncated", "stderr_truncated",
			"duration_ms", "duration_us", "queue_us", "runtime", "policy"} {
			require.Contains(t, r, k)
		}
		pol := r["policy"].(map[string]any)
		require.EqualValues(t, 5000, pol["timeout_ms"])
		require.EqualValues(t, 536870912, pol["memory_bytes"])
		c.send(t, `{"id": 2, "code": "1/0"}`)
		r, _ = awaitID(t, c, "2")
		typ, _ := lineErr(r)
		require.Equal(t, "ZeroDivisionError", typ)
	}},
	{"bad input names the field, one answer each", func(t *testing.T, c lineConn) {
		exactlyOne(t, c, `{"id": "unknown", "code": "1", "bogus": true}`, "unknown", `unknown field "bogus"`)
		exactlyOne(t, c, `{"id": "types", "code": 5}`, "types", "code: expected a string")
		exactlyOne(t, c, `{"id": "dur", "code": "1", "timeout": "5 parsecs"}`, "dur", "invalid duration")
		exactlyOne(t, c, `{"id": "size", "code": "1", "memory": "lots"}`, "size", "invalid size")
		exactlyOne(t, c, `{"id": "trailing", "code": "1"} {"x": 1}`, "trailing", "trailing data")
		exactlyOne(t, c, `{"id": "bad-stats", "stats": true, "code": "1"}`, "bad-stats", "code")
		exactlyOne(t, c, `not json at all`, "<nil>", "")
		exactlyOne(t, c, `[1, 2]`, "<nil>", "")
	}},
	{"session across requests", func(t *testing.T, c lineConn) {
		c.send(t, `{"id": "s1", "session": "nb", "code": "x = 41"}`)
		r, _ := awaitID(t, c, "s1")
		require.Nil(t, r["error"], "%v", r)
		c.send(t, `{"id": "s2", "session": "nb", "code": "print(x + 1)"}`)
		r, _ = awaitID(t, c, "s2")
		require.Equal(t, "42\n", r["stdout"])
		c.send(t, `{"id": "s3", "session": "nb", "close": true}`)
		r = c.next(t)
		require.Equal(t, "s3", r["id"])
		require.Equal(t, true, r["closed"], "%v", r)
		exactlyOne(t, c, `{"id": "s4", "session": "nb", "close": true}`, "s4", "nb")
	}},
	{"host call and reply", func(t *testing.T, c lineConn) {
		c.send(t, `{"id": "h1", "functions": ["search"], "code": "from pynox_host import search\nprint(search('pynox', limit=2))"}`)
		call := c.next(t)
		require.Equal(t, "call", call["event"], "%v", call)
		require.Equal(t, "h1", call["id"])
		require.Equal(t, "search", call["function"])
		require.Equal(t, []any{"pynox"}, call["args"])
		require.EqualValues(t, 2, call["kwargs"].(map[string]any)["limit"])
		c.send(t, fmt.Sprintf(`{"reply": {"call_id": %v, "result": ["first hit", "second hit"]}}`, call["call_id"]))
		r, _ := awaitID(t, c, "h1")
		require.Equal(t, "['first hit', 'second hit']\n", r["stdout"], "%v", r)
		// An error reply is the job's exception.
		c.send(t, `{"id": "h2", "functions": ["search"], "code": "from pynox_host import search\ntry:\n  search('x')\nexcept Exception as e:\n  print(type(e).__name__, e)"}`)
		call = c.next(t)
		require.Equal(t, "call", call["event"])
		c.send(t, fmt.Sprintf(`{"reply": {"call_id": %v, "error": "no index"}}`, call["call_id"]))
		r, _ = awaitID(t, c, "h2")
		require.Contains(t, r["stdout"], "no index")
		// A reply to no call is refused, once.
		exactlyOne(t, c, `{"reply": {"call_id": 999999, "result": 1}}`, "<nil>", "reply: no call 999999")
	}},
	{"streamed output", func(t *testing.T, c lineConn) {
		c.send(t, `{"id": "st", "stream": true, "code": "import sys\nprint('a', flush=True)\nprint('b', file=sys.stderr, flush=True)"}`)
		r, before := awaitID(t, c, "st")
		var text = map[string]string{}
		for _, l := range before {
			require.Equal(t, "output", l["event"], "%v", l)
			require.Equal(t, "st", l["id"])
			text[l["stream"].(string)] += l["text"].(string)
		}
		require.Equal(t, map[string]string{"stdout": "a\n", "stderr": "b\n"}, text)
		require.Nil(t, r["error"], "%v", r)
	}},
	{"cancel", func(t *testing.T, c lineConn) {
		c.send(t, `{"id": "slow", "stream": true, "code": "import time\nprint('started', flush=True)\ntime.sleep(600)"}`)
		ev := c.next(t)
		require.Equal(t, "output", ev["event"], "%v", ev)
		c.send(t, `{"id": "c1", "cancel": "slow"}`)
		ans := c.next(t)
		require.Equal(t, map[string]any{"id": "c1", "cancel": "slow", "cancelled": true}, ans)
		r, _ := awaitID(t, c, "slow")
		typ, _ := lineErr(r)
		require.Equal(t, "CancelledError", typ)
		exactlyOne(t, c, `{"id": "c2", "cancel": true}`, "c2", "cancel")
	}},
	{"interrupt", func(t *testing.T, c lineConn) {
		c.send(t, `{"id": "i1", "session": "busy", "stream": true, "code": "print('started', flush=True)\nwhile True: pass"}`)
		ev := c.next(t)
		require.Equal(t, "output", ev["event"], "%v", ev)
		c.send(t, `{"id": "i2", "session": "busy", "interrupt": true}`)
		ans := c.next(t)
		require.Equal(t, map[string]any{"id": "i2", "session": "busy", "interrupted": true}, ans)
		r, _ := awaitID(t, c, "i1")
		typ, _ := lineErr(r)
		require.Equal(t, "KeyboardInterrupt", typ)
		exactlyOne(t, c, `{"id": "i3", "session": "nobody", "interrupt": true}`, "i3", "nobody")
	}},
	{"stats", func(t *testing.T, c lineConn) {
		c.send(t, `{"id": "st1", "stats": true}`)
		st := c.next(t)
		require.Equal(t, "stats", st["event"])
		require.Equal(t, "st1", st["id"])
		for _, k := range []string{"uptime_ms", "workers", "sessions_active", "jobs", "ok", "failed", "timeouts",
			"signals", "request_errors", "worker_errors", "cancelled", "duration_ms_total", "queue_us_total", "errors"} {
			require.Contains(t, st, k)
		}
		require.EqualValues(t, 2, st["workers"])
		require.EqualValues(t, 1, st["sessions_active"], "the interrupted session lives on")
	}},
}

// TestProtocolOverBothTransports runs the shared protocol table over the
// pipe of `pynox pool` and the WebSocket of `pynox serve`: the ready
// event's shape, job results, refusals naming the field with exactly one
// answer, sessions, host calls and replies, streamed output, cancel,
// interrupt and stats.
func TestProtocolOverBothTransports(t *testing.T) {
	for _, tr := range protocolTransports {
		t.Run(tr.name, func(t *testing.T) {
			c, ready := tr.open(t)
			require.Equal(t, "ready", ready["event"])
			require.EqualValues(t, 2, ready["workers"])
			require.Equal(t, "pynox", ready["runtime"])
			for _, k := range []string{"preloaded_modules", "package_dirs", "profiles", "cgroups", "pid_namespace"} {
				require.Contains(t, ready, k)
			}
			for _, tc := range protocolCases {
				if !t.Run(tc.name, func(t *testing.T) { tc.run(t, c) }) {
					return // the connection's state is unknown after a failure
				}
			}
		})
	}
}
