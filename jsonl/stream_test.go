package jsonl

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// untilResult takes the lines of request id up to its result, in order:
// the output events, then the result.
func (ls *liveServe) untilResult(id string) (events []map[string]any, result map[string]any) {
	ls.t.Helper()
	for {
		m := ls.take("a line for id "+id, func(m map[string]any) bool { return fmt.Sprint(m["id"]) == id })
		if m["event"] == "output" {
			events = append(events, m)
			continue
		}
		return events, m
	}
}

// streamText joins the text of the output events of one stream.
func streamText(events []map[string]any, stream string) string {
	var b strings.Builder
	for _, e := range events {
		if e["stream"] == stream {
			b.WriteString(e["text"].(string))
		}
	}
	return b.String()
}

// ackOnRead is Python that waits until the test has read an output event
// whose text is name (the test creates the file ack-NAME when it has).
const ackOnRead = `
import os, sys, time
def wait_ack(name):
    while not os.path.exists(os.path.join(os.environ["ACK_DIR"], "ack-" + name)):
        time.sleep(0.005)
`

// The loop streams its lines before the result, in order: the
// job prints its next line only once the client has read the last one's
// output event, so a pool that wrote them only with the result would
// time the job out. A request without "stream" gets no events.
func TestServeStreamBeforeResult(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 2})
	dir := p.Config().Dir
	ls := startLive(t, p)
	code, _ := json.Marshal(ackOnRead + `
for i in range(3):
    print(i, flush=True)
    wait_ack(str(i))
    time.sleep(0.3)
`)
	ls.send(fmt.Sprintf(`{"id": 7, "stream": true, "code": %s, "allow_read": [%q], "env": {"ACK_DIR": %q}, "timeout": "20s"}`, code, dir, dir))
	ls.send(`{"id": "plain", "code": "print(5)"}`)
	var texts []string
	for {
		m := ls.take("a line for id 7", func(m map[string]any) bool { return fmt.Sprint(m["id"]) == "7" })
		if m["event"] != "output" {
			require.Nil(t, m["error"], "%v", m)
			require.Equal(t, "0\n1\n2\n", m["stdout"])
			break
		}
		require.Equal(t, "stdout", m["stream"])
		require.NotContains(t, m, "session")
		text := m["text"].(string)
		texts = append(texts, text)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "ack-"+strings.TrimSpace(text)), nil, 0o644))
	}
	require.Equal(t, []string{"0\n", "1\n", "2\n"}, texts)
	events, res := ls.untilResult("plain")
	require.Empty(t, events)
	require.Equal(t, "5\n", res["stdout"])
	require.Empty(t, ls.finish())
}

// A session step's events carry the session's name and tag each stream;
// later steps stream only when they ask to.
func TestServeStreamSessionSteps(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": 1, "session": "nb", "stream": true, "code": "import sys\nx = 1\nprint('out', flush=True)\nprint('err', file=sys.stderr, flush=True)\nprint('out2')"}`)
	events, res := ls.untilResult("1")
	require.Nil(t, res["error"], "%v", res)
	require.NotEmpty(t, events)
	for _, e := range events {
		require.Equal(t, "nb", e["session"])
		require.Equal(t, "output", e["event"])
	}
	require.Equal(t, "out\nout2\n", streamText(events, "stdout"))
	require.Equal(t, "err\n", streamText(events, "stderr"))
	require.Equal(t, res["stdout"], streamText(events, "stdout"))

	ls.send(`{"id": 2, "session": "nb", "code": "print(x)"}`)
	events, res = ls.untilResult("2")
	require.Empty(t, events)
	require.Equal(t, "1\n", res["stdout"])

	ls.send(`{"id": 3, "session": "nb", "stream": true, "code": "print(x + 1)\n1/0"}`)
	events, res = ls.untilResult("3")
	require.Equal(t, "2\n", streamText(events, "stdout"))
	require.Contains(t, streamText(events, "stderr"), "ZeroDivisionError")
	require.Equal(t, res["stderr"], streamText(events, "stderr"))
	require.Empty(t, ls.finish())
}

// Output events are valid UTF-8 whatever the job writes, a character
// split between writes arrives whole, and a large write is cut into
// events of bounded size that together carry all of it, beyond what
// max_output keeps.
func TestServeStreamUTF8AndLineSize(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	in := strings.Join([]string{
		`{"id": 1, "stream": true, "code": "import sys, time\nout = sys.stdout.buffer\nout.write(b'A\\xe2\\x82'); out.flush(); time.sleep(0.1)\nout.write(b'\\xac\\xff\\n'); out.flush(); time.sleep(0.1)\nout.write(b'\\xe2')"}`,
		`{"id": 2, "stream": true, "max_output": 1000, "code": "import sys\nsys.stdout.write('\\x01' * 300000)\nsys.stdout.flush()\nsys.stderr.write('e' * 100000)"}`,
	}, "\n") + "\n"
	var out bytes.Buffer
	require.NoError(t, Serve(context.Background(), p, strings.NewReader(in), &out))
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	got := map[string][]map[string]any{}
	results := map[string]map[string]any{}
	longest := 0
	for sc.Scan() {
		line := sc.Bytes()
		require.True(t, utf8.Valid(line))
		m, err := decodeLine(line)
		require.NoError(t, err)
		id := fmt.Sprint(m["id"])
		switch {
		case m["event"] == "ready":
		case m["event"] == "output":
			require.NotContains(t, results, id, "an output event after its result")
			got[id] = append(got[id], m)
			longest = max(longest, len(line))
		default:
			results[id] = m
		}
	}
	require.Equal(t, "A\u20ac\uFFFD\n\uFFFD", streamText(got["1"], "stdout"))
	for _, e := range got["1"] {
		require.NotEqual(t, "A\uFFFD", e["text"], "the euro sign was split")
	}
	require.Equal(t, strings.Repeat("\x01", 300000), streamText(got["2"], "stdout"))
	require.Equal(t, strings.Repeat("e", 100000), streamText(got["2"], "stderr"))
	require.Len(t, results["2"]["stdout"], 1000)
	require.Equal(t, true, results["2"]["stdout_truncated"])
	// A text of at most 32 KiB, each control byte written as \u0001.
	t.Logf("%d events for 400 KB of output; longest line %d bytes", len(got["2"]), longest)
	require.LessOrEqual(t, longest, 6*pynox.MaxOutputChunk+256)
	require.GreaterOrEqual(t, len(got["2"]), 400000/pynox.MaxOutputChunk)
}

// "stream" is a boolean, and only jobs and session steps take it.
func TestServeStreamRefused(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	in := strings.Join([]string{
		`{"id": 1, "stream": "yes", "code": "print(1)"}`,
		`{"id": 2, "stream": true, "stats": true}`,
		`{"id": 3, "session": "s", "code": "1"}`,
		`{"id": 4, "session": "s", "close": true, "stream": true}`,
		`{"id": 5, "stream": true, "reply": {"call_id": 1, "result": 1}}`,
		`{"id": 6, "stream": false, "code": "print(6)"}`,
	}, "\n") + "\n"
	lines := serveLines(t, p, in)
	byID := map[string]map[string]any{}
	for _, l := range lines[1:] {
		require.NotEqual(t, "output", l["event"], "%v", l)
		byID[fmt.Sprint(l["id"])] = l
	}
	msg := func(id string) string {
		e, _ := byID[id]["error"].(map[string]any)
		require.NotNil(t, e, "id %s: %v", id, byID[id])
		require.Equal(t, "RequestError", e["type"])
		return e["message"].(string)
	}
	require.Contains(t, msg("1"), "stream: expected true or false")
	require.Contains(t, msg("2"), "stats request")
	require.Contains(t, msg("4"), "stream")
	require.Contains(t, msg("5"), "stream")
	require.Equal(t, "6\n", byID["6"]["stdout"])
}

// The Go client streams too: Client.Run's and Session.Run's OnOutput see
// each line before the result (the job waits for the callback to have
// seen it), tagged by stream, and none after Run returns, also when ctx
// ends first.
func TestClientStreamOutput(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	dir := p.Config().Dir
	c := startClient(t, p)
	ctx := context.Background()
	type ev struct {
		stream pynox.Stream
		text   string
	}
	var mu sync.Mutex
	var got []ev
	var returned atomic.Bool
	var late atomic.Int64
	onOut := func(s pynox.Stream, text string) {
		if returned.Load() {
			late.Add(1)
		}
		mu.Lock()
		got = append(got, ev{s, text})
		mu.Unlock()
		os.WriteFile(filepath.Join(dir, "ack-"+strings.TrimSpace(text)), nil, 0o644)
	}
	res, err := c.Run(ctx, pynox.Job{ID: "j", Code: ackOnRead + `
for i in range(3):
    print(i, flush=True)
    wait_ack(str(i))
print("e", file=sys.stderr, flush=True)
`, AllowRead: []string{dir}, Env: map[string]string{"ACK_DIR": dir}, Timeout: 20 * time.Second, OnOutput: onOut})
	returned.Store(true)
	require.NoError(t, err)
	require.Nil(t, res.Error, "%+v", res.Error)
	require.Equal(t, []ev{{pynox.Stdout, "0\n"}, {pynox.Stdout, "1\n"}, {pynox.Stdout, "2\n"}, {pynox.Stderr, "e\n"}}, got)

	// A session step.
	got = nil
	returned.Store(false)
	s := c.Session("cs", pynox.Job{})
	res, err = s.Run(ctx, pynox.Step{Code: "x = 5\nprint(x)", OnOutput: onOut})
	returned.Store(true)
	require.NoError(t, err)
	require.Equal(t, "5\n", res.Stdout)
	require.Equal(t, []ev{{pynox.Stdout, "5\n"}}, got)

	// ctx ends while the job streams: no call after Run returns.
	returned.Store(false)
	cctx, cancel := context.WithCancel(ctx)
	var n atomic.Int64
	_, err = c.Run(cctx, pynox.Job{Code: "import time\nwhile True: print('y' * 100, flush=True); time.sleep(0.001)", Timeout: 3 * time.Second,
		OnOutput: func(s pynox.Stream, text string) {
			if returned.Load() {
				late.Add(1)
			}
			if n.Add(1) == 3 {
				cancel()
			}
			time.Sleep(time.Millisecond)
		}})
	returned.Store(true)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, s.Close(ctx))
	// The dropped job runs on to its timeout on the server; its later
	// events are skipped, and the connection serves on.
	_, err = c.Stats(ctx)
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond)
	require.Zero(t, late.Load())
}
