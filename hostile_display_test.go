package pynox

// Forged display frames: a job writes "display" frames of its own on its
// control channel. The pool refuses what an honest runner never sends
// (a MIME type outside the allow list, data that is not base64 or not
// UTF-8, an image whose bytes are not of its type, oversize data), keeps
// the job running, and passes none of it on.

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHostileDisplayFrames(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	var streamed []Output
	r := run(t, p, Job{Code: forgeReport + `
import base64
def display_frame(mime, data):
    report(b'{"t":"display","step":1,"mime":"' + mime + b'","data":' + data + b'}')
display_frame(b"application/x-evil", b'"aGk="')
display_frame(b"text/html\u0000", b'"x"')
display_frame(b"image/png", b'"!!not base64!!"')
display_frame(b"image/png", b'"' + base64.b64encode(b"GIF89a not a png") + b'"')
display_frame(b"image/jpeg", b'"aGk"')
display_frame(b"text/html", b'"\xff\xfe bad utf-8"')
display_frame(b"text/html", b'12')
display_frame(b"application/json", b'"{not json"')
display_frame(b"text/html", b'"' + b"x" * ((1 << 20) + 100) + b'"')
display_frame(b"text/plain", b'"kept"')
print("alive")
`, OnDisplay: func(o Output) { streamed = append(streamed, o) }})
	requireOK(t, r)
	require.Equal(t, "alive\n", r.Stdout)
	require.Equal(t, 9, r.OutputsDropped)
	require.Len(t, r.Outputs, 2)
	require.Equal(t, Output{MIME: "text/plain", Data: "kept"}, r.Outputs[0])
	require.Equal(t, "text/plain", r.Outputs[1].MIME)
	require.Contains(t, r.Outputs[1].Data, "9 display output(s) dropped")
	require.Contains(t, r.Outputs[1].Data, `"application/x-evil" is not one of the allowed types`)
	require.Equal(t, []Output{{MIME: "text/plain", Data: "kept"}}, streamed, "refused outputs are not passed on")

	// A display frame for another step than the running one is forged:
	// the job is killed for it, and the pool serves the next job.
	r = run(t, p, Job{Code: forgeReport + `report(b'{"t":"display","step":7,"mime":"text/plain","data":"x"}')
import time; time.sleep(5)`})
	requireErrorType(t, r, "PoolWorkerError")
	require.True(t, strings.Contains(r.Error.Message, `unexpected "display" frame`), r.Error.Message)
	requireOK(t, run(t, p, Job{Code: "from pynox_display import display\ndisplay(1)"}))
}
