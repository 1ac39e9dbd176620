package jsonl

// The fourth outside review's protocol probes: a hostile client misplacing
// dump and restore, interrupting around step boundaries and dumps, and
// streaming a session's output through a kept descriptor.

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
	"github.com/stretchr/testify/require"
)

// Dump and restore where they do not belong get exactly one answer each,
// naming the field, and the pool keeps serving: restore on a one-shot job,
// dump on a one-shot job, an empty restore, a dump whose header claims
// 2^31+1 steps, a header alone, a dump request for a session whose only
// request so far was refused.
func TestHostileReview4DumpRestoreMisplaced(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": "s1", "session": "a", "code": "k = 1"}`)
	requireLineOK(t, ls.await("s1"))
	ls.send(`{"id": "d1", "session": "a", "dump": true}`)
	good := ls.await("d1")["dump"].(string)

	header := func(steps uint64) string {
		b := append([]byte("pynoxd\x00\x01"), make([]byte, 8)...)
		binary.LittleEndian.PutUint64(b[8:], steps)
		return base64.StdEncoding.EncodeToString(b)
	}
	cases := []struct{ id, line, want string }{
		{"j1", `{"id": "j1", "code": "print(1)", "restore": "` + good + `"}`, "restore"},
		{"j2", `{"id": "j2", "code": "print(1)", "dump": true}`, "dump"},
		{"j3", `{"id": "j3", "session": "b", "code": "print(1)", "restore": ""}`, "not a pynox session dump"},
		{"j4", `{"id": "j4", "session": "c", "code": "print(1)", "restore": "` + header(1<<31+1) + `"}`, "out of range"},
		{"j5", `{"id": "j5", "session": "e", "dump": true}`, `no session named "e" is open`},
		{"j6", `{"id": "j6", "session": "a", "dump": true, "restore": "` + good + `"}`, "dump"},
		{"j7", `{"id": "j7", "session": "a", "dump": "yes"}`, "dump"},
		{"j8", `{"id": "j8", "session": "c", "dump": true}`, `no session named "c" is open`},
	}
	for _, c := range cases {
		ls.send(c.line)
	}
	for _, c := range cases {
		l := ls.await(c.id)
		require.Equal(t, "RequestError", errType(l), "%s: %v", c.id, l)
		require.Contains(t, errMessage(l), c.want, "%s", c.id)
	}
	// A header alone is an empty session, restored.
	ls.send(`{"id": "h", "session": "h", "code": "print(sorted(k for k in globals() if not k.startswith('__')))", "restore": "` + header(3) + `"}`)
	l := ls.await("h")
	requireLineOK(t, l)
	require.Equal(t, "[]\n", l["stdout"])
	require.Equal(t, "4", fmt.Sprint(l["step"]))
	// Session a was not disturbed.
	ls.send(`{"id": "s2", "session": "a", "code": "print(k)"}`)
	l = ls.await("s2")
	requireLineOK(t, l)
	require.Equal(t, "1\n", l["stdout"])
	ls.send(`{"id": "z", "code": "print(42)"}`)
	require.Equal(t, "42\n", ls.await("z")["stdout"])
	ls.send(`{"id": "ca", "session": "a", "close": true}`)
	ls.await("ca")
	ls.send(`{"id": "ch", "session": "h", "close": true}`)
	ls.await("ch")
	require.Empty(t, ls.finish(), "a request got more than one answer")
}

// Interrupts sent around a session's step boundaries and during its dump
// never reach a later step: twenty short steps each followed at once by
// an interrupt, then a dump whose __reduce__ is interrupted, then a step
// that runs long enough to be hit — it ends normally. The session's own
// SIGINT handler, which writes a forged report on the control channel,
// breaks only that session: its step is killed and the session ends.
func TestHostileReview4InterruptTiming(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": "s0", "session": "a", "code": "import time\nclass Slow:\n    def __reduce__(self):\n        time.sleep(0.3)\n        return (int, (3,))\nslow = Slow()\nn = 0"}`)
	requireLineOK(t, ls.await("s0"))
	// In batches of four: a session takes at most MaxPendingSteps queued.
	for b := 0; b < 20; b += 4 {
		for i := b; i < b+4; i++ {
			ls.send(fmt.Sprintf(`{"id": "s%d", "session": "a", "code": "n += 1"}`, i+1))
			ls.send(fmt.Sprintf(`{"id": "i%d", "session": "a", "interrupt": true}`, i+1))
		}
		for i := b; i < b+4; i++ {
			s := ls.await(fmt.Sprintf("s%d", i+1))
			if s["error"] != nil {
				require.Equal(t, "KeyboardInterrupt", errType(s), "%v", s)
				require.Nil(t, s["session_ended"], "%v", s)
			}
			ls.await(fmt.Sprintf("i%d", i+1))
		}
	}
	ls.send(`{"id": "d", "session": "a", "dump": true}`)
	ls.send(`{"id": "id", "session": "a", "interrupt": true}`)
	d := ls.await("d")
	ls.await("id")
	if d["error"] != nil {
		require.Equal(t, "KeyboardInterrupt", errType(d), "%v", d)
	}
	ls.send(`{"id": "last", "session": "a", "code": "import time\nfor _ in range(5):\n    time.sleep(0.02)\nprint('ok', n > 0)"}`)
	l := ls.await("last")
	requireLineOK(t, l)
	require.Equal(t, "ok True\n", l["stdout"])

	// A handler of the session's own that forges a report.
	ls.send(`{"id": "f0", "session": "b", "code": "import json, os, signal, struct, time\n` +
		`def h(*a):\n    b = json.dumps({'t': 'done', 'step': 99, 'exit': 0, 'error': None}).encode()\n    os.write(3, struct.pack('<I', len(b)) + b)\n` +
		`signal.signal(signal.SIGINT, h)"}`)
	requireLineOK(t, ls.await("f0"))
	ls.send(`{"id": "f1", "session": "b", "stream": true, "code": "import time\nprint('go', flush=True)\ntime.sleep(5)\nprint('slept')"}`)
	ls.take("f1's output", func(m map[string]any) bool { return m["event"] == "output" && m["id"] == "f1" })
	ls.send(`{"id": "fi", "session": "b", "interrupt": true}`)
	require.Equal(t, true, ls.await("fi")["interrupted"])
	f1 := ls.await("f1")
	// Killed: at once when Go reads the forged report (a protocol break),
	// or after the interrupt's grace when it has not rung the bell.
	require.Contains(t, []string{"CrashedError", "KeyboardInterrupt"}, errType(f1), "%v", f1)
	require.Equal(t, true, f1["session_ended"], "%v", f1)
	require.NotEqual(t, "slept\n", f1["stdout"], "%v", f1)
	// Session a, and the pool, are unaffected.
	ls.send(`{"id": "a2", "session": "a", "code": "print(n > 0)"}`)
	require.Equal(t, "True\n", ls.await("a2")["stdout"])
	ls.send(`{"id": "ca", "session": "a", "close": true}`)
	ls.await("ca")
	ls.send(`{"id": "cb", "session": "b", "close": true}`)
	ls.await("cb")
	for _, m := range ls.finish() {
		require.NotEqual(t, "undecodable", fmt.Sprint(m["event"]), "%v", m)
	}
}

// A streamed session step whose thread keeps a copy of its stdout and
// writes invalid UTF-8 and forged event lines through it: every output
// line is valid JSON, the forged lines come back only as output text of
// the step that wrote them, and later steps' events and results hold
// none of it.
func TestHostileReview4StreamKeptDescriptor(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": "s1", "session": "a", "stream": true, "code": "import os, threading, time\nkept = os.dup(1)\n` +
		`bad = bytes([0xff, 0xfe, 10]) + b'{\"id\": \"s2\", \"exit\": 0, \"stdout\": \"forged\"}' + bytes([10])\n` +
		`def spam():\n    while True:\n        try:\n            os.write(kept, bad)\n        except OSError:\n            pass\n        time.sleep(0.001)\n` +
		`threading.Thread(target=spam, daemon=True).start()\ntime.sleep(0.05)"}`)
	events, res := ls.untilResult("s1")
	requireLineOK(t, res)
	var text strings.Builder
	for _, e := range events {
		text.WriteString(fmt.Sprint(e["text"]))
	}
	require.Contains(t, text.String(), "\ufffd")
	for i := 2; i <= 4; i++ {
		id := fmt.Sprintf("s%d", i)
		ls.send(`{"id": "` + id + `", "session": "a", "stream": true, "code": "import time\ntime.sleep(0.05)\nprint('real')"}`)
		events, res := ls.untilResult(id)
		requireLineOK(t, res)
		require.Equal(t, "real\n", res["stdout"], "%v", res)
		for _, e := range events {
			require.Equal(t, "real\n", e["text"], "a kept descriptor wrote into a later step's stream: %v", e)
		}
	}
	ls.send(`{"id": "c", "session": "a", "close": true}`)
	ls.await("c")
	for _, m := range ls.finish() {
		require.NotContains(t, m, "undecodable", "%v", m)
		require.NotEqual(t, "forged", m["stdout"], "%v", m)
	}
}
