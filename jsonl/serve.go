package jsonl

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/pynox/pynox"
)

// refillDelay bounds how long a spare's replacement waits for the answer
// of the job it served to be written.
const refillDelay = 5 * time.Millisecond

// MaxLine is the longest request line `pynox pool` reads, newline
// excluded; a longer line is discarded with a RequestError.
const MaxLine = 1 << 20

// request is one line of the pool protocol: a Job, whose durations and
// sizes the line writes with units ("5s", "512m"), and the protocol's own
// fields.
type request struct {
	pynox.Job
	Timeout     pynox.Duration `json:"timeout,omitempty"`
	Memory      pynox.Size     `json:"memory,omitempty"`
	MaxFileSize pynox.Size     `json:"max_file_size,omitempty"`
	Stats       bool           `json:"stats,omitempty"`
	Session     string         `json:"session,omitempty"`
	Close       bool           `json:"close,omitempty"`
	Reply       *replyReq      `json:"reply,omitempty"`
	Stream      bool           `json:"stream,omitempty"`
	// Interrupt asks for the running step of Session to be interrupted;
	// Cancel names a one-shot job (by its id) to end. See interrupt.go.
	Interrupt bool            `json:"interrupt,omitempty"`
	Cancel    json.RawMessage `json:"cancel,omitempty"`
	// Functions is the line's "functions", names and function objects:
	// decodeRequest splits it into Job.Functions and Job.Tools.
	Functions functionDecls `json:"functions,omitempty"`
	// Dump asks a session for its dump (dump.go); Restore, on a request
	// that creates a session's process, is a dump for it to load.
	Dump    bool   `json:"dump,omitempty"`
	Restore []byte `json:"restore,omitempty"`
	// Traceparent and Tracestate, W3C Trace Context, name the remote
	// parent of a job's or step's span (trace.go); parent is what they
	// name, once checked.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
	parent      trace.SpanContext
	// badResult: a reply refused for its result only (decodeRequest),
	// whose call still gets the result, for the job to refuse.
	badResult bool
}

// Ready is the first line `pynox pool` writes.
type Ready struct {
	Event            string   `json:"event"` // "ready"
	Workers          int      `json:"workers"`
	Runtime          string   `json:"runtime"` // "pynox"
	PreloadedModules []string `json:"preloaded_modules"`
	PackageDirs      []string `json:"package_dirs"`
	Config           *string  `json:"config"`
	Profiles         []string `json:"profiles"`
	// PIDNamespace is true when every template runs as PID 1 of a PID
	// namespace of its own (see [pynox.Pool.PIDNamespace]).
	PIDNamespace bool `json:"pid_namespace"`
	// Cgroups is the per-job cgroup backend in use: "v2", "v1" or "none".
	Cgroups string `json:"cgroups"`
	// SelfConfinement is how the pool process confined itself.
	SelfConfinement pynox.SelfConfinement `json:"self_confinement"`
	// Mounts says which kinds of mounts requests may ask for, and where
	// the jobs' scratch directories are (see [pynox.Pool.Mounts]).
	Mounts pynox.MountSupport `json:"mounts"`
	// PinnedCPUs is, per worker, the CPU its template and every process
	// it forks are pinned to ([pynox.Pool.PinnedCPUs]); empty when the
	// pool pins nothing.
	PinnedCPUs []int `json:"pinned_cpus"`
}

type statsEvent struct {
	ID    any    `json:"id"`
	Event string `json:"event"`
	pynox.Stats
}

// Serve speaks the pool protocol: it writes the ready event, then reads
// one JSON request per line from r and writes one JSON result per line to
// w, in completion order. A request's keys must be exactly the protocol's
// field names (case included), each at most once per object; any other
// key is a RequestError that names it. At most twice the worker count of requests wait
// behind the running ones; beyond that Serve stops reading, and a blocked
// writer holds everything back, so nothing is buffered without bound.
// While host calls wait for replies it reads on (the replies may come
// after more job lines), holding up to 16 × workers more jobs and refusing
// job lines beyond that. Session requests queue per session
// (MaxPendingSteps); replies and stats need no room.
//
// Serve returns nil after EOF on r once every accepted job is answered.
// When ctx ends it stops reading, answers the jobs already accepted, and
// returns nil. It returns an error only when w fails, or at once, having
// written nothing, for a Pool that [pynox.New] did not make.
func Serve(ctx context.Context, p *pynox.Pool, r io.Reader, w io.Writer) error {
	return ServeWith(ctx, p, r, w, ServeOptions{})
}

// ServeWith is [Serve] with the bounds of o (see [ServeOptions]).
func ServeWith(ctx context.Context, p *pynox.Pool, r io.Reader, w io.Writer, o ServeOptions) error {
	if err := hooks.Usable(p); err != nil {
		return err
	}
	cfg := p.Config()
	out := newLineWriter(w)
	defer out.close()

	ready := Ready{Event: "ready", Workers: cfg.Workers, Runtime: "pynox",
		PreloadedModules: nonNilStrings(p.Preloaded()), PackageDirs: nonNilStrings(cfg.PackageDirs),
		Profiles: cfg.ProfileNames(), PIDNamespace: p.PIDNamespace(), Cgroups: p.Cgroups(),
		SelfConfinement: p.SelfConfinement(), Mounts: p.Mounts(), PinnedCPUs: p.PinnedCPUs()}
	if ready.PinnedCPUs == nil {
		ready.PinnedCPUs = []int{}
	}
	if cfg.Source != "" {
		src := cfg.Source
		ready.Config = &src
	}
	out.send(ready)

	// Running plus queued one-shot jobs; the reader blocks beyond this.
	// Session requests queue per session instead (MaxPendingSteps), and
	// replies and stats need no room.
	slots := make(chan struct{}, 3*cfg.Workers)
	var jobs sync.WaitGroup
	// Jobs run to completion even when ctx ends: accepted work is answered.
	jobCtx := context.WithoutCancel(ctx)
	srv := &server{p: p, cfg: cfg, out: out, ctx: jobCtx, calls: map[int64]chan replyReq{}, sessions: map[string]*namedSession{},
		callWake: make(chan struct{}, 1)}
	srv.limit = o

	lines := make(chan lineOrErr)
	stopRead := make(chan struct{})
	go readLines(r, lines, stopRead)
	defer close(stopRead)

	// runOne runs an accepted job and answers it.
	runOne := func(e *jobEntry) {
		job := e.job
		defer jobs.Done()
		defer func() { <-slots }()
		defer srv.answered()
		defer srv.cancels.remove(e)
		var jc *jobCalls
		if len(job.Functions) > 0 || len(job.Tools) > 0 {
			job.Host, jc = srv.hostFor()
		}
		res, refill, err := hooks.Run(p, e.ctx, job)
		// The next spare is asked for once the answer is written, or
		// soon anyway when the client is slow to read it.
		soon := time.AfterFunc(refillDelay, refill)
		if jc != nil {
			srv.endCalls(jc)
		}
		switch {
		case err != nil && e.cancelled.Load():
			res = hooks.Cancelled(p, &job, e.accepted)
		case err != nil:
			res = refuse(p, &job, requestErrorf("%v", err))
		}
		out.send(res)
		if soon.Stop() {
			refill()
		}
	}
	// Jobs run on long-lived runner goroutines (see runners): a runner
	// idle since its last job takes the next, and a new one starts only
	// when none is idle, so there are at most as many as jobs ever ran
	// at once (the slots bound them).
	run := &runners{work: make(chan *jobEntry), quit: make(chan struct{}), do: runOne}
	defer close(run.quit)
	start := func(e *jobEntry) {
		jobs.Add(1)
		run.start(e)
	}
	// Jobs read but not yet given a slot, in order (see below).
	var held []*jobEntry
	// parent is the remote parent span of the job dispatch returns.
	var parent trace.SpanContext
	// dispatch handles a request that needs no job slot, and returns the
	// one-shot job of a request that does.
	dispatch := func(l lineOrErr) (job *pynox.Job, eof bool) {
		if l.tooLong {
			if callID, ok := replyHeadCallID(l.head); ok {
				// A reply whose result is over MaxCallBytes: refused as
				// a reply, naming the call that still waits.
				res := refuse(p, &pynox.Job{}, requestErrorf("reply: the line exceeds %d bytes and was discarded (a result is at most %d bytes of JSON); call %d still waits for a reply", MaxLine, pynox.MaxCallBytes, callID))
				out.send(replyError{CallID: &callID, Exit: -1, Error: res.Error})
				return nil, false
			}
			out.send(refuse(p, &pynox.Job{}, requestErrorf("line exceeds %d bytes and was discarded", MaxLine)))
			return nil, false
		}
		if l.err != nil {
			return nil, true // a read error ends input like EOF
		}
		if len(bytes.Trim(l.line, jsonSpace)) == 0 {
			return nil, false
		}
		if req, ok := decodeReply(l.line); ok {
			srv.reply(req) // the common reply line, read quickly (reply_fast.go)
			return nil, false
		}
		req, err := decodeRequest(l.line)
		switch {
		case err != nil && req.badResult:
			srv.refuseResult(req, err)
		case err != nil && req.Reply != nil:
			res := refuse(p, &pynox.Job{ID: req.ID}, err)
			out.send(replyError{ID: req.ID, CallID: req.Reply.CallID, Exit: -1, Error: res.Error})
		case err != nil:
			out.send(refuse(p, &pynox.Job{ID: req.ID}, err))
		case req.Cancel != nil:
			held = srv.cancel(req, held)
		case req.Interrupt:
			srv.interrupt(req)
		case req.Reply != nil:
			srv.reply(req)
		case req.Stats:
			if extra := setFields(req); len(extra) > 1 || req.Session != "" || req.Close {
				out.send(refuse(p, &pynox.Job{ID: req.ID}, requestErrorf("a stats request takes no other fields than id (got %v)", slices.DeleteFunc(extra, func(f string) bool { return f == "stats" }))))
			} else {
				out.send(statsEvent{ID: req.ID, Event: "stats", Stats: p.Stats()})
			}
		case srv.overLimit(req):
			out.send(hooks.Refuse(p, &req.Job, req.Session, srv.limitError()))
		case req.Session != "":
			srv.session(req)
		case req.Close:
			out.send(refuse(p, &pynox.Job{ID: req.ID}, requestErrorf("close needs the session to close")))
		case req.Dump:
			out.send(refuse(p, &pynox.Job{ID: req.ID}, requestErrorf("dump needs the session to dump; a job without session has no state to keep")))
		case req.Restore != nil:
			out.send(refuse(p, &pynox.Job{ID: req.ID}, requestErrorf("restore needs a session: a dump is restored into a new session, not a job without session")))
		default:
			if req.Stream {
				req.Job.OnOutput = srv.outputFor(req.ID, "")
				req.Job.OnDisplay = srv.displayFor(req.ID, "")
			}
			parent = req.parent
			return &req.Job, false
		}
		return nil, false
	}

	// Jobs read but not yet given a slot, in order. Normally at most one
	// waits and reading stops there (backpressure). While host calls wait
	// for replies, reading goes on, because their replies may be queued
	// behind job lines: up to maxHeld jobs are held then, and a job line
	// beyond that is refused at once rather than left blocking the replies.
	maxHeld := 16 * cfg.Workers
	eof := false
	shutdown := func() {
		for _, e := range held {
			srv.cancels.remove(e)
			srv.answered()
			out.send(refuse(p, &e.job, requestErrorf("the pool is shutting down")))
		}
		held = nil
	}
loop:
	for {
		for len(held) > 0 {
			select {
			case slots <- struct{}{}:
				start(held[0])
				held = held[1:]
				continue
			default:
			}
			break
		}
		if eof && len(held) == 0 {
			break
		}
		linesCh := lines
		if eof || (len(held) > 0 && !srv.callsWaiting()) {
			linesCh = nil
		}
		var slotCh chan<- struct{}
		if len(held) > 0 {
			slotCh = slots
		}
		select {
		case <-ctx.Done():
			srv.endInput(errShutdown)
			shutdown()
			break loop
		case slotCh <- struct{}{}:
			start(held[0])
			held = held[1:]
		case <-srv.callWake:
			// A call started waiting for a reply: read on (next round).
		case l, ok := <-linesCh:
			var job *pynox.Job
			ended := !ok
			if ok {
				job, ended = dispatch(l)
			}
			if ended {
				// No reply can come any more: calls waiting for one, and
				// later ones, fail in their jobs at once instead of at
				// their timeouts.
				eof = true
				srv.endInput(errNoInput)
				continue
			}
			switch {
			case job == nil:
			case len(held) >= maxHeld:
				out.send(refuse(p, job, requestErrorf("%d requests are waiting for a worker while host calls wait for replies; read results and answer calls before sending more", len(held))))
			default:
				held = append(held, srv.cancels.add(withParent(jobCtx, parent), *job))
				srv.inFlight.Add(1)
			}
		}
	}
	srv.endInput(errNoInput)
	jobs.Wait()
	srv.finishSessions()
	return out.close()
}

// refuse answers a request that runs nothing, counting and logging it.
func refuse(p *pynox.Pool, j *pynox.Job, e *pynox.Error) *pynox.Result {
	return hooks.Refuse(p, j, "", e)
}

// decodeRequest parses one request line strictly: unknown fields, wrong
// types and trailing data are errors. The returned request carries the id
// whenever one could be read, so that even a refusal echoes it.
//
// Keys must match the protocol's field names exactly, and no object may
// repeat a key (see checkKeys): encoding/json alone would take "CODE" or
// "ſession" for a field and keep the last of two "code" keys.
// jsonSpace is JSON's whitespace (RFC 8259): a form feed or a Unicode
// space is not, so a line ending in one is refused as trailing data, and a
// line holding only one is refused rather than skipped as blank.
const jsonSpace = " \t\r\n"

func decodeRequest(line []byte) (request, *pynox.Error) {
	var req request
	var err error
	var tv topValues
	if ke := checkKeysTop(line, requestSchema, &tv); ke != nil {
		err = ke
	} else {
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		dec.UseNumber()
		err = dec.Decode(&req)
		if err == nil && len(bytes.Trim(line[dec.InputOffset():], jsonSpace)) > 0 {
			err = errors.New("trailing data after the JSON object")
		}
	}
	if err == nil && !bytes.HasPrefix(bytes.TrimLeft(line, jsonSpace), []byte("{")) {
		// null decodes into the request without an error.
		return request{}, requestErrorf("the request must be a JSON object, such as %s", requestExample)
	}
	if err == nil {
		if e := checkID(req.ID); e != nil {
			return request{}, e
		}
		if !tv.done {
			tv = decodedTopValues(line) // the key scan stopped short: cannot happen
		}
		if !utf8.Valid(line) || hasSurrogateEscape(line) {
			if id, e := checkUTF8(line, req.Reply != nil, &tv); e != nil {
				return request{Job: pynox.Job{ID: id}}, e
			}
		}
		if _, named := tv.get("session"); req.Session == "" && named {
			// Run as a one-shot job, it would lose its globals silently.
			return request{Job: pynox.Job{ID: req.ID}}, requestErrorf(`session: "" names no session; give the session a name of 1 to %d bytes, or leave session out for a one-shot job`, maxSessionName)
		}
		if e := parseTrace(&req); e != nil {
			return request{Job: pynox.Job{ID: req.ID}}, e
		}
		req.Job.Timeout = time.Duration(req.Timeout)
		req.Job.Memory = int64(req.Memory)
		req.Job.MaxFileSize = int64(req.MaxFileSize)
		if req.Functions != nil {
			req.Job.Functions, req.Job.Tools = req.Functions.split()
		}
		return req, nil
	}
	// Recover the id for the answer, if the line is an object with one
	// (and only one: a duplicated id is echoed as null).
	id := any(nil)
	ke, _ := err.(*keyError)
	dupID := ke != nil && ke.dup && len(ke.segs) == 0 && ke.key == "id"
	if !dupID {
		id = recoverID(line)
	}
	if ke != nil && ke.dup && len(ke.segs) >= 2 && ke.segs[0] == "reply" && ke.segs[1] == "result" {
		// A reply whose result repeats a key: refused, and its call
		// answered with the result, which the job's own check of
		// results refuses (HostError), as docs/protocol.md says.
		var lenient request
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.UseNumber()
		if dec.Decode(&lenient) == nil && lenient.Reply != nil && lenient.Reply.CallID != nil && lenient.Reply.Result != nil && lenient.Reply.Error == nil {
			return request{Job: pynox.Job{ID: id}, Reply: &replyReq{CallID: lenient.Reply.CallID, Result: lenient.Reply.Result}, badResult: true},
				requestErrorf("%s", describeJSONError(err, line))
		}
	}
	if r := malformedReply(line); r != nil {
		// Refused as a reply: the refusal names the call_id.
		return request{Job: pynox.Job{ID: id}, Reply: r}, requestErrorf("%s", describeJSONError(err, line))
	}
	return request{Job: pynox.Job{ID: id}}, requestErrorf("%s", describeJSONError(err, line))
}

// malformedReply returns the reply of a request line the strict decoding
// refused, when the line is a JSON object whose "reply" is an object:
// with its call_id when that is an integer (nil otherwise), for the
// refusal to name.
func malformedReply(line []byte) *replyReq {
	var top map[string]json.RawMessage
	if json.Unmarshal(line, &top) != nil {
		return nil
	}
	var r map[string]json.RawMessage
	if raw, ok := top["reply"]; !ok || json.Unmarshal(raw, &r) != nil || r == nil {
		return nil
	}
	var id int64
	if raw, ok := r["call_id"]; ok && string(raw) != "null" && json.Unmarshal(raw, &id) == nil {
		return &replyReq{CallID: &id}
	}
	return &replyReq{}
}

// decodedTopValues finds a request line's top-level values by decoding
// it, for when the key scan stopped before its end.
func decodedTopValues(line []byte) topValues {
	var probe map[string]json.RawMessage
	if json.Unmarshal(line, &probe) != nil {
		return topValues{done: true}
	}
	return topValues{id: probe["id"], session: probe["session"], cancel: probe["cancel"], done: true}
}

// recoverID reads the top-level "id" of a request line that could not be
// decoded, token by token, so that an id written before the line stops
// being JSON (a line cut short, a stray byte, nesting deeper than the
// decoder takes) is still echoed. It returns nil when there is none, when
// it is not a string or a number, when a second "id" follows, or when it
// may have been altered in decoding (bytes that are not UTF-8, a lone
// surrogate escape: see checkUTF8).
func recoverID(line []byte) any {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var id any
	found := false
	for {
		t, err := dec.Token()
		key, ok := t.(string)
		if err != nil || !ok {
			break // the object's end, or where the line stops being JSON
		}
		if key == "id" && found {
			return nil
		}
		// Each value whole, with the decoder's scanner: walking a large
		// value (inputs) token by token cost ~8 times the decoding that
		// failed, and ~60 bytes of garbage per token.
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			break
		}
		if key != "id" {
			continue
		}
		if raw[0] == '{' || raw[0] == '[' {
			return nil // an object or an array is no id
		}
		if raw[0] != '"' && !endsValue(line[dec.InputOffset():]) {
			// A number is one at every digit: "12" of a line cut short
			// after it may be the start of 123, the id of another
			// request. Only a "," or a "}" says it ended.
			return nil
		}
		if id = decodeID(raw); id == nil {
			return nil
		}
		found = true
	}
	return checkedRecoveredID(line, id)
}

// decodeID decodes the raw JSON value of an id (numbers as json.Number);
// nil when it is no valid id (checkID).
func decodeID(raw []byte) any {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var id any
	if d.Decode(&id) != nil || checkID(id) != nil {
		return nil
	}
	return id
}

// endsValue reports whether rest, what follows a value inside an object,
// begins (after JSON whitespace) with the "," or "}" that ends it.
func endsValue(rest []byte) bool {
	rest = bytes.TrimLeft(rest, jsonSpace)
	return len(rest) > 0 && (rest[0] == ',' || rest[0] == '}')
}

func checkedRecoveredID(line []byte, id any) any {
	if s, ok := id.(string); ok && strings.ContainsRune(s, utf8.RuneError) && (!utf8.Valid(line) || hasSurrogateEscape(line)) {
		return nil
	}
	return id
}

// checkUTF8 refuses a request line, valid JSON otherwise, that holds
// bytes which are not UTF-8. encoding/json turns each such byte of a
// string into U+FFFD, so the pool would see other strings than the
// client wrote: two ids that differ only there would be answered with
// one id (and cancelled together), two such session names would be one
// session, a path would name another file. JSON text is UTF-8 (RFC 8259),
// so the line is refused, at the column of the first such byte. A reply
// is held to this only in its id: its result's strings are the job's
// business (the job's call raises HostError, see worker.checkedReply),
// and its error text is only shown. The id is returned when its own
// bytes are UTF-8, so that the refusal can echo it.
func checkUTF8(line []byte, reply bool, tv *topValues) (any, *pynox.Error) {
	var id any
	if raw, ok := tv.get("id"); ok && utf8.Valid(raw) {
		id = decodeID(raw)
	}
	field := ""
	for _, k := range []string{"id", "session", "cancel"} {
		raw, ok := tv.get(k)
		if !ok {
			continue
		}
		if loneSurrogate(raw) {
			// Decoded to U+FFFD like a byte that is not UTF-8.
			if k == "id" {
				id = nil
			}
			return id, requestErrorf("%s: a \\u escape of a lone UTF-16 surrogate (\\ud800 to \\udfff without its pair) names no character; an id or a session name is compared and echoed as written", k)
		}
		if !utf8.Valid(raw) {
			field = k
			break
		}
	}
	if field == "" && (reply || utf8.Valid(line)) {
		return id, nil
	}
	col := 1 + utf8.RuneCount(line[:firstInvalidUTF8(line)])
	if field != "" {
		return id, requestErrorf("%s: not valid UTF-8 (the line's first such byte is at column %d); a request line is UTF-8 JSON, and an id or a session name is compared and echoed as written", field, col)
	}
	return id, requestErrorf("not valid UTF-8 at column %d: a request line is UTF-8 JSON (a byte that is not UTF-8 would reach the job as U+FFFD); write other bytes with \\u escapes, or base64", col)
}

// hasSurrogateEscape reports whether line may hold a \u escape of a
// UTF-16 surrogate (a quick test: loneSurrogate says for sure).
func hasSurrogateEscape(line []byte) bool {
	return bytes.Contains(line, []byte(`\ud`)) || bytes.Contains(line, []byte(`\uD`))
}

// loneSurrogate reports whether the JSON string raw holds a \u escape of
// a surrogate that is not the first half of a pair followed by its second
// half: encoding/json decodes it to U+FFFD.
func loneSurrogate(raw []byte) bool {
	hex := func(i int) (rune, bool) {
		if i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
		return rune(v), err == nil
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		r, ok := hex(i)
		if !ok {
			i++ // another escape: skip its character
			continue
		}
		switch {
		case r >= 0xd800 && r < 0xdc00:
			if r2, ok := hex(i + 6); ok && r2 >= 0xdc00 && r2 < 0xe000 {
				i += 11
				continue
			}
			return true
		case r >= 0xdc00 && r < 0xe000:
			return true
		}
		i += 5
	}
	return false
}

// firstInvalidUTF8 is the offset of the first byte of b that does not
// begin a valid UTF-8 character, or len(b).
func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// describeJSONError says what is wrong with a request line in terms of
// the protocol: where the line stops being JSON (the column, in
// characters), or which field has a value of the wrong kind and what it
// takes.
func describeJSONError(err error, line []byte) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		if te.Field != "" {
			field := strings.TrimPrefix(te.Field, "Job.")
			return fmt.Sprintf("%s: expected %s, got a JSON %s", field, jsonExpected(te.Type), te.Value)
		}
		return "the request must be a JSON object, such as " + requestExample
	case errors.As(err, &se) && strings.HasSuffix(se.Error(), "exceeded max depth"):
		return fmt.Sprintf("the JSON at column %d nests arrays and objects more than 10000 deep, more than a request takes (inputs take 256 levels)",
			jsonColumn(line, se.Offset))
	case errors.As(err, &se):
		return fmt.Sprintf("not valid JSON at column %d: %s; each request is one JSON object on one line, such as %s",
			jsonColumn(line, se.Offset), se.Error(), requestExample)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Sprintf("not valid JSON: the line ends at column %d inside the JSON value; each request is one JSON object on one line, such as %s",
			jsonColumn(line, int64(len(bytes.TrimRight(line, " \t\r\n")))+1), requestExample)
	}
	if msg, ok := describeBase64Error(err); ok {
		return msg
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "invalid duration ") || strings.HasPrefix(msg, "invalid size ") {
		if f := unitField(line); f != "" {
			return f + ": " + msg
		}
	}
	msg, _ = strings.CutPrefix(msg, "json: ")
	return msg
}

// requestExample is the smallest request, shown when a line is not one.
const requestExample = `{"id": 1, "code": "print(1)"}`

// jsonColumn turns the decoder's byte offset (the bytes read when the
// error was found, so the offending byte's 1-based position) into a
// 1-based column counted in characters.
func jsonColumn(line []byte, off int64) int {
	if off < 1 {
		return 1
	}
	if off > int64(len(line)) {
		off = int64(len(line)) + 1
	}
	return utf8.RuneCount(line[:off-1]) + 1
}

// jsonExpected names what a request field of Go type t takes, in JSON's
// words.
func jsonExpected(t reflect.Type) string {
	if u, ok := unitExpected(t); ok {
		return u
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.String {
			return "an array of strings"
		}
		if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 {
			// encoding/json's []byte: a string of standard base64.
			return "a string of standard base64 (RFC 4648, with padding)"
		}
		return "an array"
	case reflect.Map:
		if t.Elem().Kind() == reflect.String {
			return "an object whose values are strings"
		}
		return "an object"
	case reflect.Struct, reflect.Pointer:
		return "an object"
	}
	return "another kind of value"
}

// unitField finds which top-level duration or size field of a request
// line fails to parse, for a parse error that does not say.
func unitField(line []byte) string {
	var probe map[string]json.RawMessage
	if json.Unmarshal(line, &probe) != nil {
		return ""
	}
	for _, f := range []struct {
		name string
		v    any
	}{{"timeout", new(pynox.Duration)}, {"memory", new(pynox.Size)}, {"max_file_size", new(pynox.Size)}} {
		if raw, ok := probe[f.name]; ok && json.Unmarshal(raw, f.v) != nil {
			return f.name
		}
	}
	var mounts []map[string]json.RawMessage
	if raw, ok := probe["mounts"]; ok && json.Unmarshal(raw, &mounts) == nil {
		for i, m := range mounts {
			if raw, ok := m["write_bytes_limit"]; ok && json.Unmarshal(raw, new(pynox.Size)) != nil {
				return fmt.Sprintf("mounts[%d].write_bytes_limit", i)
			}
		}
	}
	return ""
}

type lineOrErr struct {
	line    []byte
	tooLong bool
	head    []byte // of a line tooLong: its first bytes (up to lineHeadLen)
	err     error
}

// lineHeadLen is how much of a line too long is kept, to tell a reply.
const lineHeadLen = 128

// lineHead returns the first lineHeadLen bytes of a followed by b.
func lineHead(a, b []byte) []byte {
	h := append([]byte(nil), a[:min(len(a), lineHeadLen)]...)
	return append(h, b[:min(len(b), lineHeadLen-len(h))]...)
}

// tooLongReplyHead matches the start of a reply line as clients write it:
// {"reply": {"call_id": N, ...
var tooLongReplyHead = regexp.MustCompile(`^[ \t]*\{[ \t]*"reply"[ \t]*:[ \t]*\{[ \t]*"call_id"[ \t]*:[ \t]*(0|[1-9][0-9]*)[ \t]*[,}]`)

// replyHeadCallID returns the call_id a line too long names when it
// begins as a reply.
func replyHeadCallID(head []byte) (int64, bool) {
	m := tooLongReplyHead.FindSubmatch(head)
	if m == nil {
		return 0, false
	}
	id, err := strconv.ParseInt(string(m[1]), 10, 64)
	return id, err == nil
}

// readLines splits r into lines of at most MaxLine bytes; a longer line is
// skipped to its end and reported as tooLong. It closes lines at EOF.
func readLines(r io.Reader, lines chan<- lineOrErr, stop <-chan struct{}) {
	defer close(lines)
	br := bufio.NewReaderSize(r, 64<<10)
	emit := func(l lineOrErr) bool {
		select {
		case lines <- l:
			return true
		case <-stop:
			return false
		}
	}
	for {
		var buf, head []byte
		tooLong := false
		for {
			chunk, err := br.ReadSlice('\n')
			if !tooLong {
				// MaxLine bytes and "\r\n" (or "\n"): the newline is not
				// the line's, whichever of the two ends it.
				if len(buf)+len(chunk) > MaxLine+2 {
					tooLong = true
					head = lineHead(buf, chunk)
					buf = nil
				} else {
					buf = append(buf, chunk...)
				}
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil {
				if tooLong {
					emit(lineOrErr{tooLong: true, head: head})
				} else if len(buf) > 0 {
					if len(buf) > MaxLine {
						emit(lineOrErr{tooLong: true, head: lineHead(buf, nil)})
					} else {
						emit(lineOrErr{line: buf})
					}
				}
				if err != io.EOF {
					emit(lineOrErr{err: err})
				}
				return
			}
			break
		}
		if tooLong {
			if !emit(lineOrErr{tooLong: true, head: head}) {
				return
			}
			continue
		}
		buf = bytes.TrimSuffix(buf, []byte("\n"))
		buf = bytes.TrimSuffix(buf, []byte("\r"))
		if len(buf) > MaxLine {
			if !emit(lineOrErr{tooLong: true, head: lineHead(buf, nil)}) {
				return
			}
			continue
		}
		if !emit(lineOrErr{line: buf}) {
			return
		}
	}
}

// lineWriter serialises JSON lines onto w from any goroutine; a writer
// that blocks blocks its callers.
type lineWriter struct {
	mu  sync.Mutex
	bw  *bufio.Writer
	err error
}

func newLineWriter(w io.Writer) *lineWriter {
	return &lineWriter{bw: bufio.NewWriterSize(w, 64<<10)}
}

func (lw *lineWriter) send(v any) {
	b, err := marshalLine(v)
	if err != nil {
		b, _ = marshalLine(map[string]any{"event": "error", "message": err.Error()})
	}
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.err != nil {
		return
	}
	if _, err := lw.bw.Write(b); err != nil {
		lw.err = err
		return
	}
	lw.err = lw.bw.Flush()
}

// marshalLine encodes v as one JSON line, leaving <, > and & as they are
// (results carry code and tracebacks, not HTML).
func marshalLine(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (lw *lineWriter) close() error {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.err == nil {
		lw.err = lw.bw.Flush()
	}
	return lw.err
}

// runners are the goroutines ServeWith runs one-shot jobs on. A
// goroutine per job started each on a fresh 8 KiB stack, which the job's
// path (the pool's run, the turn with the child, the result's encoding)
// grew twice or more, copying it each time: runtime.newstack and
// copystack were ~3.5% of `pynox pool`'s CPU at throughput in a profile
// (2 workers, trivial jobs). A runner keeps its grown stack from job to
// job. Handing a job to a parked runner readies it just as starting a
// goroutine does, so the hand-over adds no wake-up.
type runners struct {
	work chan *jobEntry // unbuffered: a send succeeds only into an idle runner
	quit chan struct{}  // closed when ServeWith returns: idle runners end
	do   func(*jobEntry)
}

// runnersStarted counts the runner goroutines ever started (for tests).
var runnersStarted atomic.Int64

// start runs e on an idle runner, or on a new one when none is idle.
func (r *runners) start(e *jobEntry) {
	select {
	case r.work <- e:
	default:
		runnersStarted.Add(1)
		go r.loop(e)
	}
}

// loop runs e, then each job handed to it, until quit is closed.
func (r *runners) loop(e *jobEntry) {
	for {
		r.do(e)
		select {
		case e = <-r.work:
		case <-r.quit:
			return
		}
	}
}
