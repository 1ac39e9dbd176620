package main

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/jsonl"
)

// TestRemoteClientPropagatesTrace: a span in the ctx given to the remote
// pool's Run, to a checkout's Feed and to jsonl.Client's Run reaches
// `pynox serve` as the request's W3C traceparent and tracestate, so the
// server's span (exported over OTLP to a receiver) is a child of the
// caller's span (recorded by the SDK's in-memory exporter).
func TestRemoteClientPropagatesTrace(t *testing.T) {
	recv := newOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", recv.srv.URL+"/v1/traces")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	s := startServe(t, t.TempDir(), "--workers=1")

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	tracer := tp.Tracer("pynox-test")
	ts, err := trace.ParseTraceState("vendor=abc")
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := jsonl.Dial(ctx, s.wsURL(), jsonl.DialOptions{})
	require.NoError(t, err)
	c, err := jsonl.DialClient(ctx, s.wsURL(), jsonl.DialOptions{})
	require.NoError(t, err)

	callers := map[string]trace.SpanContext{} // by name
	start := func(name string) (context.Context, trace.Span) {
		sctx, span := tracer.Start(ctx, name, trace.WithNewRoot())
		sc := span.SpanContext().WithTraceState(ts)
		sctx = trace.ContextWithSpanContext(sctx, sc)
		callers[name] = sc
		return sctx, span
	}

	rctx, span := start("pool-run")
	res, err := p.Run(rctx, pynox.Job{ID: "r1", Code: "print(1)"})
	require.NoError(t, err)
	require.NoError(t, res.Err())
	span.End()

	co, err := p.Checkout(ctx, pynox.Job{})
	require.NoError(t, err)
	fctx, span := start("feed")
	ev, err := co.Feed(fctx, pynox.Step{Code: "x = 1"})
	require.NoError(t, err)
	require.NotNil(t, ev.Result)
	require.NoError(t, ev.Result.Err())
	span.End()
	require.NoError(t, co.Finish(ctx))

	cctx, span := start("client-run")
	res, err = c.Run(cctx, pynox.Job{ID: "c1", Code: "print(2)"})
	require.NoError(t, err)
	require.NoError(t, res.Err())
	span.End()

	// A ctx without a span sends no traceparent: the server's span is a root.
	res, err = c.Run(ctx, pynox.Job{Code: "print(3)"})
	require.NoError(t, err)
	require.NoError(t, res.Err())

	require.Len(t, exp.GetSpans(), 3, "the caller's spans")
	require.NoError(t, p.Close())
	require.NoError(t, c.Close())
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, s.cmd.Wait(), "stderr: %s", s.stderr.String())

	recv.mu.Lock()
	defer recv.mu.Unlock()
	require.NotEmpty(t, recv.spans, "stderr: %s", s.stderr.String())
	roots := 0
	for _, sp := range recv.spans {
		if len(sp.ParentSpanId) == 0 {
			roots++
		}
	}
	require.GreaterOrEqual(t, roots, 1, "the request without a span")
	for name, sc := range callers {
		var found bool
		for _, sp := range recv.spans {
			if hex.EncodeToString(sp.TraceId) != sc.TraceID().String() {
				continue
			}
			found = true
			require.Equal(t, sc.SpanID().String(), hex.EncodeToString(sp.ParentSpanId), "%s: %s", name, sp.Name)
			require.Equal(t, "vendor=abc", sp.TraceState, name)
		}
		require.True(t, found, "%s: no server span in the caller's trace; spans: %v", name, recv.spans)
	}
}

// TestServeRunTraceparentHeader: POST /v1/run takes the W3C traceparent
// (and tracestate) HTTP header as the job span's parent; a traceparent
// field in the body wins over the header; a malformed header is ignored
// (the job runs, its span starts a trace of its own).
func TestServeRunTraceparentHeader(t *testing.T) {
	recv := newOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", recv.srv.URL+"/v1/traces")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	s := startServe(t, t.TempDir(), "--workers=1")
	post := func(body string, header map[string]string) string {
		req, err := http.NewRequest("POST", s.base+"/v1/run", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode, string(b))
		require.NotContains(t, string(b), `"error":{`, "the job ran")
		return string(b)
	}
	post(`{"id": "hdr", "code": "print(1)"}`, map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "vendor=abc"})
	post(`{"id": "both", "code": "print(1)", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`,
		map[string]string{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"})
	post(`{"id": "bad", "code": "print(1)"}`, map[string]string{"traceparent": "not a traceparent"})
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, s.cmd.Wait(), "stderr: %s", s.stderr.String())

	recv.mu.Lock()
	defer recv.mu.Unlock()
	byID := map[string]*tracepb.Span{}
	for _, sp := range recv.spans {
		byID[otlpAttrs(sp)["pynox.id"]] = sp
	}
	for id, want := range map[string][2]string{
		"hdr":  {"4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"},
		"both": {"0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"},
		"bad":  {"", ""},
	} {
		sp := byID[id]
		require.NotNil(t, sp, "%s: spans %v; stderr: %s", id, recv.spans, s.stderr.String())
		if want[0] == "" {
			require.Empty(t, sp.ParentSpanId, id)
			continue
		}
		require.Equal(t, want[0], hex.EncodeToString(sp.TraceId), id)
		require.Equal(t, want[1], hex.EncodeToString(sp.ParentSpanId), id)
	}
	require.Equal(t, "vendor=abc", byID["hdr"].TraceState)
}
