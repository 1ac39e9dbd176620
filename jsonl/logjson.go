package jsonl

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"sync"
)

// jobLogMessage is the message of the record the pool logs per finished
// job (see pynox.Config.Logger).
const jobLogMessage = "job"

// NewLogHandler returns a slog.Handler that writes the pool protocol's
// JSON log (`pynox pool --log=json`): one line per finished job with the
// fields ts_ms, event ("job"), id, session, step, exit, error, message,
// duration_ms, queue_us, network, truncated and cpu_ms, and trace_id when
// the job has a trace — identifiers, outcome and timing, never captured
// output. Other records (the pool's warnings)
// become lines with event "log", level and message.
func NewLogHandler(w io.Writer) slog.Handler {
	return &logHandler{w: w, mu: &sync.Mutex{}}
}

type logHandler struct {
	w     io.Writer
	mu    *sync.Mutex
	attrs []slog.Attr
}

// jobLine is one job record, in the protocol's field order.
type jobLine struct {
	TsMS       int64   `json:"ts_ms"`
	Event      string  `json:"event"`
	ID         any     `json:"id"`
	Session    any     `json:"session"`
	Step       any     `json:"step"`
	Exit       int64   `json:"exit"`
	Error      *string `json:"error"`
	Message    *string `json:"message"`
	DurationMS int64   `json:"duration_ms"`
	QueueUS    int64   `json:"queue_us"`
	Network    string  `json:"network"`
	Truncated  bool    `json:"truncated"`

	// CPUMS is the result's usage.cpu_ms (null without one).
	CPUMS *float64 `json:"cpu_ms"`
	// TraceID is the trace id of the job's span, absent without one.
	TraceID string `json:"trace_id,omitempty"`
}

// Enabled reports that every record is written.
func (h *logHandler) Enabled(context.Context, slog.Level) bool { return true }

// Handle writes one record as one JSON line.
func (h *logHandler) Handle(_ context.Context, r slog.Record) error {
	var v any
	if r.Message == jobLogMessage {
		l := jobLine{TsMS: r.Time.UnixMilli(), Event: "job"}
		r.Attrs(func(a slog.Attr) bool {
			val := a.Value.Resolve()
			switch a.Key {
			case "id":
				l.ID = val.Any()
			case "session":
				l.Session = val.Any()
			case "step":
				l.Step = val.Any()
			case "exit":
				l.Exit = val.Int64()
			case "error":
				if s := val.String(); s != "" {
					l.Error = &s
				}
			case "message":
				if s := val.String(); s != "" {
					l.Message = &s
				}
			case "duration_ms":
				l.DurationMS = val.Int64()
			case "queue_us":
				l.QueueUS = val.Int64()
			case "network":
				l.Network = val.String()
			case "truncated":
				l.Truncated = val.Bool()
			case "cpu_ms":
				f := val.Float64()
				l.CPUMS = &f
			case "trace_id":
				l.TraceID = val.String()
			}
			return true
		})
		v = l
	} else {
		m := map[string]any{"ts_ms": r.Time.UnixMilli(), "event": "log", "level": r.Level.String(), "message": r.Message}
		for _, a := range h.attrs {
			m[a.Key] = a.Value.Resolve().Any()
		}
		r.Attrs(func(a slog.Attr) bool {
			m[a.Key] = a.Value.Resolve().Any()
			return true
		})
		v = m
	}
	b, err := marshalLine(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"event": "log", "message": err.Error()})
		b = append(b, '\n')
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err = h.w.Write(b)
	return err
}

// WithAttrs returns a handler that adds attrs to non-job records.
func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logHandler{w: h.w, mu: h.mu, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

// WithGroup ignores groups: the log format is flat.
func (h *logHandler) WithGroup(string) slog.Handler { return h }
