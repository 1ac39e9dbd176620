package jsonl

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// TestClientCallLineAndReplyBytes checks the client's host-call path,
// which decodes a call event once and writes a result's reply line
// directly: the HostFunc gets the call as the event says (job id,
// session, call id, function, arguments), a call whose line is another
// event after all is routed as that, and every reply line is the bytes
// the general encoder writes for it.
func TestClientCallLineAndReplyBytes(t *testing.T) {
	f, c := newFakeServer(t)
	ctx := context.Background()
	calls := make(chan *pynox.Call, 8)
	results := []any{
		"ok",
		"<a & b>",
		map[string]any{"k": []any{1, 2.5, nil, true}, "u": "\u2028é\x01"},
		nil,
		json.RawMessage(`{ "spaced" : [ 1 , 2 ] }`),
	}
	i := 0
	done := make(chan error, 1)
	go func() {
		_, err := c.Run(ctx, pynox.Job{ID: "one", Code: "1", Functions: []string{"f"},
			Host: func(_ context.Context, call *pynox.Call) (any, error) {
				calls <- call
				v := results[i]
				i++
				return v, nil
			}})
		done <- err
	}()
	id := f.request(t)["id"].(string)
	for k, want := range results {
		f.write(t, `{"event":"call","id":"`+id+`","session":"s1","call_id":`+string(rune('1'+k))+`,"function":"f","args":[1,"x"],"kwargs":{"a":{"b":2}}}`)
		call := <-calls
		require.Equal(t, any(id), call.JobID)
		require.Equal(t, "s1", call.Session)
		require.Equal(t, int64(k+1), call.ID)
		require.Equal(t, "f", call.Function)
		require.JSONEq(t, `[1,"x"]`, string(call.Args))
		require.JSONEq(t, `{"a":{"b":2}}`, string(call.Kwargs))
		require.True(t, f.in.Scan())
		got := f.in.Text() + "\n"
		b, err := json.Marshal(want)
		require.NoError(t, err)
		type reply struct {
			CallID int64           `json:"call_id"`
			Result json.RawMessage `json:"result,omitempty"`
			Error  *string         `json:"error,omitempty"`
		}
		old, err := marshalLine(struct {
			Reply reply `json:"reply"`
		}{reply{CallID: int64(k + 1), Result: b}})
		require.NoError(t, err)
		require.Equal(t, string(old), got)
	}
	// A line that begins as a call but is an output event after all (a
	// repeated key: the last wins) is not taken for a call.
	f.write(t, `{"event":"call","id":"`+id+`","call_id":50,"event":"output","stream":"stdout","text":"x"}`)
	// A call without a call_id is answered as unreadable: nothing to reply
	// to, so nothing is written; the next call still works.
	f.write(t, `{"event":"call","id":"`+id+`","function":"f","args":[],"kwargs":{}}`)
	results = append(results, "last")
	f.write(t, `{"event":"call","id":"`+id+`","call_id":60,"function":"f","args":[],"kwargs":{}}`)
	call := <-calls
	require.Equal(t, int64(60), call.ID)
	require.True(t, f.in.Scan())
	require.Equal(t, `{"reply":{"call_id":60,"result":"last"}}`, f.in.Text())
	require.Empty(t, calls)
	f.write(t, `{"id":"`+id+`","exit":0,"stdout":"","stderr":"","error":null}`)
	require.NoError(t, <-done)
	f.out.Close()
	require.NoError(t, c.Close())
}
