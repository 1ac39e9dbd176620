package main

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/propagation"
)

// runContext returns the context of a POST /v1/run request: r's, carrying
// the remote span context of its W3C "traceparent" and "tracestate"
// headers when they name one. The job's span is then a child of the
// caller's; a "traceparent" field in the body wins over the header. A
// malformed header is ignored, as HTTP receivers of Trace Context do (the
// body's field, the client's explicit choice, is refused instead).
func runContext(r *http.Request) context.Context {
	return propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
}
