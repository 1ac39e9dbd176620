package pynox

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// requirePythonModule skips a test when the test interpreter lacks a
// module (matplotlib, pandas).
func requirePythonModule(t *testing.T, mod string) {
	t.Helper()
	py := testPython()
	if py == "" {
		py = "python3"
	}
	if err := importErr(py, mod); err != nil {
		t.Skipf("%s cannot import %s: %v", py, mod, err)
	}
}

// importChecks holds importErr's answers: each check imports the modules
// in a fresh interpreter (about a CPU-second for pandas), and several
// tests ask the same question.
var importChecks sync.Map // py + "\x00" + mods -> importCheck

type importCheck struct{ err error }

// importErr reports whether py can import mods ("pandas, numpy"): nil
// when it can, once per interpreter and module list in a test run.
func importErr(py, mods string) error {
	key := py + "\x00" + mods
	if c, ok := importChecks.Load(key); ok {
		return c.(importCheck).err
	}
	err := exec.Command(py, "-c", "import "+mods).Run()
	importChecks.Store(key, importCheck{err})
	return err
}

// pngSize decodes a base64 PNG output and returns its width and height
// from its IHDR chunk.
func pngSize(t *testing.T, data string) (int, int) {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(data)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")), "not a PNG: %q", b[:min(len(b), 16)])
	require.GreaterOrEqual(t, len(b), 24)
	require.Equal(t, "IHDR", string(b[12:16]))
	return int(binary.BigEndian.Uint32(b[16:20])), int(binary.BigEndian.Uint32(b[20:24]))
}

const chartCode = `
import matplotlib.pyplot as plt
fig = plt.figure(figsize=(4, 3), dpi=50)
plt.plot([1, 2, 3], [1, 4, 9])
plt.show()
plt.figure(figsize=(2, 1), dpi=50)
plt.bar(["a", "b"], [3, 5])
print("drawn")
`

// A matplotlib chart becomes a PNG output of the figure's size: one shown
// with plt.show(), one still open when the job ends, in order, and the
// backend is pynox's without the job choosing it.
func TestDisplayMatplotlibChart(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requirePythonModule(t, "matplotlib")
	// The template's preload hygiene checks (threads, descriptors) pass
	// with matplotlib.pyplot, font cache and all.
	_, noHome := os.Stat("/nonexistent")
	p := newTestPool(t, Config{Workers: 1, Preload: []string{"matplotlib.pyplot"}})
	require.Equal(t, []string{"matplotlib.pyplot"}, p.Preloaded())
	// The preload wrote nothing to the templates' HOME (as in
	// TestDisplayPreloadWritesNoHome, which runs with PYNOX_LONG=1).
	if os.IsNotExist(noHome) {
		_, err := os.Stat("/nonexistent")
		require.True(t, os.IsNotExist(err), "a template created /nonexistent: %v", err)
	}
	var streamed []Output
	r := run(t, p, Job{Code: chartCode + "import matplotlib, os\nprint(matplotlib.get_backend())\nprint(os.environ.get('MPLCONFIGDIR'))\n", OnDisplay: func(o Output) { streamed = append(streamed, o) }})
	requireOK(t, r)
	require.Equal(t, "drawn\nmodule://pynox_mpl\nNone\n", r.Stdout, "jobs get no variable naming the template's directory")
	require.Len(t, r.Outputs, 2, "stderr: %s", r.Stderr)
	require.Equal(t, "image/png", r.Outputs[0].MIME)
	w, h := pngSize(t, r.Outputs[0].Data)
	require.Equal(t, [2]int{200, 150}, [2]int{w, h})
	w, h = pngSize(t, r.Outputs[1].Data)
	require.Equal(t, [2]int{100, 50}, [2]int{w, h})
	require.Zero(t, r.OutputsDropped)
	require.Equal(t, r.Outputs, streamed, "OnDisplay saw every output, in order")
	require.NotContains(t, r.Stderr, "non-GUI backend")

	// The figures were closed: the next job of the same template starts
	// with none.
	r = run(t, p, Job{Code: "import matplotlib.pyplot as plt\nprint(len(plt.get_fignums()))"})
	requireOK(t, r)
	require.Equal(t, "0\n", r.Stdout)
	require.Empty(t, r.Outputs)
}

// A DataFrame as the last expression's value gives its HTML table besides
// its repr; display of an object with _repr_svg_ gives image/svg+xml, and
// the other rich representations their types.
func TestDisplayRichValues(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requirePythonModule(t, "pandas")
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Code: "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"})
	requireOK(t, r)
	require.Contains(t, r.ValueRepr, "a  b")
	require.Len(t, r.Outputs, 1)
	require.Equal(t, "text/html", r.Outputs[0].MIME)
	require.Contains(t, r.Outputs[0].Data, "<table")
	require.Contains(t, r.Outputs[0].Data, "<td>x</td>")

	r = run(t, p, Job{Code: `
from pynox_display import display, HTML, Markdown
class Circle:
    def _repr_svg_(self):
        return '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><circle r="4"/></svg>'
    def _repr_html_(self):
        return "<b>not chosen</b>"
class Doc:
    def _repr_json_(self):
        return {"k": [1, 2]}
class Broken:
    def _repr_html_(self):
        raise RuntimeError("boom")
display(Circle())
display(HTML("<i>é</i>"), Markdown("# title"), Doc(), Broken(), [1, 2])
display({"text/html": "<p>raw</p>", "text/plain": "raw"}, raw=True)
`})
	requireOK(t, r)
	mimes := make([]string, len(r.Outputs))
	for i, o := range r.Outputs {
		mimes[i] = o.MIME
	}
	require.Equal(t, []string{"image/svg+xml", "text/html", "text/markdown", "application/json", "text/plain", "text/plain", "text/html"}, mimes)
	require.True(t, strings.HasPrefix(r.Outputs[0].Data, "<svg"))
	require.Equal(t, "<i>é</i>", r.Outputs[1].Data)
	require.JSONEq(t, `{"k":[1,2]}`, r.Outputs[3].Data)
	require.Contains(t, r.Outputs[4].Data, "Broken object")
	require.Contains(t, r.Stderr, "RuntimeError: boom", "a failing _repr_ is printed, as IPython does")
	require.Equal(t, "[1, 2]", r.Outputs[5].Data)
	require.Equal(t, "<p>raw</p>", r.Outputs[6].Data)
}

// Past MaxOutputs or MaxOutputsBytes, outputs are dropped with a marker,
// and the job runs to its end.
func TestDisplayCaps(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Code: `
from pynox_display import display, HTML
for i in range(70):
    display(HTML("<p>%d</p>" % i))
display(HTML("x" * (2 << 20)))
print("end")
`})
	requireOK(t, r)
	require.Equal(t, "end\n", r.Stdout)
	require.Len(t, r.Outputs, MaxOutputs+1)
	require.Equal(t, 71-MaxOutputs, r.OutputsDropped)
	last := r.Outputs[MaxOutputs]
	require.Equal(t, "text/plain", last.MIME)
	require.Contains(t, last.Data, "dropped")

	// The total: 9 outputs of a MiB each (less the frame) pass 8 MiB.
	r = run(t, p, Job{Code: `
from pynox_display import display, HTML
for i in range(9):
    display(HTML("y" * ((1 << 20) - 10)))
print("end")
`})
	requireOK(t, r)
	require.Len(t, r.Outputs, 9)
	require.Equal(t, 1, r.OutputsDropped)
	total := 0
	for _, o := range r.Outputs {
		total += len(o.Data)
	}
	require.LessOrEqual(t, total, MaxOutputsBytes+200)
}

// A session step's figures are its own, and streamed through the step's
// OnDisplay; state carries over.
func TestDisplaySessionSteps(t *testing.T) {
	t.Parallel()
	// A third matplotlib template; TestDisplayFloodAndInterrupt streams a session step's outputs in the quick run.
	requireLong(t, "a session's matplotlib figures across steps")
	requirePythonModule(t, "matplotlib")
	p := newTestPool(t, Config{Workers: 1, Preload: []string{"matplotlib.pyplot"}})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(ctx)
	ev, err := co.Feed(ctx, Step{Code: "import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(1, 1), dpi=40)\nplt.plot([1, 2])"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Len(t, ev.Result.Outputs, 1)
	var got []Output
	ev, err = co.Feed(ctx, Step{Code: "from pynox_display import display\ndisplay(fig)\nlen(plt.get_fignums())", OnDisplay: func(o Output) { got = append(got, o) }})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, json.RawMessage("0"), ev.Result.Value)
	require.Len(t, ev.Result.Outputs, 1)
	require.Equal(t, ev.Result.Outputs, got)
	w, h := pngSize(t, got[0].Data)
	require.Equal(t, [2]int{40, 40}, [2]int{w, h})
}

// Preloading matplotlib.pyplot writes nothing to the templates' HOME
// (/nonexistent, which root could create): its configuration and font
// cache go to a private directory for the preloads' time, removed after.
func TestDisplayPreloadWritesNoHome(t *testing.T) {
	t.Parallel()
	requireLong(t, "a template of its own for what TestDisplayMatplotlibChart checks in the quick run")
	requirePythonModule(t, "matplotlib")
	if _, err := os.Stat("/nonexistent"); err == nil {
		t.Skip("/nonexistent exists already (made by something else): the test cannot tell")
	}
	p := newTestPool(t, Config{Workers: 1, Preload: []string{"matplotlib.pyplot"}})
	r := run(t, p, Job{Code: "import os\nprint(os.environ.get('MPLCONFIGDIR'))"})
	requireOK(t, r)
	require.Equal(t, "None\n", r.Stdout, "jobs get no variable naming the template's directory")
	_, err := os.Stat("/nonexistent")
	require.True(t, os.IsNotExist(err), "a template created /nonexistent: %v", err)
}

// Thousands of display calls from several threads keep MaxOutputs and
// count the rest, without a kill; an interrupt that lands while a step
// is sending outputs raises KeyboardInterrupt in its code, the channel
// stays in step, and the next step's outputs are its own.
func TestDisplayFloodAndInterrupt(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Code: `
from pynox_display import display
import threading
def f():
    for i in range(5000):
        display(i)
ts = [threading.Thread(target=f) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
print("ok")`})
	requireOK(t, r)
	require.Equal(t, "ok\n", r.Stdout)
	require.Len(t, r.Outputs, MaxOutputs+1)
	require.Equal(t, 20000-MaxOutputs, r.OutputsDropped)

	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(ctx)
	started := make(chan struct{}, 1)
	go func() {
		<-started
		co.Interrupt()
	}()
	ev, err := co.Feed(ctx, Step{Code: `
from pynox_display import display, HTML
import time
t = time.time()
while time.time() - t < 20:
    display(HTML("x" * 100000))`, OnDisplay: func(Output) {
		select {
		case started <- struct{}{}:
		default:
		}
	}})
	require.NoError(t, err)
	requireErrorType(t, ev.Result, "KeyboardInterrupt")
	require.False(t, ev.Result.SessionEnded)
	require.NotEmpty(t, ev.Result.Outputs)
	ev, err = co.Feed(ctx, Step{Code: "from pynox_display import display\ndisplay(5)"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, []Output{{MIME: "text/plain", Data: "5"}}, ev.Result.Outputs)
}
