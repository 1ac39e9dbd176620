package jsonl

// Third review: the session path of the pool protocol under a hostile
// client — pipelined steps and closes of a few names racing the pool's
// idle close — and hostile session code against the stream.

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// Steps and closes of three names, pipelined without waiting, while the
// pool closes sessions idle for a few milliseconds: every request gets
// exactly one answer, none names another request's id, a step never sees
// a variable of another name's session, and Serve ends cleanly.
func TestHostileReview3SessionChurnExactlyOneAnswer(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1, MaxSessions: 2, SessionIdle: 20 * time.Millisecond})
	ls := startLive(t, p)
	rng := rand.New(rand.NewSource(3))
	names := []string{"a", "b", "c"}
	const n = 60
	kinds := map[int]string{}
	owner := map[int]string{}
	for id := 1; id <= n; id++ {
		name := names[rng.Intn(len(names))]
		owner[id] = name
		if rng.Intn(4) == 0 {
			kinds[id] = "close"
			ls.send(fmt.Sprintf(`{"id": %d, "session": %q, "close": true}`, id, name))
			continue
		}
		kinds[id] = "step"
		// Each name's session keeps only its own name in me.
		code, err := json.Marshal(fmt.Sprintf("me = globals().setdefault('me', %q)\nprint(me)", name))
		require.NoError(t, err)
		ls.send(fmt.Sprintf(`{"id": %d, "session": %q, "code": %s}`, id, name, code))
	}
	seen := map[string]int{}
	outcomes := map[string]int{}
	for range n {
		l := ls.take("an answer", func(m map[string]any) bool { return m["event"] != "call" })
		id := fmt.Sprint(l["id"])
		seen[id]++
		require.Equal(t, 1, seen[id], "a second answer for id %s: %v", id, l)
		var i int
		_, err := fmt.Sscan(id, &i)
		require.NoError(t, err, "an answer with an id no request had: %v", l)
		require.Contains(t, kinds, i, "an answer with an id no request had: %v", l)
		outcome := kinds[i] + " ok"
		if l["error"] != nil {
			outcome = kinds[i] + " " + errType(l)
		}
		outcomes[outcome]++
		if kinds[i] == "step" && l["error"] == nil {
			require.Equal(t, owner[i]+"\n", l["stdout"], "step %d of session %s saw another session's state: %v", i, owner[i], l)
		}
	}
	t.Logf("outcomes: %v", outcomes)
	require.Empty(t, ls.finish())
}

// A session step that times out while its host call waits ends the
// session's process; the late reply to that call is refused with a
// RequestError and does not answer the call the next step of the same
// session makes, nor a call of another session, each of which gets only
// its own reply.
func TestHostileReview3LateReplyAcrossSessionSteps(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": 1, "session": "s", "functions": ["f"], "timeout": "1s", "code": "from pynox_host import f\nprint(f('first'))"}`)
	c1 := ls.call()
	require.Equal(t, "s", c1["session"])
	r := ls.await(1)
	require.Equal(t, "TimeoutError", errType(r), "%v", r)
	require.Equal(t, true, r["session_ended"])

	ls.send(`{"id": 2, "session": "s", "functions": ["f"], "timeout": "30s", "code": "from pynox_host import f\nprint(f('second'))"}`)
	c2 := ls.call()
	ls.send(`{"id": 3, "session": "t", "functions": ["f"], "timeout": "30s", "code": "from pynox_host import f\nprint(f('third'))"}`)
	c3 := ls.call()
	require.NotEqual(t, c1["call_id"], c2["call_id"])
	require.NotEqual(t, c2["call_id"], c3["call_id"])

	ls.send(fmt.Sprintf(`{"id": 4, "reply": {"call_id": %s, "result": "stale"}}`, c1["call_id"]))
	late := ls.await(4)
	require.Equal(t, "RequestError", errType(late))
	require.Equal(t, fmt.Sprint(c1["call_id"]), fmt.Sprint(late["call_id"]))

	ls.send(fmt.Sprintf(`{"reply": {"call_id": %s, "result": "for t"}}`, c3["call_id"]))
	ls.send(fmt.Sprintf(`{"reply": {"call_id": %s, "result": "for s"}}`, c2["call_id"]))
	r2, r3 := ls.await(2), ls.await(3)
	requireLineOK(t, r2)
	requireLineOK(t, r3)
	require.Equal(t, "for s\n", r2["stdout"])
	require.Equal(t, "for t\n", r3["stdout"])
	require.Empty(t, ls.finish())
}
