package pynox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pynox/pynox/internal/worker"
)

// TracerName is the instrumentation scope name of the spans the pool
// makes (see Config.TracerProvider).
const TracerName = "github.com/pynox/pynox"

// Span names and attribute keys of the pool's traces. The attributes
// identify the work and its outcome; no span ever carries a job's code,
// inputs, arguments, output, exception messages or host-call arguments
// and results.
const (
	// SpanJob is the span of a one-shot job ([Pool.Run]).
	SpanJob = "pynox.job"
	// SpanSessionStep is the span of a session step, from [Checkout.Feed]
	// to the step's result, across the Resume calls in between.
	SpanSessionStep = "pynox.session.step"
	// SpanHostCall is the span of one host call, a child of its job's or
	// step's span, from the call to its answer.
	SpanHostCall = "pynox.host_call"

	// AttrID is the request's id (Job.ID or Step.ID), as text.
	AttrID = "pynox.id"
	// AttrSession is the session's name in the pool protocol; a Go
	// checkout has none, and its spans lack the attribute.
	AttrSession = "pynox.session"
	// AttrStep is the step's number in its session (Result.Step).
	AttrStep = "pynox.step"
	// AttrOutcome is "ok", "error" (the result has an error, or the call
	// failed without one, as a Feed refused with ErrProtocol: see
	// AttrErrorType) or "canceled" (the caller's ctx ended, or the pool
	// or the checkout was closed, before a result; for a host call, the
	// call's turn ended before its answer).
	AttrOutcome = "pynox.outcome"
	// AttrErrorType is the result's error type (ErrorInfo.Type, such as
	// "ValueError" or "TimeoutError"), the [Kind] of an error returned
	// instead of a result, or the exception type a host call's answer
	// raises. It is the OpenTelemetry semantic convention's error.type.
	AttrErrorType = "error.type"
	// AttrExitCode is the job's exit code (Result.Exit).
	AttrExitCode = "pynox.exit_code"
	// AttrFunction is the name of the host function called.
	AttrFunction = "pynox.function"
)

// tracerOf is the tracer of a pool configured with tp.
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(TracerName)
}

// idText renders a request id for a span.
func idText(id any) string {
	switch v := id.(type) {
	case nil:
		return ""
	case string:
		return v
	case json.Number:
		return v.String()
	default:
		return fmt.Sprint(v)
	}
}

// run is runJob (Pool.Run's work) inside the job's span: ctx's span, such
// as the remote parent a traceparent brought, is its parent, and the job's
// log record carries its trace id.
func (p *Pool) run(ctx context.Context, job Job) (*Result, func(), error) {
	if p.tracer == nil {
		return p.runJob(ctx, job) // a Pool New did not make: it refuses
	}
	ctx, span := p.tracer.Start(ctx, SpanJob)
	job.trace = span.SpanContext()
	if span.IsRecording() {
		span.SetAttributes(attribute.String(AttrID, idText(job.ID)))
	}
	res, refill, err := p.runJob(ctx, job)
	endSpan(span, res, err)
	return res, refill, err
}

// startStep starts a session step's span, a child of ctx's span, and
// returns ctx with it.
func (c *Checkout) startStep(ctx context.Context, id any) (context.Context, trace.Span) {
	ctx, span := c.pool.tracer.Start(ctx, SpanSessionStep)
	if span.IsRecording() {
		span.SetAttributes(attribute.String(AttrID, idText(id)))
		if c.name != "" {
			span.SetAttributes(attribute.String(AttrSession, c.name))
		}
	}
	return ctx, span
}

// stepAttr records a step's number in its session on its span.
func stepAttr(span trace.Span, step int) {
	if span.IsRecording() {
		span.SetAttributes(attribute.Int(AttrStep, step))
	}
}

// endSpan records a job's or step's outcome on its span and ends it: an
// error result or error sets the span's status to Error, described by the
// error type alone (its message may quote the job's data). Ending an
// ended span does nothing.
func endSpan(span trace.Span, res *Result, err error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	switch {
	case res != nil && res.Error == nil && err == nil:
		span.SetAttributes(attribute.String(AttrOutcome, "ok"), attribute.Int(AttrExitCode, res.Exit))
	case res != nil && res.Error != nil:
		span.SetAttributes(attribute.String(AttrOutcome, "error"), attribute.String(AttrErrorType, res.Error.Type),
			attribute.Int(AttrExitCode, res.Exit))
		span.SetStatus(codes.Error, res.Error.Type)
	case err != nil:
		t, outcome := errorType(err), "error"
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrClosed) || errors.Is(err, ErrFinished) {
			outcome = "canceled"
		}
		span.SetAttributes(attribute.String(AttrOutcome, outcome), attribute.String(AttrErrorType, t))
		span.SetStatus(codes.Error, t)
	}
	span.End()
}

// errorType names an error returned instead of a result: its Kind, or
// the context error's name.
func errorType(err error) string {
	var pe *Error
	switch {
	case errors.As(err, &pe):
		return pe.Kind.String()
	case errors.Is(err, context.DeadlineExceeded):
		return "DeadlineExceeded"
	case errors.Is(err, context.Canceled):
		return "Canceled"
	}
	return "error"
}

// traceHost wraps a job's or step's host callback in a span per call,
// child of parent (the job's or step's span); the callback's ctx carries
// the call's span, so that a HostFunc's own spans are its children.
func (p *Pool) traceHost(parent trace.Span, jobID any, session string, next worker.HostFunc) worker.HostFunc {
	if next == nil {
		return nil
	}
	return func(ctx context.Context, c worker.Call) worker.Reply {
		// (Spans are compared by their contexts: some span types are not
		// comparable with ==.)
		if !trace.SpanFromContext(ctx).SpanContext().Equal(parent.SpanContext()) {
			ctx = trace.ContextWithSpan(ctx, parent)
		}
		ctx, span := p.tracer.Start(ctx, SpanHostCall)
		r := next(ctx, c)
		if span.IsRecording() {
			span.SetAttributes(attribute.String(AttrID, idText(jobID)), attribute.String(AttrFunction, c.Function))
			if session != "" {
				span.SetAttributes(attribute.String(AttrSession, session))
			}
			switch {
			case r.Error != nil:
				t := r.ErrorType
				if t == "" {
					t = "HostError"
				}
				span.SetAttributes(attribute.String(AttrOutcome, "error"), attribute.String(AttrErrorType, t))
				span.SetStatus(codes.Error, t)
			case r.Result == nil:
				span.SetAttributes(attribute.String(AttrOutcome, "canceled"))
			default:
				span.SetAttributes(attribute.String(AttrOutcome, "ok"))
			}
		}
		span.End()
		return r
	}
}

// traceAttr is the trace_id of a job's log record, absent without one.
func traceAttr(job *Job) slog.Attr {
	if !job.trace.HasTraceID() {
		return slog.Attr{}
	}
	return slog.String("trace_id", job.trace.TraceID().String())
}
