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
