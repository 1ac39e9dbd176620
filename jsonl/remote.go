package jsonl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/poolhook"
)

// remoteHooks is package pynox's constructor of a remote Pool.
var remoteHooks = poolhook.Remote.(interface {
	NewRemote(b any, workers int, preloaded []string, pidNamespace bool, cgroups string,
		self pynox.SelfConfinement, mounts pynox.MountSupport) *pynox.Pool
})

// DialOptions are the options of [Dial].
type DialOptions struct {
	// Token is sent as "Authorization: Bearer TOKEN" with every
	// connection; a server started with --token-file needs one of its
	// tokens. Empty sends none.
	Token string
	// Header holds further HTTP headers for the WebSocket handshake.
	Header http.Header
	// HTTPClient makes the handshake; nil uses http.DefaultClient. Its
	// Transport's TLS configuration applies to wss:// URLs.
	HTTPClient *http.Client
	// ReadLimit is the largest message accepted from the server, in
	// bytes; zero means 96 MiB, which holds the largest answer the
	// protocol sends whatever a job does: a session's dump of
	// pynox.MaxDumpSize bytes, as base64 (about 85 MiB). A result
	// carries up to the server's max_output of each stream, escaped as
	// JSON, so a server with a
	// larger output ceiling needs a larger limit. A larger message ends
	// the connection (its work in flight fails with KindDisconnected).
	ReadLimit int64
	// WriteTimeout bounds how long a request may wait for the server to
	// take it; the connection ends when one waits longer. Zero means 1
	// minute.
	WriteTimeout time.Duration
	// Keepalive is how often an open connection sends a stats request
	// (the protocol's keepalive): it keeps the server's --idle-timeout
	// from closing a connection whose sessions wait between steps, and
	// ends a connection whose server no longer answers within the same
	// interval, so that its work fails with KindDisconnected instead of
	// waiting for good. Zero means 30 seconds; a negative value sends
	// none.
	Keepalive time.Duration
}

// The defaults of DialOptions.
const (
	// defaultReadLimit holds a dump answer of pynox.MaxDumpSize bytes:
	// a session's code chooses its dump's size, and a message over the
	// limit ends the connection, with every result in flight on it.
	defaultReadLimit    = 96 << 20
	defaultWriteTimeout = time.Minute
	defaultKeepalive    = 30 * time.Second
)

// Dial connects to a `pynox serve` server's WebSocket endpoint — url is
// "ws://HOST:PORT/v1/pool" or "wss://…/v1/pool" — and returns a
// [pynox.Pool] whose work runs there: Run, Checkout (Feed, Resume, Wait,
// Interrupt, Dump, Finish), Restore, host functions, streamed output,
// inputs and values, Stats, Close and Shutdown behave as a local pool's
// and return the same Result and Error types and kinds, over the pool
// protocol (this package's [Client] speaks it). It fails when the first
// connection cannot be made or the server's first message is not its
// ready event; that error matches [pynox.ErrDisconnected].
//
// A connection that ends under work in flight fails that work with an
// error matching [pynox.ErrDisconnected] (a job may or may not have run;
// its result is lost), and ends every checkout of that connection with
// that error (the server's sessions belong to their connection and end
// with it): their later calls return it, and a new Checkout is needed.
// The next Run, Checkout or Stats dials a new connection.
//
// What differs from a local pool: a Checkout's job is checked by the
// server at its first Feed (a job outside the ceiling fails there, with a
// KindRequest error, not at Checkout); a HostFunc's ctx ends with the call
// rather than with Feed's ctx; Pool.Config, Python, CgroupDirs and
// Checkout.Pid describe nothing remote (zero values), while Workers,
// Preloaded, PIDNamespace, Cgroups, SelfConfinement and Mounts come from
// the server's ready event; Shutdown stops this client, not the server;
// Stats is the server's, all its clients together. See docs/serve.md,
// "The Go API, remote".
func Dial(ctx context.Context, url string, o DialOptions) (*pynox.Pool, error) {
	rp := &remotePool{url: url, o: o, checkouts: map[*remoteCheckout]struct{}{}}
	rc, err := rp.dial(ctx)
	if err != nil {
		return nil, err
	}
	rp.conn = rc
	r := rc.c.Ready()
	return remoteHooks.NewRemote(rp, r.Workers, r.PreloadedModules, r.PIDNamespace, r.Cgroups,
		r.SelfConfinement, r.Mounts), nil
}

// DialClient connects to a `pynox serve` server's WebSocket as [Dial]
// does, and returns a [Client] on that one connection, for programs and
// tests that speak the protocol itself ([Client.Run], [Client.Session],
// [Client.Stats]) rather than the Pool API; it does not reconnect. Its
// errors are Dial's. [Client.Close] closes the connection: the server
// then runs what it had accepted and drops the answers (the pipe's end
// of input, see docs/serve.md), and calls still waiting fail with
// [ErrClientClosed].
func DialClient(ctx context.Context, url string, o DialOptions) (*Client, error) {
	rc, err := (&remotePool{url: url, o: o}).dial(ctx)
	if err != nil {
		return nil, err
	}
	return rc.c, nil
}

// remotePool is the backend of a Pool made by Dial.
type remotePool struct {
	url string
	o   DialOptions

	dialMu sync.Mutex // one dial at a time

	mu        sync.Mutex
	conn      *remoteConn // the current connection; nil or ended: dial anew
	closed    bool        // Close or Shutdown: no new work
	inflight  sync.WaitGroup
	checkouts map[*remoteCheckout]struct{}
	seq       atomic.Int64 // names the checkouts' sessions
}

// remoteConn is one WebSocket connection and the protocol client on it.
type remoteConn struct {
	ws *websocket.Conn
	c  *Client
}

// disconnected is the error of work a dropped connection failed.
func disconnected(format string, args ...any) *pynox.Error {
	return &pynox.Error{Kind: pynox.KindDisconnected, Type: pynox.KindDisconnected.String(), Message: fmt.Sprintf(format, args...)}
}

func errRemoteClosed() *pynox.Error {
	return &pynox.Error{Kind: pynox.KindClosed, Type: pynox.KindClosed.String(), Message: "the pool is closed"}
}

// dial opens a connection and reads the server's ready event.
func (rp *remotePool) dial(ctx context.Context) (*remoteConn, error) {
	h := rp.o.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	if rp.o.Token != "" {
		h.Set("Authorization", "Bearer "+rp.o.Token)
	}
	ws, resp, err := websocket.Dial(ctx, rp.url, &websocket.DialOptions{HTTPHeader: h, HTTPClient: rp.o.HTTPClient,
		CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		why := err.Error()
		if resp != nil {
			why = fmt.Sprintf("the server answered %s", resp.Status)
			if resp.StatusCode == http.StatusUnauthorized {
				why += " (DialOptions.Token: expected one of the server's --token-file tokens)"
			}
		}
		return nil, disconnected("connecting to %s: %s", rp.url, why)
	}
	limit := rp.o.ReadLimit
	if limit <= 0 {
		limit = defaultReadLimit
	}
	ws.SetReadLimit(limit)
	type made struct {
		c   *Client
		err error
	}
	ch := make(chan made, 1)
	go func() {
		wt := rp.o.WriteTimeout
		if wt <= 0 {
			wt = defaultWriteTimeout
		}
		c, err := NewClient(&wsLineReader{ws: ws}, &wsLineWriter{ws: ws, timeout: wt})
		ch <- made{c, err}
	}()
	select {
	case m := <-ch:
		if m.err != nil {
			ws.CloseNow()
			return nil, disconnected("connecting to %s: %v", rp.url, m.err)
		}
		rc := &remoteConn{ws: ws, c: m.c}
		if ka := rp.o.Keepalive; ka >= 0 {
			if ka == 0 {
				ka = defaultKeepalive
			}
			go rc.keepalive(ka)
		}
		return rc, nil
	case <-ctx.Done():
		ws.CloseNow()
		return nil, ctx.Err()
	}
}

// keepalive sends a stats request every interval until the connection
// ends, and ends it when one is not answered within interval.
func (rc *remoteConn) keepalive(interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-rc.c.done:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		_, err := rc.c.roundTrip(ctx, &request{Stats: true}, nil)
		cancel()
		if err != nil {
			rc.ws.CloseNow()
			return
		}
	}
}

// ended reports whether the connection's protocol client has stopped.
func (rc *remoteConn) ended() bool {
	select {
	case <-rc.c.done:
		return true
	default:
		return false
	}
}

// get returns the current connection, dialing a new one when it has
// ended, and counts the caller's work in flight (done ends it).
func (rp *remotePool) get(ctx context.Context) (_ *remoteConn, done func(), _ error) {
	rp.dialMu.Lock()
	defer rp.dialMu.Unlock()
	rp.mu.Lock()
	if rp.closed {
		rp.mu.Unlock()
		return nil, nil, errRemoteClosed()
	}
	rc := rp.conn
	rp.mu.Unlock()
	if rc == nil || rc.ended() {
		var err error
		if rc, err = rp.dial(ctx); err != nil {
			return nil, nil, err
		}
		rp.mu.Lock()
		if rp.closed {
			rp.mu.Unlock()
			rc.ws.CloseNow()
			return nil, nil, errRemoteClosed()
		}
		rp.conn = rc
		rp.mu.Unlock()
	}
	return rc, rp.begin(), nil
}

// begin counts work in flight; the caller has checked rp.closed.
func (rp *remotePool) begin() func() {
	rp.inflight.Add(1)
	var once sync.Once
	return func() { once.Do(rp.inflight.Done) }
}

// mapErr turns a protocol client's error into the pool's: the end of the
// connection is ErrClosed after Close, and ErrDisconnected otherwise.
func (rp *remotePool) mapErr(err error) error {
	if err == nil || !errors.Is(err, ErrClientClosed) {
		return err
	}
	rp.mu.Lock()
	closed := rp.closed
	rp.mu.Unlock()
	if closed {
		e := errRemoteClosed()
		e.Err = err
		return e
	}
	return disconnected("the connection to %s ended under the call: %v", rp.url, err)
}

// Run runs job on the server; see pynox.Pool.Run. When ctx ends first the
// job is cancelled on the server (a "cancel" request) and Run returns
// ctx.Err().
func (rp *remotePool) Run(ctx context.Context, job pynox.Job) (*pynox.Result, error) {
	if (len(job.Functions) > 0 || len(job.Tools) > 0) && job.Host == nil {
		// As a local pool answers it, without asking the server.
		return &pynox.Result{ID: job.ID, Exit: -1, Error: &pynox.ErrorInfo{Type: pynox.KindRequest.String(),
			Message: "functions are declared but the job has no Host to answer them"}}, nil
	}
	rc, done, err := rp.get(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	res, err := rc.c.Run(ctx, job)
	return res, rp.mapErr(err)
}

// Stats asks the server for its counters.
func (rp *remotePool) Stats(ctx context.Context) (pynox.Stats, error) {
	rc, done, err := rp.get(ctx)
	if err != nil {
		return pynox.Stats{}, err
	}
	defer done()
	s, err := rc.c.Stats(ctx)
	return s, rp.mapErr(err)
}

// Close ends the connection at once: work in flight fails with
// ErrClosed, checkouts end with ErrClosed.
func (rp *remotePool) Close() error {
	rp.mu.Lock()
	rp.closed = true
	rc := rp.conn
	cos := make([]*remoteCheckout, 0, len(rp.checkouts))
	for co := range rp.checkouts {
		cos = append(cos, co)
	}
	rp.mu.Unlock()
	for _, co := range cos {
		co.end(errRemoteClosed())
	}
	if rc != nil {
		rc.ws.CloseNow()
		<-rc.c.done
	}
	for _, co := range cos {
		<-co.ended
	}
	return nil
}

// Shutdown refuses new work at once, waits for the work in flight (or
// ctx), then closes as Close does.
func (rp *remotePool) Shutdown(ctx context.Context) error {
	rp.dialMu.Lock() // no get is between its closed check and its count
	rp.mu.Lock()
	rp.closed = true
	rp.mu.Unlock()
	rp.dialMu.Unlock()
	idle := make(chan struct{})
	go func() { rp.inflight.Wait(); close(idle) }()
	var err error
	select {
	case <-idle:
	case <-ctx.Done():
		err = ctx.Err()
	}
	rp.Close()
	return err
}

// Checkout opens a checkout bound to the current connection; its session
// is created on the server by the first Feed.
func (rp *remotePool) Checkout(ctx context.Context, job pynox.Job, restore []byte) (any, error) {
	if job.Code != "" || job.Script != "" || len(job.Args) > 0 {
		return nil, requestErrorf("a checkout's job takes no code, script nor args: each step brings its own code")
	}
	rc, done, err := rp.get(ctx)
	if err != nil {
		return nil, err
	}
	done() // a checkout is not work in flight; its steps are
	name := "go-checkout-" + strconv.FormatInt(rp.seq.Add(1), 10)
	co := &remoteCheckout{rp: rp, rc: rc, job: job, token: make(chan struct{}, 1), ended: make(chan struct{})}
	co.life, co.kill = context.WithCancel(context.Background())
	if restore != nil {
		co.sess = rc.c.RestoreSession(name, job, restore)
	} else {
		co.sess = rc.c.Session(name, job)
	}
	rp.mu.Lock()
	if rp.closed {
		rp.mu.Unlock()
		return nil, errRemoteClosed()
	}
	rp.checkouts[co] = struct{}{}
	rp.mu.Unlock()
	// The session ends with its connection.
	go func() {
		select {
		case <-rc.c.done:
			co.end(rp.mapErr(fmt.Errorf("%w: the connection ended", ErrClientClosed)))
		case <-co.ended:
		}
	}()
	return co, nil
}

// pynoxRemoteCheckout is the remote checkout as package pynox sees it
// (its remoteCheckout interface, asserted by pynox).
type pynoxRemoteCheckout interface {
	Feed(ctx context.Context, step pynox.Step) (pynox.TurnEvent, error)
	Resume(ctx context.Context, callID int64, result json.RawMessage, errMsg *string, errType string) (pynox.TurnEvent, error)
	Wait(ctx context.Context) (pynox.TurnEvent, error)
	Interrupt() bool
	Finish(ctx context.Context) error
	Done() <-chan struct{}
	Err() error
	Dump(ctx context.Context) (*pynox.Dump, error)
}

// remoteCheckout is a session on the server, driven in turns as a local
// Checkout is: a step runs on a goroutine of its own, and its host calls
// surface as TurnEvents when neither the step nor the job has a Host.
type remoteCheckout struct {
	rp   *remotePool
	rc   *remoteConn
	job  pynox.Job
	sess *Session

	// token is the turn: Feed, Resume, Wait and Dump hold it.
	token chan struct{}
	turn  *remoteTurn // owned by the token's holder

	mu      sync.Mutex
	why     error       // why it ended, once it has
	running *remoteTurn // the turn whose step runs, for Interrupt

	life  context.Context // canceled when the checkout ends
	kill  context.CancelFunc
	ended chan struct{}
}

// remoteTurn is one step in flight.
type remoteTurn struct {
	events  chan remoteMsg
	pending []*pynox.Call
	answers map[int64]chan hostAnswer
	done    func() // ends the step's count of work in flight
	// ended is the step's end, taken while calls still waited (Resume
	// takes the calls made meanwhile); the next await reports it.
	ended *remoteMsg
	// intr is closed by the first interrupt of the step.
	intr     chan struct{}
	intrOnce sync.Once
}

// remoteMsg is a call of the step, or its end.
type remoteMsg struct {
	call   *pynox.Call
	answer chan hostAnswer
	res    *pynox.Result
	err    error
}

// hostAnswer is the answer Resume gives a call.
type hostAnswer struct {
	result  json.RawMessage
	errMsg  *string
	errType string
}

func (co *remoteCheckout) acquire(ctx context.Context) error {
	if err := co.Err(); err != nil {
		return err
	}
	select {
	case co.token <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-co.life.Done():
		return co.Err()
	}
	if err := co.Err(); err != nil {
		<-co.token
		return err
	}
	return nil
}

func (co *remoteCheckout) release() { <-co.token }

// Err returns why the checkout ended, or nil.
func (co *remoteCheckout) Err() error {
	co.mu.Lock()
	defer co.mu.Unlock()
	return co.why
}

// Done is closed once the checkout has ended.
func (co *remoteCheckout) Done() <-chan struct{} { return co.ended }

// end ends the checkout for why; false when it had ended already.
func (co *remoteCheckout) end(why error) bool {
	co.mu.Lock()
	if co.why != nil {
		co.mu.Unlock()
		return false
	}
	co.why = why
	t := co.running
	co.mu.Unlock()
	if t != nil {
		co.interrupt(t) // the server kills it 2 s later at the latest
	}
	co.kill()
	go func() {
		// The session ends on the server (when the connection lives).
		if !co.rc.ended() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = co.sess.Close(ctx)
			cancel()
		}
		co.rp.mu.Lock()
		delete(co.rp.checkouts, co)
		co.rp.mu.Unlock()
		close(co.ended)
	}()
	return true
}

// Finish ends the checkout; see pynox.Checkout.Finish.
func (co *remoteCheckout) Finish(ctx context.Context) error {
	if !co.end(&pynox.Error{Kind: pynox.KindFinished, Type: pynox.KindFinished.String(), Message: "the checkout was finished"}) {
		return co.Err()
	}
	select {
	case <-co.ended:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Interrupt interrupts the running step, if any.
func (co *remoteCheckout) Interrupt() bool {
	co.mu.Lock()
	t := co.running
	co.mu.Unlock()
	if t == nil {
		return false
	}
	co.interrupt(t)
	return true
}

// interrupt sends the step's interrupt request, once.
func (co *remoteCheckout) interrupt(t *remoteTurn) {
	t.intrOnce.Do(func() {
		close(t.intr)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = co.rc.c.roundTrip(ctx, &request{Session: co.sess.name, Interrupt: true}, nil)
		}()
	})
}

// Feed runs one step; see pynox.Checkout.Feed.
func (co *remoteCheckout) Feed(ctx context.Context, step pynox.Step) (pynox.TurnEvent, error) {
	if err := co.acquire(ctx); err != nil {
		return pynox.TurnEvent{}, err
	}
	defer co.release()
	if co.turn != nil {
		return pynox.TurnEvent{}, &pynox.Error{Kind: pynox.KindProtocol, Type: pynox.KindProtocol.String(),
			Message: fmt.Sprintf("host call %d is waiting for Resume", co.turn.pending[0].ID)}
	}
	co.rp.mu.Lock()
	if co.rp.closed {
		co.rp.mu.Unlock()
		return pynox.TurnEvent{}, errRemoteClosed()
	}
	done := co.rp.begin()
	co.rp.mu.Unlock()
	t := &remoteTurn{events: make(chan remoteMsg, 16), answers: map[int64]chan hostAnswer{}, done: done, intr: make(chan struct{})}
	if step.Host == nil && co.job.Host == nil {
		step.Host = t.bridge
	}
	co.turn = t
	co.mu.Lock()
	co.running = t
	co.mu.Unlock()
	go func() {
		res, err := co.sess.Run(withSpanOf(co.life, ctx), step)
		t.done() // Shutdown waits for the step, not for its caller
		co.mu.Lock()
		if co.running == t {
			co.running = nil
		}
		co.mu.Unlock()
		t.events <- remoteMsg{res: res, err: err}
	}()
	return co.await(ctx, t)
}

// bridge is the HostFunc of a step without one: each call surfaces as a
// TurnEvent, and waits for its Resume.
func (t *remoteTurn) bridge(ctx context.Context, call *pynox.Call) (any, error) {
	ans := make(chan hostAnswer, 1)
	select {
	case t.events <- remoteMsg{call: call, answer: ans}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var a hostAnswer
	select {
	case a = <-ans:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if a.errMsg != nil {
		if a.errType != "" {
			return nil, &pynox.HostError{Type: a.errType, Message: *a.errMsg}
		}
		return nil, errors.New(*a.errMsg)
	}
	return a.result, nil
}

// await waits for the turn's next event; the caller holds the token.
func (co *remoteCheckout) await(ctx context.Context, t *remoteTurn) (pynox.TurnEvent, error) {
	if m := t.ended; m != nil {
		t.ended = nil
		return co.stepEnded(*m)
	}
	select {
	case m := <-t.events:
		if m.call != nil {
			t.pending = append(t.pending, m.call)
			t.answers[m.call.ID] = m.answer
			return pynox.TurnEvent{Call: m.call, Calls: slices.Clone(t.pending)}, nil
		}
		return co.stepEnded(m)
	case <-ctx.Done():
		// Interrupted; the calls waiting, and those made meanwhile, are
		// refused: the interrupt takes effect once they are answered.
		co.interrupt(t)
		msg := "the step was interrupted"
		for _, c := range t.pending {
			t.answers[c.ID] <- hostAnswer{errMsg: &msg}
		}
		t.pending, t.answers = nil, map[int64]chan hostAnswer{}
		for m := range t.events {
			if m.call != nil {
				m.answer <- hostAnswer{errMsg: &msg}
				continue
			}
			ev, err := co.stepEnded(m)
			if err != nil {
				return ev, err
			}
			return ev, ctx.Err()
		}
	}
	panic("unreachable")
}

// stepEnded ends the turn with its step's outcome.
func (co *remoteCheckout) stepEnded(m remoteMsg) (pynox.TurnEvent, error) {
	co.turn = nil
	if m.err != nil {
		if why := co.Err(); why != nil {
			return pynox.TurnEvent{}, why
		}
		err := co.rp.mapErr(m.err)
		if errors.Is(err, pynox.ErrDisconnected) || errors.Is(err, pynox.ErrClosed) {
			co.end(err)
		}
		return pynox.TurnEvent{}, err
	}
	res := m.res
	if res.Error != nil && res.Error.Type == pynox.KindRequest.String() {
		// A step the server refused: the session is as it was, as for a
		// local Feed's KindRequest error. The server's refusal of a
		// session beyond max_sessions is a local Checkout's ErrExhausted.
		if strings.HasPrefix(res.Error.Message, "max_sessions (") {
			return pynox.TurnEvent{}, &pynox.Error{Kind: pynox.KindExhausted, Type: pynox.KindExhausted.String(), Message: res.Error.Message}
		}
		return pynox.TurnEvent{}, &pynox.Error{Kind: pynox.KindRequest, Type: res.Error.Type, Message: res.Error.Message}
	}
	return pynox.TurnEvent{Result: res}, nil
}

// Resume answers a call; see pynox.Checkout.Resume.
func (co *remoteCheckout) Resume(ctx context.Context, callID int64, result json.RawMessage, errMsg *string, errType string) (pynox.TurnEvent, error) {
	if err := co.acquire(ctx); err != nil {
		return pynox.TurnEvent{}, err
	}
	defer co.release()
	t := co.turn
	if t == nil || len(t.pending) == 0 {
		return pynox.TurnEvent{}, &pynox.Error{Kind: pynox.KindProtocol, Type: pynox.KindProtocol.String(),
			Message: fmt.Sprintf("no host call is waiting for Resume (call %d was answered already, or its step ended)", callID)}
	}
	ans := t.answers[callID]
	if ans == nil {
		ids := make([]string, len(t.pending))
		for i, p := range t.pending {
			ids[i] = strconv.FormatInt(p.ID, 10)
		}
		return pynox.TurnEvent{}, &pynox.Error{Kind: pynox.KindProtocol, Type: pynox.KindProtocol.String(),
			Message: fmt.Sprintf("call %d is not waiting for an answer; calls %s are", callID, strings.Join(ids, ", "))}
	}
	delete(t.answers, callID)
	t.pending = slices.DeleteFunc(t.pending, func(p *pynox.Call) bool { return p.ID == callID })
	ans <- hostAnswer{result: result, errMsg: errMsg, errType: errType}
	if len(t.pending) > 0 {
		// The step may be waiting for the others: take the calls it has
		// made meanwhile, without waiting for more.
		for t.ended == nil {
			select {
			case m := <-t.events:
				if m.call == nil {
					t.ended = &m
					continue
				}
				t.pending = append(t.pending, m.call)
				t.answers[m.call.ID] = m.answer
				continue
			default:
			}
			break
		}
		return pynox.TurnEvent{Call: t.pending[0], Calls: slices.Clone(t.pending)}, nil
	}
	return co.await(ctx, t)
}

// Wait waits for the next event of a turn with calls waiting.
func (co *remoteCheckout) Wait(ctx context.Context) (pynox.TurnEvent, error) {
	if err := co.acquire(ctx); err != nil {
		return pynox.TurnEvent{}, err
	}
	defer co.release()
	t := co.turn
	if t == nil || len(t.pending) == 0 {
		return pynox.TurnEvent{}, &pynox.Error{Kind: pynox.KindProtocol, Type: pynox.KindProtocol.String(),
			Message: "no host call is waiting, so there is no turn to wait for"}
	}
	return co.await(ctx, t)
}

// Dump returns the session's dump; see pynox.Checkout.Dump.
func (co *remoteCheckout) Dump(ctx context.Context) (*pynox.Dump, error) {
	if err := co.acquire(ctx); err != nil {
		return nil, err
	}
	defer co.release()
	if co.turn != nil {
		return nil, &pynox.Error{Kind: pynox.KindProtocol, Type: pynox.KindProtocol.String(),
			Message: fmt.Sprintf("host call %d is waiting for Resume; a session is dumped between steps", co.turn.pending[0].ID)}
	}
	d, err := co.sess.Dump(ctx)
	return d, co.rp.mapErr(err)
}

// wsLineReader reads a WebSocket's text messages as lines.
type wsLineReader struct {
	ws  *websocket.Conn
	buf []byte
}

func (r *wsLineReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		typ, msg, err := r.ws.Read(context.Background())
		if err != nil {
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure || websocket.CloseStatus(err) == websocket.StatusGoingAway {
				return 0, io.EOF
			}
			return 0, err
		}
		if typ != websocket.MessageText {
			r.ws.Close(websocket.StatusUnsupportedData, "the pool protocol is text messages")
			return 0, errors.New("the server sent a binary message")
		}
		r.buf = append(msg, '\n')
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// wsLineWriter sends each whole line written to it as one text message
// (the Client writes whole lines, one Write each).
type wsLineWriter struct {
	ws      *websocket.Conn
	timeout time.Duration
}

func (w *wsLineWriter) Write(p []byte) (int, error) {
	line := p
	if n := len(line); n > 0 && line[n-1] == '\n' {
		line = line[:n-1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	if err := w.ws.Write(ctx, websocket.MessageText, line); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close ends the connection with a normal closure ([Client.Close]).
func (w *wsLineWriter) Close() error {
	return w.ws.Close(websocket.StatusNormalClosure, "the client is done")
}
