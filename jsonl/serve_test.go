package jsonl

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
	"github.com/stretchr/testify/require"
)

// serveLines runs Serve over the given input and returns every output
// line decoded, the ready event first.
func serveLines(t *testing.T, p *pynox.Pool, input string) []map[string]any {
	t.Helper()
	var out bytes.Buffer
	require.NoError(t, Serve(context.Background(), p, strings.NewReader(input), &out))
	var lines []map[string]any
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	for sc.Scan() {
		m, err := decodeLine(sc.Bytes())
		require.NoError(t, err, sc.Text())
		lines = append(lines, m)
	}
	return lines
}

// decodeLine decodes one output line, numbers kept as json.Number.
func decodeLine(b []byte) (map[string]any, error) {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return m, dec.Decode(&m)
}

func byID(t *testing.T, lines []map[string]any) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, l := range lines[1:] {
		k := fmt.Sprint(l["id"])
		_, dup := out[k]
		require.False(t, dup, "id %s answered twice", k)
		out[k] = l
	}
	return out
}

func errType(l map[string]any) string {
	e, _ := l["error"].(map[string]any)
	if e == nil {
		return ""
	}
	return e["type"].(string)
}

func errMessage(l map[string]any) string {
	e, _ := l["error"].(map[string]any)
	if e == nil {
		return ""
	}
	return e["message"].(string)
}

func TestServeProtocol(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{})
	long := `{"id": "long", "code": "` + strings.Repeat("x", MaxLine) + `"}`
	input := strings.Join([]string{
		`{"id": "task-1", "code": "import json\nprint(json.dumps({'ok': True}))", "name": "step.py"}`,
		`{"id": 2, "code": "print(1)", "timeout": "5s", "memory": "512m", "max_output": 65536, "max_file_size": 1048576}`,
		`{"id": 3, "code": "print(1)", "memory": 268435456}`,
		`not json at all`,
		`{"id": "unknown", "code": "1", "bogus": true}`,
		`{"id": "types", "code": 5}`,
		`{"id": "dur", "code": "1", "timeout": "5 parsecs"}`,
		`{"id": "dur2", "code": "1", "timeout": 5}`,
		`{"id": "size", "code": "1", "memory": "lots"}`,
		`{"id": "neg", "code": "1", "memory": -5}`,
		`{"id": "trailing", "code": "1"} {"x": 1}`,
		`[1, 2]`,
		``,
		long,
		`{"id": "after-long", "code": "print('fine')"}`,
		`{"id": "s1", "stats": true}`,
		`{"id": "bad-stats", "stats": true, "code": "1"}`,
		`{"id": "last", "code": "print('last')"}`,
	}, "\n") + "\n"
	lines := serveLines(t, p, input)

	ready := lines[0]
	require.Equal(t, "ready", ready["event"])
	require.Equal(t, json.Number("2"), ready["workers"])
	require.Equal(t, "pynox", ready["runtime"])
	require.Equal(t, []any{}, ready["preloaded_modules"])
	require.Equal(t, []any{}, ready["package_dirs"])
	require.Nil(t, ready["config"])
	require.Equal(t, []any{}, ready["profiles"])
	require.Equal(t, p.Cgroups(), ready["cgroups"])
	require.Equal(t, p.PIDNamespace(), ready["pid_namespace"])

	// 17 non-empty lines, each answered exactly once: 16 with an id, and
	// the malformed ones whose id could not be read answered with null.
	require.Len(t, lines, 1+17)
	ids := map[string]int{}
	for _, l := range lines[1:] {
		ids[fmt.Sprint(l["id"])]++
	}
	require.Equal(t, 3, ids["<nil>"], "not json, [1,2] and the long line have no id")

	got := map[string]map[string]any{}
	for _, l := range lines[1:] {
		if l["id"] != nil {
			got[fmt.Sprint(l["id"])] = l
		}
	}
	r := got["task-1"]
	require.Equal(t, "{\"ok\": true}\n", r["stdout"])
	require.Equal(t, json.Number("0"), r["exit"])
	for _, k := range []string{"id", "exit", "stdout", "stderr", "error", "stdout_truncated", "stderr_truncated",
		"duration_ms", "duration_us", "queue_us", "runtime", "policy"} {
		require.Contains(t, r, k)
	}
	rt := r["runtime"].(map[string]any)
	require.Equal(t, "pynox", rt["name"])
	require.Equal(t, "pool", rt["mode"])
	pol := got["2"]["policy"].(map[string]any)
	require.Equal(t, json.Number("5000"), pol["timeout_ms"])
	require.Equal(t, json.Number("536870912"), pol["memory_bytes"])
	require.Equal(t, json.Number("268435456"), got["3"]["policy"].(map[string]any)["memory_bytes"])

	for id, want := range map[string]string{
		"unknown":  `unknown field "bogus"`,
		"types":    "code: expected a string",
		"dur":      "invalid duration",
		"dur2":     "",
		"size":     "invalid size",
		"neg":      "invalid size",
		"trailing": "trailing data",
	} {
		require.Equal(t, "RequestError", errType(got[id]), id)
		require.Contains(t, errMessage(got[id]), want, id)
		require.Equal(t, json.Number("-1"), got[id]["exit"], id)
	}
	require.Equal(t, "fine\n", got["after-long"]["stdout"])
	require.Equal(t, "last\n", got["last"]["stdout"])
	require.Equal(t, "RequestError", errType(got["bad-stats"]))

	st := got["s1"]
	require.Equal(t, "stats", st["event"])
	for _, k := range []string{"uptime_ms", "workers", "sessions_active", "jobs", "ok", "failed", "timeouts",
		"signals", "request_errors", "worker_errors", "cancelled", "duration_ms_total", "queue_us_total", "errors"} {
		require.Contains(t, st, k)
	}
	var longSeen bool
	for _, l := range lines[1:] {
		if l["id"] == nil && strings.Contains(errMessage(l), "exceeds") {
			longSeen = true
		}
	}
	require.True(t, longSeen, "the long line is answered with a RequestError")
}

func TestServeConcurrentExactlyOnce(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{})
	var in strings.Builder
	const n = 60
	for i := 0; i < n; i++ {
		code := fmt.Sprintf("print(%d)", i)
		switch i % 4 {
		case 1:
			code = "raise RuntimeError('x')"
		case 2:
			code = "import sys; sys.exit(2)"
		}
		fmt.Fprintf(&in, `{"id": %d, "code": %q}`+"\n", i, code)
	}
	lines := serveLines(t, p, in.String())
	got := byID(t, lines)
	require.Len(t, got, n)
	for i := 0; i < n; i++ {
		r := got[fmt.Sprint(i)]
		require.NotNil(t, r, "id %d missing", i)
		switch i % 4 {
		case 1:
			require.Equal(t, "RuntimeError", errType(r))
		case 2:
			require.Equal(t, json.Number("2"), r["exit"])
		default:
			require.Equal(t, fmt.Sprintf("%d\n", i), r["stdout"])
		}
	}
	st := p.Stats()
	require.Equal(t, int64(n), st.Jobs)
	require.Equal(t, int64(n/2), st.OK)
	require.Equal(t, int64(n/2), st.Failed)
	require.Equal(t, int64(n/4), st.Errors["RuntimeError"])
}

// blockingWriter accepts nothing until released, like a client that stops
// reading its pipe.
type blockingWriter struct {
	mu      sync.Mutex
	release chan struct{}
	buf     bytes.Buffer
	writes  int
}

func (w *blockingWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	w.writes++
	first := w.writes == 1
	w.mu.Unlock()
	if !first {
		<-w.release
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(b)
}

// countingReader counts how many request lines Serve has consumed.
type countingReader struct {
	mu    sync.Mutex
	lines []string
	next  int
}

func (r *countingReader) Read(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next >= len(r.lines) {
		return 0, io.EOF
	}
	l := r.lines[r.next]
	if len(l) > len(b) {
		panic("short read buffer")
	}
	r.next++
	return copy(b, l), nil
}

func (r *countingReader) consumed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.next
}

func TestServeBackpressure(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	// Job lines, and lines each naming a new session beyond max_sessions
	// (every one but the first is refused).
	for _, line := range []string{`{"id": %d, "code": "print(%d)"}`, `{"id": %d, "session": "s%d", "code": "pass"}`} {
		p := newTestPool(t, pynox.Config{Workers: 1, MaxSessions: 1})
		in := &countingReader{}
		for i := 0; i < 50; i++ {
			in.lines = append(in.lines, fmt.Sprintf(line+"\n", i, i))
		}
		w := &blockingWriter{release: make(chan struct{})}
		done := make(chan error, 1)
		go func() { done <- Serve(context.Background(), p, in, w) }()
		// With stdout blocked after the ready line, the pool may hold the
		// running job plus a queue of twice the workers, plus the line being
		// read and the handful in the reader's buffer; never all 50.
		time.Sleep(1500 * time.Millisecond)
		held := in.consumed()
		require.Less(t, held, 10, "the pool kept reading while its output was blocked (%s)", line)
		close(w.release)
		require.NoError(t, <-done)
		require.Equal(t, 50, in.consumed())
		require.Equal(t, 51, strings.Count(w.buf.String(), "\n"))
	}
}

func TestServeStopsOnContext(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	pr, pw := io.Pipe()
	var out bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, p, pr, &out) }()
	_, err := io.WriteString(pw, `{"id": "slow", "code": "import time; time.sleep(0.5); print('drained')"}`+"\n")
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	cancel() // as SIGTERM does: stop reading, answer what was accepted
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return after cancellation")
	}
	require.Contains(t, out.String(), "drained")
	pw.Close()
}

func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"id": 1, "code": "print(1)"}`,
		`{"id": "x", "script": "a.py", "args": ["1"], "allow_read": ["d"], "env": {"A": "b"}, "timeout": "5s", "memory": "512m", "max_output": 10}`,
		`{"stats": true}`, `{"id": null}`, `[]`, `"str"`, `{"memory": 1e99}`, `{"timeout": "-1s"}`, `{"id": {"a": 1}}`,
		`{"id": 1, "session": "nb", "code": "x = 1", "functions": ["f"]}`, `{"id": 2, "session": "nb", "close": true}`,
		`{"reply": {"call_id": 7, "result": ["a", 1, null]}}`, `{"reply": {"call_id": 7, "error": "e"}}`,
		`{"reply": {"call_id": 7.5, "result": 1}}`, `{"reply": {"call_id": 7, "result": 1, "x": 2}}`,
		`{"CODE": "1"}`, `{"ſession": "a", "code": "1"}`, `{"code": "1", "code": "2"}`, `{"code": "1", "cod\u0065": "2"}`,
		`{"id": 1, "id": 2, "code": "1"}`, `{"code": "1", "env": {"A": "1", "A": "2"}}`, `{"reply": {"CALL_ID": 1, "result": 1}}`,
		`{"reply": {"call_id": 1, "result": {"a": [{"b": 1, "b": 2}]}}}`, "{\"code\": \"1\", \"env\": {\"\xff\": \"1\", \"\xfe\": \"2\"}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		req, err := decodeRequest(line)
		if err != nil {
			require.Equal(t, pynox.KindRequest, err.Kind)
			require.NotEmpty(t, err.Message)
			require.Nil(t, checkID(req.ID), "a refusal echoes only a valid id")
			return
		}
		require.Nil(t, checkID(req.ID))
		// Every key of an accepted line is exactly a field name.
		var keys map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(line, &keys))
		for k := range keys {
			require.Contains(t, requestSchema.fields, k)
		}
		require.GreaterOrEqual(t, int64(req.Timeout), int64(0))
		require.GreaterOrEqual(t, int64(req.Memory), int64(0))
		// An accepted request re-encodes to JSON that decodes to the same.
		b, merr := json.Marshal(req)
		require.NoError(t, merr)
		again, err2 := decodeRequest(b)
		require.Nil(t, err2, "%s", b)
		require.Equal(t, req.Code, again.Code)
		require.Equal(t, req.Session, again.Session)
		require.ElementsMatch(t, req.Functions, again.Functions) // [] and absent both declare none
		require.Equal(t, req.Reply != nil, again.Reply != nil)
	})
}

// BenchmarkDecodeRequest measures the decoding of a typical request line
// (the exact-key check included).
func BenchmarkDecodeRequest(b *testing.B) {
	line := []byte(`{"id": "task-2", "code": "import json\nprint(json.dumps({'ok': True}))", "name": "step.py", "args": ["one"], "allow_read": ["data"], "allow_write": ["out"], "env": {"KEY": "value"}, "timeout": "5s", "memory": "512m", "max_output": 65536}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeRequest(line); err != nil {
			b.Fatal(err)
		}
	}
}
