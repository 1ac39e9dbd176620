package main

import (
	"encoding/base64"
	"encoding/binary"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
)

// `pynox pool --preload=matplotlib.pyplot` starts although the pool is
// confined (its templates can write only to the scratch directory, and
// Debian's matplotlib reads /etc/matplotlibrc), and a chart job returns a
// PNG of the figure's size, streamed to OnDisplay too.
func TestPoolPreloadMatplotlibChart(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandboxOrSkip(t)
	if exec.Command("/usr/bin/python3", "-c", "import matplotlib").Run() != nil {
		t.Skip("/usr/bin/python3 cannot import matplotlib")
	}
	c, stderr := startClientIn(t, t.TempDir(), "--python=/usr/bin/python3", "--preload=matplotlib.pyplot", "--workers=1")
	var streamed []pynox.Output
	r := runJob(t, c, pynox.Job{Code: "import matplotlib.pyplot as plt\nplt.figure(figsize=(3, 2), dpi=50)\nplt.plot([1, 2])\nplt.title('t')\nplt.show()",
		OnDisplay: func(o pynox.Output) { streamed = append(streamed, o) }})
	require.Nil(t, r.Error, "%+v\nstderr: %s\npool: %s", r.Error, r.Stderr, stderr.String())
	require.Len(t, r.Outputs, 1)
	require.Equal(t, r.Outputs, streamed)
	b, err := base64.StdEncoding.DecodeString(r.Outputs[0].Data)
	require.NoError(t, err)
	require.Equal(t, "\x89PNG\r\n\x1a\n", string(b[:8]))
	require.Equal(t, [2]uint32{150, 100}, [2]uint32{binary.BigEndian.Uint32(b[16:20]), binary.BigEndian.Uint32(b[20:24])})
}
