package jsonl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pynox/pynox"
)

// Session and host-call bounds of the pool protocol.
const (
	// MaxPendingSteps is how many requests a session holds, running and
	// queued; beyond it a request answers RequestError until it catches up.
	MaxPendingSteps = 8
	// maxSessionName bounds a session's name, in bytes.
	maxSessionName = 256
)

// replyReq is the "reply" of a reply request: the answer to a host call.
type replyReq struct {
	CallID *int64          `json:"call_id"`
	Result json.RawMessage `json:"result"`
	Error  *string         `json:"error"`
	// ErrorType names the builtin exception type the job sees with Error
	// (pynox.HostErrorTypes); absent for pynox_host.HostError.
	ErrorType *string `json:"error_type"`
}

// replyError answers a reply request that reached no call.
type replyError struct {
	ID     any              `json:"id"`
	CallID *int64           `json:"call_id"`
	Exit   int              `json:"exit"`
	Error  *pynox.ErrorInfo `json:"error"`
}

// closedEvent answers a session's close request.
type closedEvent struct {
	ID      any    `json:"id"`
	Session string `json:"session"`
	Closed  bool   `json:"closed"`
}

// server is the state of one Serve call beyond its job queue: the named
// sessions and the host calls waiting for a reply.
type server struct {
	p   *pynox.Pool
	cfg pynox.Config // p's
	out *lineWriter
	ctx context.Context // for jobs and steps: not canceled when Serve's ctx is

	callMu    sync.Mutex
	calls     map[int64]chan replyReq // host calls waiting for their reply
	inputDone bool                    // no reply can come any more
	inputEnd  error                   // why (errNoInput or errShutdown), once inputDone
	callWake  chan struct{}           // a call started waiting (Serve reads on)

	cancels cancelTable // one-shot jobs by id, for cancel requests

	mu       sync.Mutex
	sessions map[string]*namedSession
	steps    sync.WaitGroup // session requests accepted and not yet answered

	limit    ServeOptions // see inflight.go
	inFlight atomic.Int64 // jobs and session requests accepted and not yet answered
}

// namedSession is a session of the pool protocol: a name, the requests
// queued for it, and its Checkout once created.
type namedSession struct {
	name    string
	queue   chan request
	pending int             // requests queued or running (s.mu)
	co      *pynox.Checkout // nil until created, and after it ends (s.mu)
	ended   bool            // the last step ended its process: the next request creates one (session goroutine only)
}

// jobCalls is the set of host calls of one job or session step waiting
// for replies; once the job has its result, none is waiting any more.
type jobCalls struct {
	mu    sync.Mutex // held while a call event is written, and by endCalls
	ids   map[int64]bool
	ended bool
}

// hostFor returns the HostFunc of a job or session step served over JSON
// Lines: each call becomes a "call" event and waits for the reply request
// naming its call_id, or for the job's end. endCalls(jc) must run before
// the job's result is written, so that a reply sent after the result
// finds no call (a late reply is a RequestError).
func (s *server) hostFor() (pynox.HostFunc, *jobCalls) {
	jc := &jobCalls{ids: map[int64]bool{}}
	return func(ctx context.Context, call *pynox.Call) (any, error) {
		ch := make(chan replyReq, 1)
		// The event is written under the job's lock, which endCalls takes
		// before the job's result is written: no call event ever follows
		// its job's result.
		jc.mu.Lock()
		if jc.ended {
			jc.mu.Unlock()
			return nil, ctx.Err()
		}
		s.callMu.Lock()
		if s.inputDone {
			err := s.inputEnd
			s.callMu.Unlock()
			jc.mu.Unlock()
			return nil, err
		}
		s.calls[call.ID] = ch
		jc.ids[call.ID] = true
		s.callMu.Unlock()
		select {
		case s.callWake <- struct{}{}:
		default:
		}
		s.out.send(callEvent{Event: "call", Call: call})
		jc.mu.Unlock()
		defer func() {
			s.callMu.Lock()
			delete(s.calls, call.ID)
			s.callMu.Unlock()
		}()
		select {
		case r := <-ch:
			if r.Error != nil {
				if r.ErrorType != nil {
					return nil, pynox.RaiseAs(*r.ErrorType, *r.Error)
				}
				return nil, errors.New(*r.Error)
			}
			return r.Result, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}, jc
}

// endCalls drops the job's waiting calls: replies to them are late.
func (s *server) endCalls(jc *jobCalls) {
	jc.mu.Lock()
	defer jc.mu.Unlock()
	s.callMu.Lock()
	defer s.callMu.Unlock()
	jc.ended = true
	for id := range jc.ids {
		delete(s.calls, id)
	}
	jc.ids = nil
}

var errNoInput = errors.New("the client closed its input, so no reply can come")

// errShutdown is why calls fail once Serve's ctx ended: it reads no more.
var errShutdown = errors.New("the pool is shutting down and reads no more replies")

// callsWaiting reports whether a host call waits for its reply.
func (s *server) callsWaiting() bool {
	s.callMu.Lock()
	defer s.callMu.Unlock()
	return len(s.calls) > 0
}

// endInput fails every call waiting for a reply, and every later one,
// with why (the first reason given stands).
func (s *server) endInput(why error) {
	s.callMu.Lock()
	defer s.callMu.Unlock()
	if !s.inputDone {
		s.inputEnd = why
	}
	msg := s.inputEnd.Error()
	s.inputDone = true
	for id, ch := range s.calls {
		delete(s.calls, id)
		ch <- replyReq{Error: &msg}
	}
}

// callEvent is the "call" line of the pool protocol.
type callEvent struct {
	Event string `json:"event"`
	*pynox.Call
}

// reply routes a reply request to its waiting call; a reply that finds
// none (unknown, already answered, or the job ended) is a RequestError.
func (s *server) reply(req request) {
	r := req.Reply
	fail := func(e *pynox.Error) {
		res := refuse(s.p, &pynox.Job{ID: req.ID}, e)
		s.out.send(replyError{ID: req.ID, CallID: r.CallID, Exit: -1, Error: res.Error})
	}
	if extra := setFields(req); len(extra) > 0 {
		fail(requestErrorf("a reply request takes no other fields than id and reply (got %v)", extra))
		return
	}
	switch {
	case r.CallID == nil:
		fail(requestErrorf("reply: call_id is required"))
		return
	case (r.Result == nil) == (r.Error == nil):
		fail(requestErrorf("reply: exactly one of result and error is required"))
		return
	case len(r.Result) > pynox.MaxCallBytes:
		fail(requestErrorf("reply: the result is %d bytes of JSON; the limit is %d", len(r.Result), pynox.MaxCallBytes))
		return
	case r.ErrorType != nil && r.Error == nil:
		fail(requestErrorf("reply: error_type goes with error, not with result"))
		return
	}
	s.callMu.Lock()
	ch, ok := s.calls[*r.CallID]
	if ok {
		delete(s.calls, *r.CallID)
	}
	s.callMu.Unlock()
	if !ok {
		fail(requestErrorf("reply: no call %d is waiting for a reply (it was answered already, its task ended, or it never existed)", *r.CallID))
		return
	}
	if r.ErrorType != nil && !pynox.IsHostErrorType(*r.ErrorType) {
		// The call still gets its one answer: plain HostError.
		fail(requestErrorf("reply: error_type %q is not one of %s; the call failed with HostError", *r.ErrorType, strings.Join(pynox.HostErrorTypes(), ", ")))
		msg := *r.Error
		ch <- replyReq{CallID: r.CallID, Error: &msg}
		return
	}
	ch <- *r
}

// refuseResult answers a reply refused for its result (a key repeated in
// an object, see decodeRequest): the refusal names its call_id, and the
// call, when one waits, is answered with the result, which the job's own
// check refuses, raising HostError: the call gets its one answer and the
// job goes on.
func (s *server) refuseResult(req request, e *pynox.Error) {
	r := req.Reply
	s.callMu.Lock()
	ch, ok := s.calls[*r.CallID]
	if ok {
		delete(s.calls, *r.CallID)
	}
	s.callMu.Unlock()
	if ok {
		e.Message += fmt.Sprintf("; call %d fails with HostError", *r.CallID)
	}
	res := refuse(s.p, &pynox.Job{ID: req.ID}, e)
	s.out.send(replyError{ID: req.ID, CallID: r.CallID, Exit: -1, Error: res.Error})
	if ok {
		ch <- replyReq{CallID: r.CallID, Result: r.Result}
	}
}

// session queues a session request (a step or a close) behind the
// session's earlier ones.
func (s *server) session(req request) {
	switch {
	case len(req.Session) > maxSessionName:
		s.refuseSession(req, requestErrorf("session: the name is %d bytes; the limit is %d", len(req.Session), maxSessionName))
		return
	case req.Close:
		if extra := setFields(req); len(extra) > 0 {
			s.refuseSession(req, requestErrorf("a close request takes no other fields than id and session (got %v)", extra))
			return
		}
	case req.Dump:
		if extra := setFields(req); len(extra) > 1 {
			s.refuseSession(req, requestErrorf("a dump request takes no other fields than id, session and dump (got %v)", extra))
			return
		}
	case req.Script != "":
		s.refuseSession(req, requestErrorf("sessions take inline code, not script"))
		return
	case req.Code == "":
		s.refuseSession(req, requestErrorf("a session request needs code, close or dump"))
		return
	}
	s.mu.Lock()
	ns := s.sessions[req.Session]
	if ns == nil {
		if req.Close || req.Dump {
			s.mu.Unlock()
			s.refuseSession(req, requestErrorf("no session named %q is open", req.Session))
			return
		}
		if len(s.sessions) >= s.cfg.MaxSessions && !s.cfg.EvictIdle {
			// Refused here, by the reader, like a job line over the
			// limit: a client that sends new names without reading its
			// answers is held up instead of each name costing a
			// goroutine that waits to send its refusal.
			s.mu.Unlock()
			s.refuseSession(req, s.tooManySessions())
			return
		}
		ns = &namedSession{name: req.Session, queue: make(chan request, MaxPendingSteps)}
		s.sessions[req.Session] = ns
		go s.runSession(ns)
	}
	if pending := ns.pending; pending >= MaxPendingSteps {
		s.mu.Unlock()
		s.refuseSession(req, requestErrorf("session %q has %d requests pending; wait for their results", req.Session, pending))
		return
	}
	ns.pending++
	s.steps.Add(1)
	s.inFlight.Add(1)
	ns.queue <- req
	s.mu.Unlock()
}

// runSession answers a session's requests in order. It returns once the
// session has no process and nothing queued.
func (s *server) runSession(ns *namedSession) {
	for req := range ns.queue {
		s.serveSessionReq(ns, req)
		s.answered()
		s.steps.Done()
		s.mu.Lock()
		ns.pending--
		if ns.pending == 0 && ns.co == nil {
			if s.sessions[ns.name] == ns {
				delete(s.sessions, ns.name)
			}
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
	}
}

func (s *server) serveSessionReq(ns *namedSession, req request) {
	s.mu.Lock()
	co := ns.co
	s.mu.Unlock()
	if co != nil && hooks.Finished(co) != nil {
		// Closed by the pool for being idle: the name starts afresh.
		co = nil
		ns.ended = false
	}
	if req.Dump {
		s.dumpSession(ns, co, req)
		return
	}
	if req.Close {
		if co == nil {
			// Closed by an earlier close queued before this one, never
			// created, or closed by the pool: as if sent after that
			// close's answer.
			s.refuseSession(req, requestErrorf("no session named %q is open", req.Session))
			return
		}
		co.Finish(context.Background())
		s.mu.Lock()
		ns.co = nil
		if ns.pending == 1 && s.sessions[ns.name] == ns {
			// Gone before the answer: a close that follows it finds no
			// session, and a step that follows it creates one.
			delete(s.sessions, ns.name)
		}
		s.mu.Unlock()
		s.out.send(closedEvent{ID: req.ID, Session: ns.name, Closed: true})
		return
	}
	accepted := time.Now()
	job := req.Job
	job.Code, job.Name, job.Args, job.ID = "", "", nil, nil
	job.Inputs = nil // the step's, below
	job.Collect = nil
	switch {
	case co == nil:
		var err error
		created := ns
		co, err = hooks.Checkout(s.p, s.ctx, job, ns.name, func(co *pynox.Checkout) { s.checkoutEnded(created, co) })
		if err != nil {
			var pe *pynox.Error
			switch {
			case errors.As(err, &pe) && pe.Kind == pynox.KindExhausted:
				s.refuseSession(req, s.tooManySessions())
			case errors.As(err, &pe) && pe.Kind == pynox.KindRequest:
				s.refuseSession(req, pe)
			case errors.Is(err, pynox.ErrClosed):
				s.refuseSession(req, requestErrorf("the pool is shutting down"))
			default:
				s.sessionFailed(ns, req, "the session could not start: "+err.Error(), accepted)
			}
			return
		}
		if req.Restore != nil {
			if err := hooks.SetRestore(co, req.Restore); err != nil {
				co.Finish(context.Background())
				s.refuseSession(req, asRequestError(err))
				return
			}
		}
		s.mu.Lock()
		ns.co = co
		s.mu.Unlock()
		ns.ended = false
	case ns.ended:
		// The last step ended the process: this request creates the next
		// one, with the permissions it brings.
		if err := hooks.Reconfigure(co, job); err != nil {
			var pe *pynox.Error
			if errors.As(err, &pe) && pe.Kind == pynox.KindRequest {
				s.refuseSession(req, pe)
			} else {
				s.refuseSession(req, requestErrorf("%v", err))
			}
			return
		}
		if req.Restore != nil {
			if err := hooks.SetRestore(co, req.Restore); err != nil {
				s.refuseSession(req, asRequestError(err))
				return
			}
		}
		ns.ended = false
	default:
		if extra := permissionFields(req); len(extra) > 0 {
			s.refuseSession(req, requestErrorf("session %q is running: a later request carries only code, name, args, inputs, collect, timeout and max_output (got %v)", ns.name, extra))
			return
		}
	}
	stepHost, jc := s.hostFor()
	var onOut pynox.OutputFunc
	var onDisp pynox.DisplayFunc
	if req.Stream {
		onOut = s.outputFor(req.ID, ns.name)
		onDisp = s.displayFor(req.ID, ns.name)
	}
	ev, err := co.Feed(withParent(s.ctx, req.parent), pynox.Step{ID: req.ID, Code: req.Code, Name: req.Name, Args: req.Args,
		Timeout: req.Job.Timeout, MaxOutput: req.MaxOutput, Host: stepHost, OnOutput: onOut, OnDisplay: onDisp, Inputs: req.Inputs,
		Collect: req.Collect})
	s.endCalls(jc)
	if err != nil {
		var pe *pynox.Error
		if errors.As(err, &pe) && pe.Kind == pynox.KindRequest {
			s.refuseSession(req, pe)
			return
		}
		if errors.Is(err, pynox.ErrClosed) {
			// Shutdown takes no new step (SIGTERM): like a job line
			// not yet given a slot.
			s.refuseSession(req, requestErrorf("the pool is shutting down"))
			ns.ended = true
			return
		}
		s.sessionFailed(ns, req, "the session ended before the step ran: "+err.Error(), accepted)
		ns.ended = true
		return
	}
	res := ev.Result
	ns.ended = res.SessionEnded
	s.out.send(res)
}

// refuseSession answers a session request that runs nothing.
func (s *server) refuseSession(req request, e *pynox.Error) {
	s.out.send(hooks.Refuse(s.p, &req.Job, req.Session, e))
}

// tooManySessions is the refusal of a new session beyond max_sessions.
func (s *server) tooManySessions() *pynox.Error {
	return requestErrorf("max_sessions (%d) sessions are open; close one first", s.cfg.MaxSessions)
}

// sessionFailed answers a session request the pool could not run with a
// PoolWorkerError that ends the session.
func (s *server) sessionFailed(ns *namedSession, req request, msg string, accepted time.Time) {
	s.out.send(hooks.Fail(s.p, &req.Job, ns.name, msg, accepted))
}

// checkoutEnded forgets a session the pool closed (idle, or the pool
// closing).
func (s *server) checkoutEnded(ns *namedSession, co *pynox.Checkout) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ns.co != co {
		return
	}
	ns.co = nil
	if ns.pending == 0 && s.sessions[ns.name] == ns {
		delete(s.sessions, ns.name)
		close(ns.queue)
	}
}

// finishSessions ends every session once no request is pending: sessions
// end with the Serve call that named them.
func (s *server) finishSessions() {
	s.steps.Wait()
	s.mu.Lock()
	var cos []*pynox.Checkout
	for _, ns := range s.sessions {
		if ns.co != nil {
			cos = append(cos, ns.co)
		}
	}
	s.mu.Unlock()
	for _, co := range cos {
		co.Finish(context.Background())
	}
}

// setFields lists the fields of a request beyond id, session, close and
// reply, by their JSON names.
func setFields(req request) []string {
	j := req.Job
	var f []string
	add := func(set bool, name string) {
		if set {
			f = append(f, name)
		}
	}
	add(j.Code != "", "code")
	add(j.Script != "", "script")
	add(j.Name != "", "name")
	add(j.Args != nil, "args")
	add(j.Inputs != nil, "inputs")
	add(j.Collect != nil, "collect")
	add(req.Stats, "stats")
	add(j.Timeout != 0, "timeout")
	add(j.MaxOutput != 0, "max_output")
	add(req.Stream, "stream")
	add(req.Interrupt, "interrupt")
	add(req.Cancel != nil, "cancel")
	add(req.Dump, "dump")
	add(req.Traceparent != "", "traceparent")
	add(req.Tracestate != "", "tracestate")
	f = append(f, permissionFields(req)...)
	if req.Reply != nil && (req.Session != "" || req.Close) {
		f = append(f, "session")
	}
	sort.Strings(f)
	return f
}

// permissionFields lists the fields that only a session's creating
// request may carry.
func permissionFields(req request) []string {
	j := req.Job
	var f []string
	add := func(set bool, name string) {
		if set {
			f = append(f, name)
		}
	}
	add(j.AllowRead != nil, "allow_read")
	add(j.AllowWrite != nil, "allow_write")
	add(j.PackageDirs != nil, "package_dirs")
	add(j.Mounts != nil, "mounts")
	add(j.Env != nil, "env")
	add(j.AllowNetwork, "allow_network")
	add(j.Memory != 0, "memory")
	add(j.MaxFileSize != 0, "max_file_size")
	add(j.Profile != "", "profile")
	add(j.Functions != nil || j.Tools != nil, "functions")
	add(req.Restore != nil, "restore")
	return f
}
