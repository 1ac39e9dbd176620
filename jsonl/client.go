package jsonl

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pynox/pynox"
)

// Client speaks the pool protocol to a server: a `pynox pool` process it
// started ([StartCmd]), or any pair of streams ([NewClient]). It is safe
// for concurrent use: requests go out as they are made, each with an id
// of the client's own, and every answer goes to the call waiting for its
// id, whatever order they come in. A client of [NewClient] reads the
// server's output on a goroutine of its own; a client of [StartCmd] has
// its waiting calls read it themselves, one at a time (see [StartCmd]). The host calls of
// a request are answered by its Host, each on a goroutine of its own, so
// that other answers keep flowing while a HostFunc runs; at most
// [MaxHostCalls] at once, a call beyond them is refused with an error.
// A client whose host functions never block may have them run on the
// goroutine that reads instead ([Client.SetInlineHost]).
//
// A line the client cannot use does not stop it: a call event it cannot
// decode is answered with an error (the job sees HostError), a result it
// cannot decode fails the call waiting for it, and any other line is
// skipped. Once the server's output ends, every waiting call and every
// later one fails with [ErrClientClosed] wrapped with the reason.
type Client struct {
	ready Ready
	in    *bufio.Reader
	cmd   *exec.Cmd // nil unless StartCmd started it

	wmu    sync.Mutex // serialises writes of whole lines
	w      io.Writer
	closer io.Closer // w's, closed by Close; may be nil

	mu      sync.Mutex
	seq     int64
	waiting map[string]*pending // by wire id
	stopped error               // why no answer can come any more
	closed  bool                // Close was called
	done    chan struct{}       // closed when the reader has ended
	exitErr error               // the started process's exit (after done, with cmd)

	calls chan struct{} // a slot per host call being answered (MaxHostCalls)

	// lazy: no goroutine reads the server's output for the client's
	// whole life (StartCmd): a call waiting for its answer reads it
	// itself, holding rtok's token, and hands on the lines it reads that
	// answer others. Handing each answer from a reader goroutine to the
	// waiting one cost a wake-up of another thread per request (the
	// runtime wakes an idle one whenever a goroutine is readied), which
	// on a 2-CPU machine took the CPU the server and its job needed.
	lazy bool
	rtok chan struct{} // holds the token when no one reads (lazy)
	// Calls whose ctx can end do not read (a read cannot be left when ctx
	// ends): while any waits, a goroutine reads for them (readFor).
	bgWant int  // such calls waiting (mu)
	bgRun  bool // readFor runs (mu)

	// inline: host calls run on the goroutine that read their call event
	// (SetInlineHost); inlineCall is the answer of the call the last line
	// read brought, for that goroutine to run once it has handed on its
	// turn to read (see takeInline). Only the reader of the moment
	// touches inlineCall.
	inline     atomic.Bool
	inlineCall func()
	inlineID   int64 // inlineCall's call_id
}

// pending is a request waiting for its answer.
type pending struct {
	answer chan []byte // the answer line, or closed when none will come
	// res is the answer decoded as a result, when dispatch could (set
	// before answer is sent), or nil.
	res    *pynox.Result
	failed string // why the answer is missing (set before answer is closed)
	host   pynox.HostFunc
	ctx    context.Context    // ends with the answer: a HostFunc's calls are moot then
	cancel context.CancelFunc // ends ctx
	output *pendingOutput     // the request's OnOutput, or nil
}

// ErrClientClosed is wrapped by the errors of calls made on a Client
// whose server's output has ended or that was closed.
var ErrClientClosed = errors.New("jsonl: the client's connection to the pool has ended")

// NewClient reads the server's ready event from r and returns a client
// that writes requests to w and reads answers from r. Close closes w when
// it is an io.Closer, which tells the server that no more requests come.
func NewClient(r io.Reader, w io.Writer) (*Client, error) {
	return newClient(r, w, false)
}

// newClient is NewClient; a lazy client starts no reader goroutine (see
// Client.lazy).
func newClient(r io.Reader, w io.Writer, lazy bool) (*Client, error) {
	c := &Client{lazy: lazy, in: bufio.NewReaderSize(r, 64<<10), w: w, waiting: map[string]*pending{}, done: make(chan struct{}),
		calls: make(chan struct{}, MaxHostCalls)}
	if cl, ok := w.(io.Closer); ok {
		c.closer = cl
	}
	line, err := c.in.ReadBytes('\n')
	if err != nil && len(line) == 0 {
		return nil, fmt.Errorf("jsonl: reading the ready event: %w", err)
	}
	if err := json.Unmarshal(line, &c.ready); err != nil || c.ready.Event != "ready" {
		return nil, fmt.Errorf("jsonl: the server's first line is not a ready event: %.200q", line)
	}
	if lazy {
		c.rtok = make(chan struct{}, 1)
		c.rtok <- struct{}{}
	} else {
		go c.read()
	}
	return c, nil
}

// StartCmd starts cmd — typically `pynox pool` with its flags — with pipes
// for its standard input and output, and returns a client of it once it
// has written its ready event. Its calls read the command's output
// themselves while they wait: a call whose ctx cannot end (such as
// context.Background()) reads until its own answer comes, handing on the
// answers of others, so that an answer reaches the call it is for
// without a hand-over between goroutines; while calls whose ctx can end
// wait, a goroutine of the client reads for them. Lines that come while
// no call waits are read by the next one (or by Close). cmd.Stderr, cmd.Dir and the rest are the
// caller's to set. When the command fails to start or to get ready,
// StartCmd kills it, waits for it and returns why. [Client.Close] ends
// the command's input and waits for it to exit.
func StartCmd(cmd *exec.Cmd) (*Client, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		stdin.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	r, w := rawPipes(stdout, stdin)
	c, err := newClient(r, w, true)
	if err != nil {
		_ = cmd.Process.Kill()
		if werr := cmd.Wait(); werr != nil {
			err = fmt.Errorf("%w (%s: %v)", err, cmd.Path, werr)
		}
		return nil, err
	}
	c.cmd = cmd
	return c, nil
}

// Ready returns the server's ready event.
func (c *Client) Ready() Ready { return c.ready }

// Run sends job as a request and returns its result. The result's ID is
// job.ID (on the wire the request carries an id of the client's own).
// job.Host answers the job's host calls; calls of a job without one are
// answered with an error. A request the server refuses is a result with
// a RequestError, as it is from [pynox.Pool.Run] (see [pynox.Result.Err]).
//
// job.OnOutput, when set, makes the request a streamed one ("stream":
// true): it is called with each output event, on the goroutine that reads
// the server's output (for a client of StartCmd, often Run's own caller),
// before the result is returned, and never after Run returns.
// While it runs the client reads nothing more, so a slow OnOutput holds up
// the answers of every request, and in turn the server and the job; an
// OnOutput that waits for another answer of the same Client (a Run inside
// it) waits forever.
//
// When ctx carries an OpenTelemetry span, the request carries its W3C
// traceparent and tracestate: the server's span of the job is a child of
// the caller's (job runs and session steps alike).
//
// Run returns an error when no result can come: the connection ended, a
// write failed, or ctx ended first (ctx.Err(); the job is then cancelled
// on the server with a "cancel" request, and its result is dropped).
func (c *Client) Run(ctx context.Context, job pynox.Job) (*pynox.Result, error) {
	req := wireRequest(job)
	res, err := c.result(ctx, &req, job.Host)
	if res != nil {
		res.ID = job.ID
	}
	return res, err
}

// wireRequest is job as a request line carries it.
func wireRequest(job pynox.Job) request {
	req := request{Job: job, Timeout: pynox.Duration(job.Timeout), Memory: pynox.Size(job.Memory),
		MaxFileSize: pynox.Size(job.MaxFileSize)}
	req.Job.Host = nil
	req.Functions = declsOf(job.Functions, job.Tools)
	return req
}

// result sends req and decodes its answer as a result.
func (c *Client) result(ctx context.Context, req *request, host pynox.HostFunc) (*pynox.Result, error) {
	injectTrace(ctx, req)
	line, decoded, err := c.roundTripDecoded(ctx, req, host)
	if err != nil {
		return nil, err
	}
	if decoded != nil {
		return decoded, nil
	}
	var res pynox.Result
	if err := json.Unmarshal(line, &res); err != nil {
		return nil, fmt.Errorf("jsonl: an unreadable result: %v: %.200q", err, line)
	}
	return &res, nil
}

// roundTrip sends req with an id of the client's own and waits for the
// line that answers it.
func (c *Client) roundTrip(ctx context.Context, req *request, host pynox.HostFunc) ([]byte, error) {
	line, _, err := c.roundTripDecoded(ctx, req, host)
	return line, err
}

// roundTripDecoded is roundTrip, and returns the answer decoded as a
// result too when the line that brought it was (see dispatch); the result's
// ID is then unset.
func (c *Client) roundTripDecoded(ctx context.Context, req *request, host pynox.HostFunc) ([]byte, *pynox.Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	if err := c.stoppedErr(); err != nil {
		c.mu.Unlock()
		return nil, nil, err
	}
	c.seq++
	id := "go-" + strconv.FormatInt(c.seq, 10)
	p := &pending{answer: make(chan []byte, 1), host: host}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	if req.Job.OnOutput != nil || req.Job.OnDisplay != nil {
		p.output = &pendingOutput{fn: req.Job.OnOutput, display: req.Job.OnDisplay}
		req.Stream = true
	}
	c.waiting[id] = p
	c.mu.Unlock()
	defer p.cancel()
	forget := func() {
		c.mu.Lock()
		delete(c.waiting, id)
		c.mu.Unlock()
	}
	req.ID = id
	b, err := marshalLine(req)
	if err == nil {
		err = c.writeLine(b)
	}
	if err != nil {
		forget()
		return nil, nil, err
	}
	line, ok, answered := c.await(ctx, p)
	switch {
	case answered && !ok:
		return nil, nil, fmt.Errorf("%w: %s", ErrClientClosed, p.failed)
	case answered:
		return line, p.res, nil
	default:
		forget()
		p.output.end()
		if req.Session == "" && (req.Code != "" || req.Script != "") {
			// A one-shot job nobody waits for is ended on the server.
			c.cancel(id)
		}
		return nil, nil, ctx.Err()
	}
}

// await waits for p's answer (answered, with ok false when none will
// come) or for the end of ctx (answered false). A lazy client's call
// reads the server's output itself while no one else does, when its ctx
// cannot end; otherwise it has readFor read for it.
func (c *Client) await(ctx context.Context, p *pending) (line []byte, ok, answered bool) {
	if c.lazy && ctx.Done() == nil {
		for {
			select {
			case line, ok := <-p.answer:
				return line, ok, true
			case <-c.rtok:
				// The answer may have come with the line the last reader
				// read: take it rather than wait for another line.
				select {
				case line, ok := <-p.answer:
					c.rtok <- struct{}{}
					return line, ok, true
				default:
				}
				more := c.readLine()
				answer := c.takeInline()
				if more {
					c.rtok <- struct{}{}
				}
				// At the output's end the token is kept: no one reads
				// any more, and every waiting call's answer is closed.
				runInline(answer)
			}
		}
	}
	if c.lazy {
		c.wantReader(1)
		defer c.wantReader(-1)
	}
	select {
	case line, ok := <-p.answer:
		return line, ok, true
	case <-ctx.Done():
		return nil, false, false
	}
}

// wantReader counts a lazy client's calls that wait without reading
// (their ctx can end), and starts readFor when one begins to wait.
func (c *Client) wantReader(d int) {
	c.mu.Lock()
	c.bgWant += d
	start := c.bgWant > 0 && !c.bgRun && c.stopped == nil
	if start {
		c.bgRun = true
	}
	c.mu.Unlock()
	if start {
		go c.readFor()
	}
}

// readFor reads a lazy client's output while calls that cannot read
// themselves wait, taking its turn with the calls that read.
func (c *Client) readFor() {
	for {
		c.mu.Lock()
		if c.bgWant == 0 || c.stopped != nil {
			c.bgRun = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		select {
		case <-c.rtok:
		case <-c.done:
			continue // stopped: the next round returns
		}
		more := c.readLine()
		answer, id := c.takeInline(), c.inlineID
		if more {
			c.rtok <- struct{}{}
		}
		if answer != nil {
			// Not here: a call that waits while this goroutine ran it
			// would have no one to read for it.
			c.spawnCall(id, answer)
		}
	}
}

// cancel asks the server to end the one-shot job of wire id id, without
// waiting: its answers (the cancel event, the job's CancelledError) are
// for nobody and skipped.
func (c *Client) cancel(id string) {
	b, err := marshalLine(struct {
		Cancel string `json:"cancel"`
	}{id})
	if err == nil {
		go func() { _ = c.writeLine(b) }()
	}
}

// stoppedErr says why no request can be made any more; c.mu is held.
func (c *Client) stoppedErr() error {
	switch {
	case c.closed:
		return fmt.Errorf("%w: Close was called", ErrClientClosed)
	case c.stopped != nil:
		return fmt.Errorf("%w: %v", ErrClientClosed, c.stopped)
	}
	return nil
}

// writeLine writes one whole line.
func (c *Client) writeLine(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.w.Write(b); err != nil {
		return fmt.Errorf("%w: writing a request: %v", ErrClientClosed, err)
	}
	return nil
}

// Stats asks the server for its counters.
func (c *Client) Stats(ctx context.Context) (pynox.Stats, error) {
	line, err := c.roundTrip(ctx, &request{Stats: true}, nil)
	if err != nil {
		return pynox.Stats{}, err
	}
	var ev struct {
		Event string           `json:"event"`
		Error *pynox.ErrorInfo `json:"error"`
		pynox.Stats
	}
	if err := json.Unmarshal(line, &ev); err != nil {
		return pynox.Stats{}, fmt.Errorf("jsonl: an unreadable stats answer: %v: %.200q", err, line)
	}
	if ev.Event != "stats" {
		if ev.Error != nil {
			return pynox.Stats{}, &pynox.Error{Kind: pynox.KindRequest, Type: ev.Error.Type, Message: ev.Error.Message}
		}
		return pynox.Stats{}, fmt.Errorf("jsonl: a stats request answered %.200q", line)
	}
	return ev.Stats, nil
}

// Close tells the server that no more requests come (it closes the
// writer, when it can be closed), waits until the server's output ends —
// it answers the requests already sent first — and, for a client of
// [StartCmd], waits for the command to exit, killing it if it has not
// within 10 seconds of its output's end. It returns the command's exit
// error, if any. Calls waiting for answers when the output ends fail with
// ErrClientClosed. Close is safe to call more than once.
func (c *Client) Close() error {
	c.mu.Lock()
	first := !c.closed
	c.closed = true
	c.mu.Unlock()
	if first && c.closer != nil {
		c.wmu.Lock()
		c.closer.Close()
		c.wmu.Unlock()
	}
	if c.lazy {
		// No goroutine may be reading: read the rest of the output here.
		for {
			select {
			case <-c.done:
				return c.exitErr
			case <-c.rtok:
				more := c.readLine()
				answer := c.takeInline()
				if more {
					c.rtok <- struct{}{}
				}
				runInline(answer)
			}
		}
	}
	<-c.done
	return c.exitErr
}

// Session returns a handle on the named session of the protocol, created
// on the server by its first step with job's permissions, limits,
// environment and host functions (job.Code, Script, Name, Args and
// Inputs are not used: each step brings its own). job.Host answers the calls of
// steps that bring no Host of their own.
func (c *Client) Session(name string, job pynox.Job) *Session {
	return &Session{c: c, name: name, job: job, fresh: true}
}

// Session is one named session of the pool protocol, seen from a
// [Client]: the first step creates it on the server with the session
// job's permissions; later steps bring only code. When a step ends the
// session's process (Result.SessionEnded), the next step creates a new
// one with the same permissions. Its methods are safe for concurrent use
// and run one at a time, in the order they are called.
//
// The server closes a session idle for its session_idle; the next step
// then starts it afresh, without the session job's permissions (it brings
// only code), so a client that pauses longer should Close it and start
// another.
type Session struct {
	c    *Client
	name string
	job  pynox.Job

	mu    sync.Mutex
	fresh bool // the next step creates the session's process: it carries the permissions
	open  bool // the server holds the session (a step was answered without a RequestError)

	restore []byte // a dump the next fresh step carries (client_dump.go)
}

// Name returns the session's name.
func (s *Session) Name() string { return s.name }

// Run runs one step in the session and returns its result (its ID is
// step.ID). Errors are those of [Client.Run]. step.OnOutput (or else the
// session job's OnOutput) streams the step's output, as job.OnOutput does
// for Client.Run.
func (s *Session) Run(ctx context.Context, step pynox.Step) (*pynox.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var req request
	if s.fresh {
		req = wireRequest(s.job)
		req.Script = ""
		req.Restore = s.restore
	}
	req.Session = s.name
	req.Code, req.Name, req.Args = step.Code, step.Name, step.Args
	req.Job.OnOutput = step.OnOutput
	if req.Job.OnOutput == nil {
		req.Job.OnOutput = s.job.OnOutput
	}
	req.Job.OnDisplay = step.OnDisplay
	if req.Job.OnDisplay == nil {
		req.Job.OnDisplay = s.job.OnDisplay
	}
	req.Inputs = step.Inputs
	req.Collect = step.Collect
	if step.Timeout != 0 {
		req.Timeout = pynox.Duration(step.Timeout)
	}
	if step.MaxOutput != 0 {
		req.MaxOutput = step.MaxOutput
	}
	host := step.Host
	if host == nil {
		host = s.job.Host
	}
	res, err := s.c.result(ctx, &req, host)
	if err != nil {
		return nil, err
	}
	res.ID = step.ID
	if res.Error == nil || res.Error.Type != pynox.KindRequest.String() {
		s.open = true
		s.fresh = res.SessionEnded
		s.restore = nil
	}
	return res, nil
}

// Close closes the session on the server, ending its process. A session
// that never ran a step has nothing to close. The next Run creates the
// session again.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.open {
		return nil
	}
	line, err := s.c.roundTrip(ctx, &request{Session: s.name, Close: true}, nil)
	if err != nil {
		return err
	}
	var ev struct {
		Closed bool             `json:"closed"`
		Error  *pynox.ErrorInfo `json:"error"`
	}
	if err := json.Unmarshal(line, &ev); err != nil {
		return fmt.Errorf("jsonl: an unreadable close answer: %v: %.200q", err, line)
	}
	s.open, s.fresh = false, true
	if !ev.Closed {
		if ev.Error != nil {
			return &pynox.Error{Kind: pynox.KindRequest, Type: ev.Error.Type, Message: ev.Error.Message}
		}
		return fmt.Errorf("jsonl: a close request answered %.200q", line)
	}
	return nil
}

// The prefixes of an unreadable line that still say what it answers,
// as the server writes them (its field order).
var (
	callPrefix   = regexp.MustCompile(`^\{"event":"call","id":(?:"(?:[^"\\]|\\.)*"|[-0-9.eE+]+|null),(?:"session":"(?:[^"\\]|\\.)*",)?"call_id":(\d+),`)
	resultPrefix = regexp.MustCompile(`^\{"id":("(?:[^"\\]|\\.)*"|-?\d+),`)
)

// read hands each line of the server's output to its waiting call until
// the output ends, then fails every call still waiting.
func (c *Client) read() {
	for {
		more := c.readLine()
		runInline(c.takeInline())
		if !more {
			return
		}
	}
}

// readLine reads one line of the server's output and hands it on; at the
// output's end it fails every waiting call and every later one, and
// returns false.
func (c *Client) readLine() bool {
	line, err := c.in.ReadBytes('\n')
	if len(bytes.TrimSpace(line)) > 0 {
		c.dispatch(line)
	}
	if err == nil {
		return true
	}
	why := errors.New("the pool's output ended")
	if err != io.EOF {
		why = fmt.Errorf("reading the pool's output: %w", err)
	}
	c.stop(why)
	return false
}

// stop ends the client once its output has ended.
func (c *Client) stop(why error) {
	if c.cmd != nil {
		c.endCmd()
	}
	c.mu.Lock()
	if c.stopped == nil {
		c.stopped = why
		if c.exitErr != nil {
			c.stopped = fmt.Errorf("%v (%v)", why, c.exitErr)
		}
	}
	msg := c.stopped.Error()
	waiting := c.waiting
	c.waiting = map[string]*pending{}
	c.mu.Unlock()
	for _, p := range waiting {
		p.failed = msg
		close(p.answer)
		p.cancel()
	}
	close(c.done)
}

// endCmd waits for the started command once its output has ended.
func (c *Client) endCmd() {
	exited := make(chan error, 1)
	go func() { exited <- c.cmd.Wait() }()
	select {
	case err := <-exited:
		c.exitErr = err
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		c.exitErr = <-exited
	}
}

// head is what the reader needs of a line to route it.
type head struct {
	ID     json.RawMessage `json:"id"`
	Event  string          `json:"event"`
	CallID *int64          `json:"call_id"`
}

// resultLine is a line decoded at once as its head and as a result: an
// answer's line is decoded once, not once to route it and once more by
// the call it answers.
type resultLine struct {
	ID     json.RawMessage `json:"id"`
	Event  string          `json:"event"`
	CallID *int64          `json:"call_id"`
	pynox.Result
}

// eventKey is in every line that carries an event: only lines without it
// are decoded as results first.
var eventKey = []byte(`"event"`)

// dispatch routes one line of the server's output.
func (c *Client) dispatch(line []byte) {
	if !bytes.Contains(line, eventKey) {
		var rl resultLine
		if json.Unmarshal(line, &rl) == nil && rl.Event == "" && rl.CallID == nil {
			c.deliverDecoded(rl.ID, line, &rl.Result)
			return
		}
	}
	if bytes.HasPrefix(line, callStart) && c.dispatchCall(line) {
		return
	}
	var h head
	if err := json.Unmarshal(line, &h); err != nil {
		c.unreadable(line, err)
		return
	}
	switch {
	case h.Event == "call":
		var call pynox.Call
		if err := json.Unmarshal(line, &call); err != nil || h.CallID == nil {
			c.unreadable(line, err)
			return
		}
		p := c.lookup(h.ID)
		c.startCall(call.ID, func() { c.answerCall(p, &call) })
	case h.Event == "output":
		// On the reader, before the lines that follow: the request's
		// result comes after its output.
		if p := c.lookup(h.ID); p != nil {
			p.output.pass(line)
		}
	case h.Event == "display":
		if p := c.lookup(h.ID); p != nil {
			p.output.passDisplay(line)
		}
	case h.Event == "ready":
		// Only the first line is a ready event; a later one is skipped.
	case h.CallID != nil && (len(h.ID) == 0 || string(h.ID) == "null"):
		// The server refused a reply (one sent after its job ended, say):
		// there is no call to tell.
	default:
		c.deliver(h.ID, line, "")
	}
}

// callStart begins every call event the server writes (see callPrefix).
var callStart = []byte(`{"event":"call",`)

// callLine is a call event decoded at once as its head and as the call:
// a call's line is decoded once, not once to route it and once more as a
// pynox.Call (JobID, decoded from ID, aside).
type callLine struct {
	ID       json.RawMessage `json:"id"`
	Event    string          `json:"event"`
	CallID   *int64          `json:"call_id"`
	Session  string          `json:"session"`
	Function string          `json:"function"`
	Args     json.RawMessage `json:"args"`
	Kwargs   json.RawMessage `json:"kwargs"`
}

// dispatchCall routes a line that begins as a call event, decoding it
// once, and reports whether it did. Any other line (one that does not
// decode so, turns out to be another event, or lacks a call_id) is left
// to dispatch's general path, which handles it as before.
func (c *Client) dispatchCall(line []byte) bool {
	var cl callLine
	if err := json.Unmarshal(line, &cl); err != nil || cl.Event != "call" || cl.CallID == nil {
		return false
	}
	call := pynox.Call{Session: cl.Session, ID: *cl.CallID, Function: cl.Function, Args: cl.Args, Kwargs: cl.Kwargs}
	if len(cl.ID) > 0 {
		_ = json.Unmarshal(cl.ID, &call.JobID) // valid JSON: the line decoded
	}
	var p *pending
	if k, ok := call.JobID.(string); ok {
		c.mu.Lock()
		p = c.waiting[k]
		c.mu.Unlock()
	}
	c.startCall(call.ID, func() { c.answerCall(p, &call) })
	return true
}

// key is the waiting map's key of a raw id: the text of a string id.
func key(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// lookup returns the request an id names, or nil.
func (c *Client) lookup(raw json.RawMessage) *pending {
	k, ok := key(raw)
	if !ok {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting[k]
}

// deliver hands an answer (line, or the failure why) to the request raw
// names; it reports false when none waits for it.
func (c *Client) deliver(raw json.RawMessage, line []byte, why string) bool {
	return c.deliverAs(raw, line, nil, why)
}

// deliverDecoded hands an answer to the request raw names with the line
// decoded as a result (its ID unset).
func (c *Client) deliverDecoded(raw json.RawMessage, line []byte, res *pynox.Result) bool {
	return c.deliverAs(raw, line, res, "")
}

// deliverAs is deliver, with the answer's decoded result when there is one.
func (c *Client) deliverAs(raw json.RawMessage, line []byte, res *pynox.Result, why string) bool {
	k, ok := key(raw)
	if !ok {
		return false
	}
	c.mu.Lock()
	p := c.waiting[k]
	delete(c.waiting, k)
	c.mu.Unlock()
	if p == nil {
		return false
	}
	p.cancel()
	if why != "" {
		p.failed = why
		close(p.answer)
	} else {
		p.res = res
		p.answer <- line
	}
	return true
}

// unreadable handles a line that is not JSON the client can decode: a
// call it starts is answered with an error, a result fails the request it
// answers, anything else is skipped.
func (c *Client) unreadable(line []byte, err error) {
	what := "not JSON"
	if err != nil {
		what = err.Error()
	}
	if m := callPrefix.FindSubmatch(line); m != nil {
		if id, perr := strconv.ParseInt(string(m[1]), 10, 64); perr == nil {
			// Off the reader, which must not wait for the server to read.
			c.spawnCall(id, func() { c.reply(id, nil, "the client could not read the call ("+what+")") })
		}
		return
	}
	if m := resultPrefix.FindSubmatch(line); m != nil {
		c.deliver(m[1], nil, "an unreadable answer from the pool ("+what+")")
	}
}

// answerCall answers a host call with the HostFunc of the request that
// made it.
func (c *Client) answerCall(p *pending, call *pynox.Call) {
	if p == nil || p.host == nil {
		c.reply(call.ID, nil, fmt.Sprintf("the client has no host function for request %v", call.JobID))
		return
	}
	v, err := callHost(p.ctx, p.host, call)
	if he, ok := errors.AsType[*pynox.HostError](err); ok && pynox.IsHostErrorType(he.Type) {
		c.replyTyped(call.ID, he.Type, he.Message)
		return
	}
	if err != nil {
		c.reply(call.ID, nil, err.Error())
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		c.reply(call.ID, nil, "the host's result could not be passed on: "+err.Error())
		return
	}
	c.replyResult(call.ID, b)
}

// replyResult writes the reply to a host call with its result, the JSON
// json.Marshal made (valid and compact). The line is put together
// directly: encoding it as reply does would validate and compact the
// result once more, the same bytes.
func (c *Client) replyResult(callID int64, result []byte) {
	if len(result) == 0 {
		c.reply(callID, result, "")
		return
	}
	if len(result) > pynox.MaxCallBytes {
		// The pool refuses it and leaves the call waiting: fail it now.
		c.reply(callID, nil, fmt.Sprintf("the host's result is %d bytes of JSON; the limit is %d", len(result), pynox.MaxCallBytes))
		return
	}
	b := make([]byte, 0, len(result)+40)
	b = append(b, `{"reply":{"call_id":`...)
	b = strconv.AppendInt(b, callID, 10)
	b = append(b, `,"result":`...)
	b = append(b, result...)
	b = append(b, "}}\n"...)
	c.writeReply(callID, b)
}

// writeReply writes b, the reply line to call callID. A line longer than
// MaxLine (a result near MaxCallBytes, whose reply envelope takes it past
// the line bound, or a long error text) the pool would discard, answering
// it with no call_id and leaving the call waiting until its job's
// timeout: the call gets an error reply that says why instead.
func (c *Client) writeReply(callID int64, b []byte) {
	if n := len(bytes.TrimSuffix(b, []byte("\n"))); n > MaxLine {
		msg := fmt.Sprintf("the host's reply is %d bytes of JSON; pynox pool reads request lines of at most %d", n, MaxLine)
		var err error
		if b, err = marshalLine(map[string]any{"reply": map[string]any{"call_id": callID, "error": msg}}); err != nil {
			return
		}
	}
	_ = c.writeLine(b) // a failed write fails the request's own wait
}

// callHost runs a HostFunc, turning a panic into an error the job sees
// without its details, as [pynox.HostFunc] says of the library.
func callHost(ctx context.Context, host pynox.HostFunc, call *pynox.Call) (v any, err error) {
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, errors.New("the host function failed")
		}
	}()
	return host(ctx, call)
}

// reply writes the reply to a host call: a result, or an error message.
func (c *Client) reply(callID int64, result json.RawMessage, errMsg string) {
	// Not replyReq, whose "result" is never omitted: a reply carries
	// exactly one of result and error.
	type reply struct {
		CallID int64           `json:"call_id"`
		Result json.RawMessage `json:"result,omitempty"`
		Error  *string         `json:"error,omitempty"`
	}
	r := reply{CallID: callID}
	if errMsg != "" {
		r.Error = &errMsg
	} else {
		r.Result = result
	}
	b, err := marshalLine(struct {
		Reply reply `json:"reply"`
	}{r})
	if err != nil {
		return
	}
	c.writeReply(callID, b)
}

// pendingOutput passes a streamed request's output events to its
// OnOutput until the request is forgotten.
type pendingOutput struct {
	mu    sync.Mutex // held during a call, and by end
	fn    pynox.OutputFunc
	ended bool
	// display is the request's OnDisplay, or nil.
	display pynox.DisplayFunc
}

// passDisplay calls the OnDisplay with one display event; a panic in it
// stops the request's later calls, as in pass.
func (o *pendingOutput) passDisplay(line []byte) {
	if o == nil || o.display == nil {
		return
	}
	var ev pynox.Output
	if json.Unmarshal(line, &ev) != nil {
		return
	}
	o.call(func() { o.display(ev) })
}

// pass calls the OnOutput with one output event; a panic in it stops
// the request's later calls, as the pool's OnOutput does.
func (o *pendingOutput) pass(line []byte) {
	if o == nil || o.fn == nil {
		return
	}
	var ev struct {
		Stream string `json:"stream"`
		Text   string `json:"text"`
	}
	if json.Unmarshal(line, &ev) != nil {
		return
	}
	var stream pynox.Stream
	switch ev.Stream {
	case "stdout":
		stream = pynox.Stdout
	case "stderr":
		stream = pynox.Stderr
	default:
		return
	}
	o.call(func() { o.fn(stream, ev.Text) })
}

// call runs f unless the request is forgotten; a panic in f stops the
// request's later calls.
func (o *pendingOutput) call(f func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ended {
		return
	}
	defer func() {
		if recover() != nil {
			o.ended = true
		}
	}()
	f()
}

// end waits for a call in progress and stops later ones.
func (o *pendingOutput) end() {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.ended = true
	o.mu.Unlock()
}

// replyTyped writes the reply to a host call that raises the builtin
// exception errType (one of pynox.HostErrorTypes) with message.
func (c *Client) replyTyped(callID int64, errType, message string) {
	type reply struct {
		CallID    int64  `json:"call_id"`
		Error     string `json:"error"`
		ErrorType string `json:"error_type"`
	}
	b, err := marshalLine(struct {
		Reply reply `json:"reply"`
	}{reply{CallID: callID, Error: message, ErrorType: errType}})
	if err != nil {
		return
	}
	c.writeReply(callID, b)
}
