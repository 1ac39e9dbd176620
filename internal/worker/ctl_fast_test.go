package worker

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// doneFrames are reports that take decodeDone's short way and frames that
// look like them but must not.
var doneFrames = []string{
	`{"t":"done","step":1,"exit":0,"error":null}`,
	`{"t":"done","step":12345,"exit":1,"error":null}`,
	`{"t":"done","step":7,"exit":-9,"error":null,"final":true}`,
	`{"t":"done","step":0,"exit":-0,"error":null}`,
	`{"t":"done","step":999999999999999,"exit":255,"error":null}`,
	// Not the runner's format: json.Unmarshal decides.
	`{"t":"done","step":1,"exit":0,"error":null,"final":false}`,
	`{"t":"done","step":01,"exit":0,"error":null}`,
	`{"t":"done","step":1.5,"exit":0,"error":null}`,
	`{"t":"done","step":1e3,"exit":0,"error":null}`,
	`{"t":"done","step":9999999999999999999999,"exit":0,"error":null}`,
	`{"t":"done","step":1,"exit":,"error":null}`,
	`{"t":"done","step":-,"exit":0,"error":null}`,
	`{"t":"done","step":1,"exit":0,"error":null} `,
	`{"t":"done","step":1,"exit":0,"error":{"type":"ValueError"}}`,
	`{"t":"done","step":1,"exit":0,"error":null,"value":"1"}`,
	`{"t":"done", "step":1,"exit":0,"error":null}`,
	`{"t":"started"}`,
	`{"t":"done","step":1,"exit":0,"error":null}{}`,
}

// TestDecodeDoneAsJSON: what decodeDone decodes, json.Unmarshal decodes
// the same; what it refuses, it leaves to json.Unmarshal.
func TestDecodeDoneAsJSON(t *testing.T) {
	short := 0
	for _, f := range doneFrames {
		checkDecodeDone(t, []byte(f))
		var m childMsg
		if decodeDone([]byte(f), &m) {
			short++
		}
	}
	require.Equal(t, 5, short, "the runner's own formats take the short way, nothing else")
}

func FuzzDecodeDone(f *testing.F) {
	for _, s := range doneFrames {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkDecodeDone(t, b) })
}

func checkDecodeDone(t *testing.T, b []byte) {
	var fast childMsg
	if !decodeDone(b, &fast) {
		return
	}
	var slow childMsg
	require.NoError(t, json.Unmarshal(b, &slow), "%q took the short way but is not JSON", b)
	require.Equal(t, slow, fast, "%q", b)
}
