package mountns

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// okReply reads exactly what the json package reads of the builder's
// common replies, and declines everything else (roundTrip then decodes
// it with the json package): each case is checked against json.Unmarshal.
func TestOKReplyAgreesWithJSON(t *testing.T) {
	for _, c := range []struct {
		reply string
		ok    bool
		lease int64
	}{
		{`{"ok": true}`, true, 0},
		{`{"ok": true, "lease": 7}`, true, 7},
		{`{"ok": true, "lease": 123456789012345678}`, true, 123456789012345678},
		{`{"ok": true, "lease": }`, false, 0},
		{`{"ok": true, "lease": 07}`, false, 0},
		{`{"ok": true, "lease": -1}`, false, 0},
		{`{"ok": true, "lease": 1.5}`, false, 0},
		{`{"ok": true, "lease": 1} `, false, 0},
		{`{"ok": true, "lease": 1, "error": "x"}`, false, 0},
		{`{"ok": false}`, false, 0},
		{`{"ok": false, "error": "lease: no prepared namespace is ready"}`, false, 0},
		{`{"ok":true}`, false, 0},
		{``, false, 0},
	} {
		lease, ok := okReply([]byte(c.reply))
		require.Equal(t, c.ok, ok, c.reply)
		require.Equal(t, c.lease, lease, c.reply)
		if ok {
			var reply struct {
				OK    bool  `json:"ok"`
				Lease int64 `json:"lease"`
			}
			require.NoError(t, json.Unmarshal([]byte(c.reply), &reply), c.reply)
			require.True(t, reply.OK, c.reply)
			require.Equal(t, reply.Lease, lease, c.reply)
		}
	}
	want, err := json.Marshal(wirePlan{Op: "lease"})
	require.NoError(t, err)
	require.Equal(t, string(want), string(leaseRequest))
}
