package pynox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pynox/pynox/internal/worker"
)

// The secrets of the traced jobs: none may appear in any span.
const (
	traceSecretCode   = "SECRET_CODE_7f3a"
	traceSecretInput  = "SECRET_INPUT_91bc"
	traceSecretArg    = "SECRET_ARG_c0de"
	traceSecretResult = "SECRET_RESULT_55e1"
	traceSecretOut    = "SECRET_OUT_e4d2"
	traceSecretMsg    = "SECRET_MSG_0a0a"
)

// remoteParent is a ctx whose span is a remote parent, as a W3C
// traceparent "00-<trace>-<span>-01" makes it.
func remoteParent(t *testing.T, traceHex, spanHex string) (context.Context, trace.SpanContext) {
	t.Helper()
	tid, err := trace.TraceIDFromHex(traceHex)
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex(spanHex)
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	return trace.ContextWithRemoteSpanContext(context.Background(), sc), sc
}

// tracedPool is a pool whose spans go to an in-memory exporter and whose
// log records to a buffer.
func tracedPool(t *testing.T) (*Pool, *tracetest.InMemoryExporter, *syncBuffer) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	logs := &syncBuffer{}
	p := newTestPool(t, Config{Workers: 1, TracerProvider: tp, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	return p, exp, logs
}

// spansNamed returns the recorded spans with the given name.
func spansNamed(exp *tracetest.InMemoryExporter, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// spanAttrs maps a span's attributes by key.
func spanAttrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

// requireNoSecrets fails when any span's name, attributes, status or
// events quote a job's code, inputs, arguments, results, output or
// exception message.
func requireNoSecrets(t *testing.T, exp *tracetest.InMemoryExporter) {
	t.Helper()
	for _, s := range exp.GetSpans() {
		text := fmt.Sprintf("%s %v %v %v %v", s.Name, s.Attributes, s.Status, s.Events, s.Links)
		for _, secret := range []string{traceSecretCode, traceSecretInput, traceSecretArg, traceSecretResult, traceSecretOut, traceSecretMsg} {
			require.NotContains(t, text, secret, "span %s", s.Name)
		}
	}
}

// logRecords returns the pool's "job" log records.
func logRecords(t *testing.T, logs *syncBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m["msg"] == jobLogMessage {
			out = append(out, m)
		}
	}
	return out
}

// A job's span is a child of the remote parent in Run's ctx, carries the
// job's id and outcome, and parents the span of each host call, whose ctx
// the HostFunc gets; the job's log record carries the trace id; no span
// quotes the code, the inputs, the call's arguments or result, or the
// output.
func TestTraceJobSpans(t *testing.T) {
	p, exp, logs := tracedPool(t)
	ctx, parent := remoteParent(t, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
	var hostSpan trace.SpanContext
	res, err := p.Run(ctx, Job{
		ID:        "job-1",
		Code:      "# " + traceSecretCode + "\nimport pynox_host\nr = pynox_host.lookup(" + fmt.Sprintf("%q", traceSecretArg) + ")\nprint(r, x, " + fmt.Sprintf("%q", traceSecretOut) + ")",
		Inputs:    map[string]any{"x": traceSecretInput},
		Functions: []string{"lookup"},
		Host: func(ctx context.Context, call *Call) (any, error) {
			hostSpan = trace.SpanContextFromContext(ctx)
			return traceSecretResult, nil
		},
	})
	require.NoError(t, err)
	requireOK(t, res)
	require.Contains(t, res.Stdout, traceSecretOut)

	jobs := spansNamed(exp, SpanJob)
	require.Len(t, jobs, 1)
	job := jobs[0]
	require.Equal(t, parent.TraceID(), job.SpanContext.TraceID())
	require.Equal(t, parent.SpanID(), job.Parent.SpanID(), "the job's span is the traceparent's child")
	require.True(t, job.Parent.IsRemote())
	a := spanAttrs(job)
	require.Equal(t, "job-1", a[AttrID].AsString())
	require.Equal(t, "ok", a[AttrOutcome].AsString())
	require.Equal(t, int64(0), a[AttrExitCode].AsInt64())
	require.Equal(t, codes.Unset, job.Status.Code)

	calls := spansNamed(exp, SpanHostCall)
	require.Len(t, calls, 1)
	call := calls[0]
	require.Equal(t, job.SpanContext.SpanID(), call.Parent.SpanID(), "the host call's span is the job's child")
	require.Equal(t, parent.TraceID(), call.SpanContext.TraceID())
	require.Equal(t, call.SpanContext.SpanID(), hostSpan.SpanID(), "the HostFunc's ctx carries the call's span")
	ca := spanAttrs(call)
	require.Equal(t, "lookup", ca[AttrFunction].AsString())
	require.Equal(t, "job-1", ca[AttrID].AsString())
	require.Equal(t, "ok", ca[AttrOutcome].AsString())
	requireNoSecrets(t, exp)

	recs := logRecords(t, logs)
	require.Len(t, recs, 1)
	require.Equal(t, parent.TraceID().String(), recs[0]["trace_id"])
}

// A job that fails sets its span's status to Error, described by the
// error type alone: the exception's message, which may quote the job's
// data, is in no span. A host call answered with an error records the
// exception type the job sees.
func TestTraceJobErrorSpan(t *testing.T) {
	p, exp, _ := tracedPool(t)
	res, err := p.Run(context.Background(), Job{
		ID:        7,
		Code:      "import pynox_host\ntry:\n    pynox_host.fail()\nexcept Exception:\n    pass\nraise ValueError(" + fmt.Sprintf("%q", traceSecretMsg) + ")",
		Functions: []string{"fail"},
		Host: func(ctx context.Context, call *Call) (any, error) {
			return nil, RaiseAs("KeyError", traceSecretMsg)
		},
	})
	require.NoError(t, err)
	requireErrorType(t, res, "ValueError")

	jobs := spansNamed(exp, SpanJob)
	require.Len(t, jobs, 1)
	job := jobs[0]
	require.False(t, job.Parent.IsValid(), "without a parent in ctx the job's span is a root")
	require.Equal(t, codes.Error, job.Status.Code)
	require.Equal(t, "ValueError", job.Status.Description)
	a := spanAttrs(job)
	require.Equal(t, "7", a[AttrID].AsString())
	require.Equal(t, "error", a[AttrOutcome].AsString())
	require.Equal(t, "ValueError", a[AttrErrorType].AsString())
	require.Equal(t, int64(res.Exit), a[AttrExitCode].AsInt64())

	calls := spansNamed(exp, SpanHostCall)
	require.Len(t, calls, 1)
	require.Equal(t, codes.Error, calls[0].Status.Code)
	require.Equal(t, "KeyError", spanAttrs(calls[0])[AttrErrorType].AsString())
	requireNoSecrets(t, exp)
}

// A session step's span is a child of the remote parent in Feed's ctx,
// lasts across the Resume of a host call the step surfaced (whose span is
// the step's child), and records the step's number and outcome; each
// step's log record carries its trace id.
func TestTraceSessionStepSpans(t *testing.T) {
	p, exp, logs := tracedPool(t)
	co, err := p.Checkout(context.Background(), Job{Functions: []string{"ask"}})
	require.NoError(t, err)
	defer co.Finish(context.Background())

	ctx, parent := remoteParent(t, "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
	ev, err := co.Feed(ctx, Step{ID: "s1", Code: "import pynox_host\nv = pynox_host.ask(" + fmt.Sprintf("%q", traceSecretArg) + ")"})
	require.NoError(t, err)
	require.NotNil(t, ev.Call)
	require.Empty(t, spansNamed(exp, SpanSessionStep), "the step's span ends with the step, not with the call")
	ev, err = co.Resume(context.Background(), ev.Call.ID, Return(traceSecretResult))
	require.NoError(t, err)
	require.NotNil(t, ev.Result)
	requireOK(t, ev.Result)

	ctx2, parent2 := remoteParent(t, "11111111111111111111111111111111", "2222222222222222")
	ev, err = co.Feed(ctx2, Step{ID: "s2", Code: "raise KeyError(v)"})
	require.NoError(t, err)
	requireErrorType(t, ev.Result, "KeyError")

	steps := spansNamed(exp, SpanSessionStep)
	require.Len(t, steps, 2)
	s1, s2 := steps[0], steps[1]
	require.Equal(t, parent.TraceID(), s1.SpanContext.TraceID())
	require.Equal(t, parent.SpanID(), s1.Parent.SpanID())
	a := spanAttrs(s1)
	require.Equal(t, "s1", a[AttrID].AsString())
	require.Equal(t, int64(1), a[AttrStep].AsInt64())
	require.Equal(t, "ok", a[AttrOutcome].AsString())

	require.Equal(t, parent2.TraceID(), s2.SpanContext.TraceID())
	require.Equal(t, parent2.SpanID(), s2.Parent.SpanID())
	a = spanAttrs(s2)
	require.Equal(t, int64(2), a[AttrStep].AsInt64())
	require.Equal(t, "KeyError", a[AttrErrorType].AsString())
	require.Equal(t, codes.Error, s2.Status.Code)

	calls := spansNamed(exp, SpanHostCall)
	require.Len(t, calls, 1)
	require.Equal(t, s1.SpanContext.SpanID(), calls[0].Parent.SpanID(), "the surfaced call's span is the step's child")
	require.Equal(t, "ask", spanAttrs(calls[0])[AttrFunction].AsString())
	require.Equal(t, "ok", spanAttrs(calls[0])[AttrOutcome].AsString())
	require.Less(t, s1.StartTime, calls[0].StartTime)
	require.True(t, !calls[0].EndTime.After(s1.EndTime), "the call ends within its step")
	requireNoSecrets(t, exp)

	recs := logRecords(t, logs)
	require.Len(t, recs, 2)
	require.Equal(t, parent.TraceID().String(), recs[0]["trace_id"])
	require.Equal(t, parent2.TraceID().String(), recs[1]["trace_id"])
}

// A step whose Feed ctx ends records the outcome "canceled" on its span
// rather than leaving it open.
func TestTraceStepCanceled(t *testing.T) {
	p, exp, _ := tracedPool(t)
	co, err := p.Checkout(context.Background(), Job{})
	require.NoError(t, err)
	defer co.Finish(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = co.Feed(ctx, Step{ID: "slow", Code: "import time\nwhile True: time.sleep(0.05)"})
	require.Error(t, err)
	steps := spansNamed(exp, SpanSessionStep)
	require.Len(t, steps, 1)
	a := spanAttrs(steps[0])
	require.Equal(t, codes.Error, steps[0].Status.Code)
	require.Contains(t, []string{"canceled", "error"}, a[AttrOutcome].AsString())
}

// Without a TracerProvider (and no global one installed) the pool makes
// no spans, yet a job whose ctx carries a remote parent logs that
// parent's trace id, and one without logs no trace_id; host calls work
// either way.
func TestTraceNoProviderLogsParentTraceID(t *testing.T) {
	logs := &syncBuffer{}
	p := newTestPool(t, Config{Workers: 1, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	ctx, parent := remoteParent(t, "aaaaaaaaaaaaaaaabbbbbbbbbbbbbbbb", "cccccccccccccccc")
	requireOK(t, run(t, p, Job{ID: 1, Code: "pass"}))
	res, err := p.Run(ctx, Job{ID: 2, Code: "pass"})
	require.NoError(t, err)
	requireOK(t, res)
	// Host calls under the global no-op provider, with and without a
	// remote parent (its spans are not comparable with ==).
	host := func(ctx context.Context, call *Call) (any, error) { return 1, nil }
	for _, c := range []context.Context{ctx, context.Background()} {
		res, err = p.Run(c, Job{ID: 3, Code: "import pynox_host\nprint(pynox_host.f())", Functions: []string{"f"}, Host: host})
		require.NoError(t, err)
		requireOK(t, res)
		require.Equal(t, "1\n", res.Stdout)
	}
	recs := logRecords(t, logs)
	require.Len(t, recs, 4)
	require.NotContains(t, recs[0], "trace_id")
	require.Equal(t, parent.TraceID().String(), recs[1]["trace_id"])
	require.Equal(t, parent.TraceID().String(), recs[2]["trace_id"])
	require.NotContains(t, recs[3], "trace_id")
}

// Without a TracerProvider and with no global one installed, tracing a
// job (or step) and a host call costs a no-op Start and End: a few small
// allocations each (against a job's fork, confinement and pipes), no
// attribute built. AllocsPerRun counts, it does not time.
func TestTraceNoProviderCost(t *testing.T) {
	p := &Pool{tracer: tracerOf(nil)}
	ctx := context.Background()
	res := &Result{}
	jobAllocs := testing.AllocsPerRun(1000, func() {
		_, span := p.tracer.Start(ctx, SpanJob)
		require.False(t, span.IsRecording())
		endSpan(span, res, nil)
	})
	require.LessOrEqual(t, jobAllocs, 3.0)
	parent := trace.SpanFromContext(ctx)
	hctx := trace.ContextWithSpan(ctx, parent)
	h := p.traceHost(parent, "id", "", func(ctx context.Context, c worker.Call) worker.Reply { return worker.Reply{} })
	callAllocs := testing.AllocsPerRun(1000, func() { h(hctx, worker.Call{Function: "f"}) })
	require.LessOrEqual(t, callAllocs, 3.0)
	t.Logf("allocations without a provider: %v per job or step span, %v per host call span", jobAllocs, callAllocs)
}

// The library and its protocol package depend on the OpenTelemetry API
// only: the SDK, the exporters and gRPC are the command's.
func TestTraceLibraryDependsOnAPIOnly(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to list the dependencies: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", ".", "./jsonl").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/otel/exporters", "google.golang.org/grpc"} {
			require.False(t, strings.HasPrefix(dep, banned), "the library imports %s", dep)
		}
	}
	require.Contains(t, strings.Fields(string(out)), "go.opentelemetry.io/otel/trace")
}

// A port 0 in Config.ConfineSelfConnectTCP is a ConfigError naming the
// field.
func TestConfineSelfConnectTCPPortZero(t *testing.T) {
	_, err := New(Config{Python: testPython(), ConfineSelfConnectTCP: []uint16{4318, 0}})
	var ce *ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "ConfineSelfConnectTCP", ce.Key)
	require.Contains(t, ce.Error(), "1 to 65535")
}

// The pool's domain, rendered, lists the connect ports only where it
// denies TCP.
func TestSelfPolicyConnectPorts(t *testing.T) {
	p := &Pool{cfg: Config{ConfineSelfConnectTCP: []uint16{4318}}}
	pol := p.selfPolicy(7, nil, nil)
	require.Equal(t, []uint16{4318}, pol.Connect)
	require.Contains(t, pol.String(), "tcp port 4318 connect_tcp")
	p.cfg.Limits.AllowNetwork = true
	pol = p.selfPolicy(7, nil, nil)
	require.Empty(t, pol.Connect)
	require.NotContains(t, pol.String(), "connect_tcp")
}

// A Feed refused while a call waits for Resume ends its own step span as
// an error of kind Protocol, and the waiting step's span goes on to its
// result.
func TestTraceStepRefusedByProtocol(t *testing.T) {
	p, exp, _ := tracedPool(t)
	co, err := p.Checkout(context.Background(), Job{Functions: []string{"ask"}})
	require.NoError(t, err)
	defer co.Finish(context.Background())
	ev, err := co.Feed(context.Background(), Step{ID: "a", Code: "import pynox_host\npynox_host.ask()"})
	require.NoError(t, err)
	require.NotNil(t, ev.Call)
	_, err = co.Feed(context.Background(), Step{ID: "b", Code: "1"})
	require.ErrorIs(t, err, ErrProtocol)
	ev, err = co.Resume(context.Background(), ev.Call.ID, Return(1))
	require.NoError(t, err)
	requireOK(t, ev.Result)
	var a, b tracetest.SpanStub
	for _, s := range spansNamed(exp, SpanSessionStep) {
		switch spanAttrs(s)[AttrID].AsString() {
		case "a":
			a = s
		case "b":
			b = s
		}
	}
	require.Equal(t, "ok", spanAttrs(a)[AttrOutcome].AsString())
	require.Equal(t, "error", spanAttrs(b)[AttrOutcome].AsString())
	require.Equal(t, KindProtocol.String(), spanAttrs(b)[AttrErrorType].AsString())
	require.Equal(t, codes.Error, b.Status.Code)
}
