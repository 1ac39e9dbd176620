package jsonl

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// injectTrace sets a request's "traceparent" and "tracestate" from the
// span ctx carries (W3C Trace Context), so that the server's span of the
// job or step is a child of the caller's. A request that already names a
// traceparent, and a ctx without a valid span context, are left as they
// are. Only the OpenTelemetry API is used: the caller's SDK, if any, made
// the span.
func injectTrace(ctx context.Context, req *request) {
	if req.Traceparent != "" || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	req.Traceparent = carrier.Get("traceparent")
	req.Tracestate = carrier.Get("tracestate")
}

// withSpanOf returns life carrying the span context of ctx (without its
// deadline or values otherwise), for work that outlives ctx but belongs
// to its trace.
func withSpanOf(life, ctx context.Context) context.Context {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return life
	}
	return trace.ContextWithSpanContext(life, sc)
}
