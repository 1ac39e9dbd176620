package jsonl

import (
	"context"
	"time"

	"github.com/pynox/pynox"
)

// RunLine answers one request line of the pool protocol that is a plain
// one-shot job, and returns the result line (a JSON object and a
// newline). It serves callers that exchange one request for one result
// (`pynox serve`'s POST /v1/run) rather than a stream: a line longer than
// MaxLine, one that is not a valid request, and one that asks for what
// needs the stream (a session, host functions, a reply, stats, streamed
// output, an interrupt or a cancel, a dump or a restore) are answered
// with a RequestError that says which. The job runs under ctx: when ctx
// ends first, the job is ended and the result says so.
//
// RunLine returns an error, and no line, only for a Pool that
// [pynox.New] did not make.
func RunLine(ctx context.Context, p *pynox.Pool, line []byte) ([]byte, error) {
	if err := hooks.Usable(p); err != nil {
		return nil, err
	}
	if len(line) > MaxLine {
		return answerLine(refuse(p, &pynox.Job{}, requestErrorf("the request exceeds %d bytes", MaxLine)))
	}
	req, rerr := decodeRequest(line)
	if rerr != nil {
		return answerLine(refuse(p, &pynox.Job{ID: req.ID}, rerr))
	}
	if field := streamOnlyField(&req); field != "" {
		return answerLine(refuse(p, &pynox.Job{ID: req.ID}, requestErrorf(
			"%s: a single request (POST /v1/run) runs one job and takes no %s; use the pool protocol's stream (GET /v1/pool, or pynox pool) for it", field, field)))
	}
	accepted := time.Now()
	job := req.Job
	res, refill, err := hooks.Run(p, withParent(ctx, req.parent), job)
	if refill != nil {
		defer refill()
	}
	if err != nil {
		if ctx.Err() != nil {
			res = hooks.Cancelled(p, &job, accepted)
		} else {
			res = refuse(p, &job, requestErrorf("%v", err))
		}
	}
	return answerLine(res)
}

// streamOnlyField names the first field of req that only the stream
// protocol serves, or returns "".
func streamOnlyField(req *request) string {
	switch {
	case req.Session != "":
		return "session"
	case req.Close:
		return "close"
	case req.Functions != nil:
		return "functions"
	case req.Reply != nil:
		return "reply"
	case req.Stats:
		return "stats"
	case req.Stream:
		return "stream"
	case req.Interrupt:
		return "interrupt"
	case req.Cancel != nil:
		return "cancel"
	case req.Dump:
		return "dump"
	case req.Restore != nil:
		return "restore"
	}
	return ""
}

func answerLine(res *pynox.Result) ([]byte, error) {
	b, err := marshalLine(res)
	if err != nil {
		return marshalLine(map[string]any{"event": "error", "message": err.Error()})
	}
	return b, nil
}
