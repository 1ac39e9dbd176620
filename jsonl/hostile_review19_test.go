package jsonl

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// Review 19: reply lines of the quick form (reply_fast.go) whose result
// a hostile client chose, each answering one call of a job: the job gets
// one outcome, its call answered or failed, and does not hang (its
// timeout would say so), and the server serves on. A result with bytes
// that are not UTF-8 in a string (which encoding/json, and so both
// reply paths, let through) made the job's call raise UnicodeDecodeError
// and the job then hang until its timeout (also before the quick path):
// the job now sees a HostError (worker.checkedReply); so it does for a result nested 5,000 deep (a RecursionError in the runner, the same hang) and a number of 5,000 digits.
func TestHostileReview19QuickReplies(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	// Each result, and whether the job's call fails with a HostError
	// (JSON a client may not be able to decode: see worker.checkedReply).
	results := []struct {
		r       string
		refused bool
	}{
		{"\"\xff\xfe\"", true},
		{`"\ud800"`, false},
		{`"a\u0000b"`, false},
		{`1e400`, false},
		{`-0`, false},
		{`123456789012345678901234567890`, false},
		{strings.Repeat("[", 256) + strings.Repeat("]", 256), false},
		{strings.Repeat("[", 300) + strings.Repeat("]", 300), true},
		{`{"":1,"\u0000":2}`, false},
		{strings.Repeat("[", 5000) + strings.Repeat("]", 5000), true},
		{strings.Repeat("9", 5000), true},
		{`"\/\b\f\n\r\t"`, false},
	}
	code := "from pynox_host import f\ntry:\n    r = f()\n    print('got', type(r).__name__)\nexcept BaseException as e:\n    print('err', type(e).__name__)"
	for i, want := range results {
		r := want.r
		id := fmt.Sprintf("q%d", i)
		ls.send(fmt.Sprintf(`{"id": %q, "functions": ["f"], "timeout": "20s", "code": %q}`, id, code))
		c := ls.call()
		require.Equal(t, id, c["id"])
		line := fmt.Sprintf(`{"reply":{"call_id":%v,"result":%s}}`, c["call_id"], r)
		_, quick := decodeReply([]byte(line))
		ls.send(line)
		res := ls.take("the result of "+id, func(m map[string]any) bool { return m["id"] == id && m["event"] == nil })
		t.Logf("%.40s quick=%v: %v stdout %q error %v", r, quick, res["exit"], res["stdout"], res["error"])
		if e, ok := res["error"].(map[string]any); ok {
			require.NotEqual(t, "TimeoutError", e["type"], "a reply %.40s hung the job", r)
		}
		require.Nil(t, res["error"], "a reply %.40s: the job did not end as its code does", r)
		if want.refused {
			require.Equal(t, "err HostError\n", res["stdout"], "%.40s: a result that is not UTF-8, too deep or with too long a number", r)
		} else {
			require.True(t, strings.HasPrefix(res["stdout"].(string), "got "), "%.40s: %q", r, res["stdout"])
		}
	}
}
