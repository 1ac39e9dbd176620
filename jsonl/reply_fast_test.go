package jsonl

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// replyLines are reply lines of the quick form and near misses.
var replyLines = []string{
	`{"reply":{"call_id":1,"result":2}}`,
	`{"reply":{"call_id":0,"result":null}}`,
	`{"reply":{"call_id":9223372036854775807,"result":"x"}}`,
	`{"reply":{"call_id":9223372036854775808,"result":"x"}}`,
	`{"reply":{"call_id":01,"result":1}}`,
	`{"reply":{"call_id":-1,"result":1}}`,
	`{"reply":{"call_id":1.0,"result":1}}`,
	`{"reply":{"call_id":1,"result":{"a":1,"b":[1,{"c":null}]}}}`,
	`{"reply":{"call_id":1,"result":{"a":1,"a":2}}}`,
	`{"reply":{"call_id":1,"result":[{"a":1},{"b":{"x":1,"x":1}}]}}`,
	`{"reply":{"call_id":1,"result":{"a":",\"result\":"}}}`,
	`{"reply":{"call_id":1,"result": 1}}`,
	`{"reply":{"call_id":1,"result":1 }}`,
	`{"reply":{"call_id":1,"result":1}} `,
	`{"reply":{"call_id":1,"result":1}}}`,
	`{"reply":{"call_id":1,"result":1}}x`,
	`{"reply":{"call_id":1,"result":}}`,
	`{"reply":{"call_id":1,"result":1,2}}`,
	`{"reply":{"call_id":1,"result":{"a":1}},"id":3}}`,
	`{"reply":{"call_id":1,"result":"\u00e9\ud800"}}`,
	"{\"reply\":{\"call_id\":1,\"result\":\"\xff\"}}",
	`{"reply":{"call_id":1,"result":tru}}`,
	`{"reply":{"call_id":1,"result":1e400}}`,
	`{"reply":{"call_id":,"result":1}}`,
	`{"reply":{"call_id":1,"result":{"A":1,"a":2}}}`,
	`{"reply":{"call_id":1,"error":"no"}}`,
}

// checkDecodeReply checks that a line decodeReply takes decodes the same
// way through decodeRequest.
func checkDecodeReply(t *testing.T, line string) {
	fast, ok := decodeReply([]byte(line))
	if !ok {
		return
	}
	slow, err := decodeRequest([]byte(line))
	require.Nil(t, err, "decodeReply took %s, which decodeRequest refuses", line)
	require.NotNil(t, slow.Reply, line)
	require.Empty(t, setFields(slow), line)
	require.Equal(t, *slow.Reply.CallID, *fast.Reply.CallID, line)
	require.Equal(t, string(slow.Reply.Result), string(fast.Reply.Result), line)
	require.Nil(t, fast.Reply.Error, line)
	require.Nil(t, fast.Reply.ErrorType, line)
	slow.Reply, fast.Reply = nil, nil
	require.True(t, reflect.DeepEqual(slow, fast), "%s: %+v against %+v", line, fast, slow)
}

// The quick reply path takes only lines that decodeRequest decodes to the
// same reply, and leaves the others (a repeated key, space, a bad number)
// to it.
func TestDecodeReplyAgreesWithDecodeRequest(t *testing.T) {
	took := map[string]bool{}
	for _, line := range replyLines {
		_, ok := decodeReply([]byte(line))
		took[line] = ok
		checkDecodeReply(t, line)
	}
	require.True(t, took[`{"reply":{"call_id":1,"result":2}}`])
	require.True(t, took[`{"reply":{"call_id":1,"result":{"a":",\"result\":"}}}`])
	require.False(t, took[`{"reply":{"call_id":1,"result":{"a":1,"a":2}}}`])
	require.False(t, took[`{"reply":{"call_id":01,"result":1}}`])
	require.False(t, took[`{"reply":{"call_id":1,"result": 1}}`])
	require.False(t, took[`{"reply":{"call_id":9223372036854775808,"result":"x"}}`])
}

func FuzzDecodeReply(f *testing.F) {
	for _, line := range replyLines {
		f.Add(line)
	}
	f.Fuzz(checkDecodeReply)
}
