package jsonl

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
)

// tracedPool is a pool whose spans go to an in-memory exporter and whose
// log is the protocol's JSON log, in logs.
func tracedPool(t *testing.T) (*pynox.Pool, *tracetest.InMemoryExporter, *testenv.SyncBuffer) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	logs := &testenv.SyncBuffer{}
	p := newTestPool(t, pynox.Config{Workers: 1, TracerProvider: tp, Logger: slog.New(NewLogHandler(logs))})
	return p, exp, logs
}

// spanByID returns the recorded span of the request with the given id.
func spanByID(t *testing.T, exp *tracetest.InMemoryExporter, name, id string) tracetest.SpanStub {
	t.Helper()
	for _, s := range exp.GetSpans() {
		if s.Name != name {
			continue
		}
		for _, kv := range s.Attributes {
			if string(kv.Key) == pynox.AttrID && kv.Value.AsString() == id {
				return s
			}
		}
	}
	t.Fatalf("no %s span for id %s among %d spans", name, id, len(exp.GetSpans()))
	return tracetest.SpanStub{}
}

// jobLogLines returns the protocol's job log lines by id.
func jobLogLines(t *testing.T, logs *testenv.SyncBuffer) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m["event"] == "job" {
			out[m["id"].(string)] = m
		}
	}
	return out
}

// A traceparent makes the job's span, and a session step's, a child of
// the remote span it names, in its trace; each step takes its own
// request's; the log lines carry the trace ids, and a request without
// traceparent starts a trace of its own. An unsampled parent's child is
// not recorded.
func TestTraceparentJobAndStep(t *testing.T) {
	p, exp, logs := tracedPool(t)
	lines := serveLines(t, p, strings.Join([]string{
		`{"id":"j1","code":"print(1)","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"congo=t61rcWkgMzE"}`,
		`{"id":"j2","code":"print(2)"}`,
		`{"id":"s1","session":"a","code":"x = 1","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`,
		`{"id":"s2","session":"a","code":"raise KeyError(x)","traceparent":"00-11111111111111111111111111111111-2222222222222222-00"}`,
		`{"id":"c","session":"a","close":true}`,
	}, "\n")+"\n")
	got := byID(t, lines)
	require.Equal(t, "", errType(got["j1"]))
	require.Equal(t, "KeyError", errType(got["s2"]))

	j1 := spanByID(t, exp, pynox.SpanJob, "j1")
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", j1.SpanContext.TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", j1.Parent.SpanID().String())
	require.True(t, j1.Parent.IsRemote())
	require.Equal(t, "congo=t61rcWkgMzE", j1.SpanContext.TraceState().String())
	j2 := spanByID(t, exp, pynox.SpanJob, "j2")
	require.False(t, j2.Parent.IsValid())
	require.NotEqual(t, j1.SpanContext.TraceID(), j2.SpanContext.TraceID())

	s1 := spanByID(t, exp, pynox.SpanSessionStep, "s1")
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", s1.SpanContext.TraceID().String())
	require.Equal(t, "b7ad6b7169203331", s1.Parent.SpanID().String())
	// s2's parent is not sampled (flags 00): the SDK's default sampler
	// follows it and records no span, but the log keeps the trace id.
	for _, sp := range exp.GetSpans() {
		require.NotEqual(t, "11111111111111111111111111111111", sp.SpanContext.TraceID().String(), "an unsampled parent's child was recorded")
	}

	log := jobLogLines(t, logs)
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", log["j1"]["trace_id"])
	require.Equal(t, j2.SpanContext.TraceID().String(), log["j2"]["trace_id"])
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", log["s1"]["trace_id"])
	require.Equal(t, "11111111111111111111111111111111", log["s2"]["trace_id"])
}

// A malformed traceparent or tracestate, a tracestate without
// traceparent, and a traceparent on a request that runs no code each get
// one answer, a RequestError naming the field, and run nothing.
func TestTraceparentMalformed(t *testing.T) {
	p, exp, _ := tracedPool(t)
	cases := map[string]string{
		"short":     `{"id":"short","code":"print(1)","traceparent":"00-4bf92f35-00f067aa0ba902b7-01"}`,
		"zeros":     `{"id":"zeros","code":"print(1)","traceparent":"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}`,
		"upper":     `{"id":"upper","code":"print(1)","traceparent":"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"}`,
		"version":   `{"id":"version","code":"print(1)","traceparent":"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
		"stateonly": `{"id":"stateonly","code":"print(1)","tracestate":"congo=t61rcWkgMzE"}`,
		"badstate":  `{"id":"badstate","code":"print(1)","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"=="}`,
		"step":      `{"id":"step","session":"b","code":"x = 1","traceparent":"nope"}`,
		"stats":     `{"id":"stats","stats":true,"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
	}
	field := map[string]string{"stateonly": "tracestate", "badstate": "tracestate", "stats": "traceparent"}
	var input []string
	for _, l := range cases {
		input = append(input, l)
	}
	lines := serveLines(t, p, strings.Join(input, "\n")+"\n")
	require.Len(t, lines, 1+len(cases), "one answer per request")
	got := byID(t, lines)
	for id := range cases {
		l := got[id]
		require.NotNil(t, l, id)
		require.Equal(t, "RequestError", errType(l), id)
		f := field[id]
		if f == "" {
			f = "traceparent"
		}
		require.Contains(t, l["error"].(map[string]any)["message"], f, id)
	}
	require.Empty(t, exp.GetSpans(), "a refused request ran")
	st := p.Stats()
	require.Equal(t, st.Jobs, st.RequestErrors, "nothing ran")
}

// POST /v1/run's RunLine takes the traceparent too.
func TestTraceparentRunLine(t *testing.T) {
	p, exp, _ := tracedPool(t)
	out, err := RunLine(context.Background(), p, []byte(`{"id":"r","code":"print(1)","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`))
	require.NoError(t, err)
	require.NotContains(t, string(out), "RequestError")
	r := spanByID(t, exp, pynox.SpanJob, "r")
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", r.SpanContext.TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", r.Parent.SpanID().String())

	out, err = RunLine(context.Background(), p, []byte(`{"id":"bad","code":"print(1)","traceparent":"00-xyz"}`))
	require.NoError(t, err)
	require.Contains(t, string(out), `"RequestError"`)
	require.Contains(t, string(out), "traceparent")
}
