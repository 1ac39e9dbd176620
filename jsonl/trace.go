package jsonl

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pynox/pynox"
)

// traceContext is the W3C Trace Context propagator that reads a request's
// "traceparent" and "tracestate".
var traceContext = propagation.TraceContext{}

// parseTrace checks a request's traceparent and tracestate and keeps the
// remote span context they name in req.parent. Unlike an HTTP receiver,
// which ignores a malformed traceparent header and starts a new trace,
// the pool refuses the request: the field is the client's own, given
// explicitly, and a trace silently lost is a bug the client should hear
// of, in the one answer the request gets.
func parseTrace(req *request) *pynox.Error {
	if req.Traceparent == "" {
		if req.Tracestate != "" {
			return requestErrorf("tracestate: it goes with traceparent, which is missing")
		}
		return nil
	}
	if req.Tracestate != "" {
		if _, err := trace.ParseTraceState(req.Tracestate); err != nil {
			return requestErrorf("tracestate: %q is not a W3C tracestate (comma-separated key=value list members): %v", req.Tracestate, err)
		}
	}
	carrier := propagation.MapCarrier{"traceparent": req.Traceparent}
	if req.Tracestate != "" {
		carrier["tracestate"] = req.Tracestate
	}
	sc := trace.SpanContextFromContext(traceContext.Extract(context.Background(), carrier))
	if !sc.IsValid() {
		return requestErrorf("traceparent: %q is not a W3C traceparent: expected version-traceid-parentid-flags in lowercase hex, such as \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\", with a trace id and a parent id that are not all zeros", req.Traceparent)
	}
	req.parent = sc
	return nil
}

// withParent returns ctx with the remote span context a request's
// traceparent named as its span, the parent of the job's or step's span;
// without one, ctx as it is.
func withParent(ctx context.Context, parent trace.SpanContext) context.Context {
	if !parent.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, parent)
}
