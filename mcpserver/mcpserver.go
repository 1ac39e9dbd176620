// Package mcpserver exposes a [pynox.Pool] as a Model Context Protocol
// server, built on the official Go SDK
// (github.com/modelcontextprotocol/go-sdk). `pynox mcp` serves it over
// stdio; any MCP client (Claude Desktop, an IDE, an agent framework) can
// then run Python in the pool's confined processes.
//
// The server offers two tools:
//
//   - run_python runs code, either as a one-shot job or as a step of a
//     named session whose __main__ globals survive between calls, with
//     optional inputs (JSON values that become globals, as [pynox.Job]
//     Inputs; numbers are passed on exactly as written), an optional
//     profile and an optional timeout. It answers with text content:
//     stdout, stderr, the value of the last expression and the error, if
//     any. A job that failed (a Python exception, a non-zero exit, a
//     timeout, a refused request) is a tool error result (isError), with
//     the same text, so the model sees what went wrong. The same fields
//     are also in the result's structured content (see [RunOutput]).
//   - reset_session ends a named session: its process is killed and its
//     globals are gone; the next run_python naming it starts afresh.
//
// # Grants
//
// The pool's ceiling and profiles are the server's configuration, given
// by its operator (the flags and configuration file of `pynox mcp`, the
// same as `pynox pool`'s). A client cannot widen them: run_python takes
// no paths, network switch, memory or output limits, or environment. A
// client chooses only "profile", the name of one of the profiles the
// operator configured (each checked against the ceiling when the pool
// starts), and "timeout_seconds", at most the ceiling's timeout (which is
// also the default); an unknown profile and a longer timeout are refused
// before anything runs, and so is any argument the input schema does not
// list (the schema forbids additional properties). The
// reason is that a tool call's arguments are written by a model, and a
// model follows text it has read: a prompt injected into a web page
// could otherwise ask for any path beneath the ceiling, which defaults to
// the server's working directory.
//
// # Sessions
//
// Session names are scoped to the MCP session (one connected client):
// two clients that both use the name "main" get two different pynox
// sessions, and neither can reach, run code in or reset the other's.
// Over stdio there is a single client; the server keys its sessions by
// the SDK's [mcp.ServerSession], so a transport serving several clients
// keeps the property (`pynox serve` serves one Server over streamable
// HTTP, where each client gets its own server session). When an MCP session ends, its pynox
// sessions are finished. Several calls naming one session run one
// after another, in the session's turns. A session the pool ended (idle longer than the
// pool's session_idle) is replaced by a new one on the next call, whose
// text says so.
package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pynox/pynox"
)

// MaxSessionName is the longest session name run_python and
// reset_session accept, in bytes.
const MaxSessionName = 128

// RunInput is the arguments of the run_python tool.
type RunInput struct {
	// Code is the Python source to run.
	Code string `json:"code" jsonschema:"the Python source to run; the value of a final expression is returned"`
	// Session names a session whose globals persist between calls; empty
	// runs the code as a one-shot job in a fresh process.
	Session string `json:"session,omitempty" jsonschema:"name of a session whose variables persist between calls (created on first use); omit for a one-shot run in a fresh interpreter"`
	// Inputs become globals of __main__ before the code runs (see
	// [pynox.Job] Inputs).
	Inputs map[string]any `json:"inputs,omitempty" jsonschema:"JSON values that become global variables before the code runs; each key a Python identifier"`
	// Profile names one of the server's configured profiles; for a
	// session, it is fixed by the call that creates the session.
	Profile string `json:"profile,omitempty" jsonschema:"name of one of the server's configured profiles (permission presets); omit for the default"`
	// TimeoutSeconds is the run's wall-clock limit; zero means the
	// server's (its ceiling's timeout), and more than that is refused.
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty" jsonschema:"wall-clock limit of this run in seconds, at most the server's limit (the default)"`
}

// RunOutput is the structured content of a run_python result: the fields
// of [pynox.Result] a client needs, with the value decoded.
type RunOutput struct {
	// Stdout and Stderr are what the code wrote, cut to the pool's output
	// cap; the Truncated fields say when something was dropped.
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	// Value is the value of the code's final expression, as JSON (nil
	// when there was none, or it was None); ValueRepr is its repr when it
	// has no JSON form.
	Value     any    `json:"value,omitempty"`
	ValueRepr string `json:"value_repr,omitempty"`
	// Exit is the process's exit status (-1 when the pool ended or
	// refused the job).
	Exit int `json:"exit"`
	// Error is the failure, or nil.
	Error *pynox.ErrorInfo `json:"error,omitempty"`
	// Session and Step identify a session's step; SessionEnded says the
	// step ended the session's process (its next step starts with empty
	// globals), Restarted that this step ran in such a new process.
	Session      string `json:"session,omitempty"`
	Step         int    `json:"step,omitempty"`
	SessionEnded bool   `json:"session_ended,omitempty"`
	Restarted    bool   `json:"restarted,omitempty"`
}

// ResetInput is the arguments of the reset_session tool.
type ResetInput struct {
	// Session is the name of the session to end.
	Session string `json:"session" jsonschema:"name of the session to end; its variables are discarded"`
}

// Server serves a pool's tools to MCP clients. Create it with [New].
type Server struct {
	pool *pynox.Pool
	mcp  *mcp.Server

	mu       sync.Mutex
	sessions map[sessionKey]*session
	watched  map[*mcp.ServerSession]bool
}

// sessionKey scopes a session name to the MCP session that uses it.
type sessionKey struct {
	client *mcp.ServerSession
	name   string
}

// session is one named pynox session; ready is closed once co (or err)
// is set.
type session struct {
	ready   chan struct{}
	co      *pynox.Checkout
	err     error
	profile string
}

// New returns a Server whose tools run code in p. version is reported to
// clients as the server's version. The caller keeps ownership of p:
// closing it ends every session.
func New(p *pynox.Pool, version string) *Server {
	s := &Server{
		pool:     p,
		sessions: map[sessionKey]*session{},
		watched:  map[*mcp.ServerSession]bool{},
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "pynox", Version: version}, &mcp.ServerOptions{
		// Tools only: the SDK would otherwise advertise logging, which
		// this server does not send.
		Capabilities: &mcp.ServerCapabilities{},
		Instructions: "Runs Python 3 code in a confined CPython process (no network unless the server allows it, " +
			"no subprocesses, files only where the server's configuration grants them). " +
			"Use a session name to keep variables between calls.",
	})
	runTool := &mcp.Tool{
		Name: "run_python",
		Description: "Run Python code in a sandboxed CPython " + p.Python() + " and return its stdout, stderr, " +
			"the value of its last expression and its error. With \"session\", variables persist between calls " +
			"with the same session name.",
	}
	if names := p.Config().ProfileNames(); len(names) > 0 {
		runTool.Description += " Profiles: " + strings.Join(names, ", ") + "."
	}
	// run_python's arguments are decoded here, not by the SDK, whose
	// validation reads every number as a float64: an integer input beyond
	// 2^53 would reach the job rounded.
	schema, err := jsonschema.For[RunInput](nil)
	if err != nil {
		panic("mcpserver: the schema of RunInput: " + err.Error()) // a static type: cannot fail
	}
	runTool.InputSchema = schema
	s.mcp.AddTool(runTool, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		in, err := decodeRunInput(req.Params.Arguments)
		if err == nil {
			var res *mcp.CallToolResult
			if res, _, err = s.runPython(ctx, req, in); err == nil {
				return res, nil
			}
		}
		var res mcp.CallToolResult
		res.SetError(err)
		return &res, nil
	})
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:        "reset_session",
		Description: "End a Python session started by run_python: its process and variables are discarded.",
	}, s.resetSession)
	return s
}

// MCP returns the SDK server, for [mcp.Server.Run] or Connect on a
// transport.
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Run serves one client over t until the client disconnects or ctx ends.
// The sessions the client opened are finished when it disconnects, in the
// background; closing the pool finishes any still open.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	return s.mcp.Run(ctx, t)
}

// runPython is the run_python tool. Its structured content is set here
// as encoded JSON rather than returned as a typed output: the SDK
// validates a typed output against its schema by decoding it into
// float64s, which would round an integer value beyond 2^53.
func (s *Server) runPython(ctx context.Context, req *mcp.CallToolRequest, in RunInput) (*mcp.CallToolResult, any, error) {
	if in.Code == "" {
		return nil, nil, errors.New("code: expected Python source, got an empty string")
	}
	if err := checkName(in.Session); err != nil {
		return nil, nil, err
	}
	timeout, err := s.timeout(in.TimeoutSeconds)
	if err != nil {
		return nil, nil, err
	}
	if in.Session == "" {
		res, err := s.pool.Run(ctx, pynox.Job{Code: in.Code, Inputs: in.Inputs, Profile: in.Profile, Timeout: timeout})
		if err != nil {
			return nil, nil, err
		}
		return report(res, "")
	}
	var note string
	for attempt := 0; ; attempt++ {
		sess, err := s.session(ctx, req.Session, in.Session, in.Profile)
		if err != nil {
			return nil, nil, err
		}
		ev, err := sess.co.Feed(ctx, pynox.Step{Code: in.Code, Inputs: in.Inputs, Timeout: timeout})
		if attempt == 0 && (errors.Is(err, pynox.ErrFinished)) {
			// The pool ended the session (it was idle too long): start a
			// new one, and say so.
			s.forget(req.Session, in.Session, sess)
			note = fmt.Sprintf("note: session %q had ended (idle too long, or reset meanwhile), so this code ran in a new session whose variables start empty\n", in.Session)
			continue
		}
		if err != nil {
			if ev.Result != nil {
				return report(ev.Result, note)
			}
			return nil, nil, err
		}
		if ev.Result == nil {
			// Unreachable: the sessions declare no host functions.
			_ = sess.co.Finish(context.Background())
			s.forget(req.Session, in.Session, sess)
			return nil, nil, errors.New("the session's code called a host function, which this server does not offer; the session was ended")
		}
		return report(ev.Result, note)
	}
}

// decodeRunInput reads run_python's arguments: numbers in inputs are kept
// as written (json.Number), and an argument RunInput lacks is refused by
// name.
func decodeRunInput(args json.RawMessage) (RunInput, error) {
	var in RunInput
	if len(args) == 0 || string(args) == "null" {
		return in, nil
	}
	if err := checkArgKeys(args); err != nil {
		return in, err
	}
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	err := dec.Decode(&in)
	var te *json.UnmarshalTypeError
	switch {
	case err == nil:
		return in, nil
	case errors.As(err, &te) && te.Field != "":
		return in, fmt.Errorf("%s: expected %s, got a JSON %s", te.Field, jsonKind(te.Type), te.Value)
	case errors.As(err, &te):
		return in, fmt.Errorf("arguments: expected a JSON object, got a JSON %s", te.Value)
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return in, fmt.Errorf("%s: not an argument of run_python, whose arguments are code, session, inputs, profile "+
			"and timeout_seconds (paths, limits and the network are the server's configuration)", strings.Trim(name, `"`))
	}
	return in, fmt.Errorf("arguments: %v", err)
}

// runArgs are run_python's argument names, exactly.
var runArgs = map[string]bool{"code": true, "session": true, "inputs": true, "profile": true, "timeout_seconds": true}

// checkArgKeys refuses a top-level argument whose name is not exactly one
// of runArgs, or that is given twice. encoding/json alone matches names
// case-insensitively, with Unicode folding, and keeps the last of two:
// "Profile" would select a profile that a gateway vetting "profile" by
// exact name never saw. Arguments that are not a JSON object are left to
// the decoder.
func checkArgKeys(args json.RawMessage) error {
	dec := json.NewDecoder(bytes.NewReader(args))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		k, ok := t.(string)
		if err != nil || !ok {
			return nil
		}
		if !runArgs[k] {
			msg := fmt.Sprintf("%s: not an argument of run_python, whose arguments are code, session, inputs, profile "+
				"and timeout_seconds", k)
			for n := range runArgs {
				if strings.EqualFold(n, k) || strings.EqualFold(strings.ReplaceAll(k, "ſ", "s"), n) {
					msg += fmt.Sprintf("; argument names are exact and case-sensitive: did you mean %q?", n)
				}
			}
			return errors.New(msg)
		}
		if seen[k] {
			return fmt.Errorf("%s: given twice; each argument may be given once", k)
		}
		seen[k] = true
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return nil
		}
	}
	return nil
}

// jsonKind names what a Go type holds in JSON terms.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Float64, reflect.Int:
		return "a number"
	case reflect.Map:
		return "an object"
	}
	return t.String()
}

func (s *Server) resetSession(ctx context.Context, req *mcp.CallToolRequest, in ResetInput) (*mcp.CallToolResult, any, error) {
	if in.Session == "" {
		return nil, nil, errors.New("session: expected the name of a session, got an empty string")
	}
	if err := checkName(in.Session); err != nil {
		return nil, nil, err
	}
	k := sessionKey{req.Session, in.Session}
	s.mu.Lock()
	sess := s.sessions[k]
	delete(s.sessions, k)
	s.mu.Unlock()
	text := fmt.Sprintf("session %q was not open; nothing to reset", in.Session)
	if sess != nil {
		<-sess.ready
		if sess.co != nil {
			_ = sess.co.Finish(ctx)
			text = fmt.Sprintf("session %q ended; its variables are gone", in.Session)
		}
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
}

// timeout turns timeout_seconds into a duration within the ceiling.
func (s *Server) timeout(sec float64) (time.Duration, error) {
	ceiling := s.pool.Config().Limits.Timeout
	switch {
	case sec < 0:
		return 0, fmt.Errorf("timeout_seconds: expected a positive number of seconds, got %g", sec)
	case sec == 0:
		return 0, nil
	case sec > ceiling.Seconds():
		return 0, fmt.Errorf("timeout_seconds: %g exceeds the server's limit of %s", sec, ceiling)
	}
	return max(time.Duration(sec*float64(time.Second)), time.Millisecond), nil
}

func checkName(name string) error {
	if len(name) > MaxSessionName {
		return fmt.Errorf("session: a name of at most %d bytes expected, got %d", MaxSessionName, len(name))
	}
	return nil
}

// session returns the open session name of client, creating it under
// profile if needed.
func (s *Server) session(ctx context.Context, client *mcp.ServerSession, name, profile string) (*session, error) {
	k := sessionKey{client, name}
	s.mu.Lock()
	if !s.watched[client] && client != nil {
		s.watched[client] = true
		go s.watch(client)
	}
	sess := s.sessions[k]
	if sess != nil {
		s.mu.Unlock()
		select {
		case <-sess.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if sess.err != nil {
			return nil, sess.err
		}
		if profile != "" && profile != sess.profile {
			return nil, fmt.Errorf("profile: session %q runs under profile %q; a session keeps the profile it was created with (reset it to change)", name, sess.profile)
		}
		return sess, nil
	}
	sess = &session{ready: make(chan struct{}), profile: profile}
	s.sessions[k] = sess
	s.mu.Unlock()
	sess.co, sess.err = s.pool.Checkout(ctx, pynox.Job{Profile: profile})
	if sess.err != nil {
		s.forget(client, name, sess)
	}
	close(sess.ready)
	return sess, sess.err
}

// forget drops sess from the table, if it is still there.
func (s *Server) forget(client *mcp.ServerSession, name string, sess *session) {
	k := sessionKey{client, name}
	s.mu.Lock()
	if s.sessions[k] == sess {
		delete(s.sessions, k)
	}
	s.mu.Unlock()
}

// watch finishes client's sessions when it disconnects.
func (s *Server) watch(client *mcp.ServerSession) {
	_ = client.Wait()
	s.mu.Lock()
	var ended []*session
	for k, sess := range s.sessions {
		if k.client == client {
			ended = append(ended, sess)
			delete(s.sessions, k)
		}
	}
	delete(s.watched, client)
	s.mu.Unlock()
	for _, sess := range ended {
		<-sess.ready
		if sess.co != nil {
			_ = sess.co.Finish(context.Background())
		}
	}
}

// report turns a job's or step's result into the tool's answer: text
// content for the model, the same fields as structured content, and
// isError when the job failed.
func report(res *pynox.Result, note string) (*mcp.CallToolResult, any, error) {
	out := &RunOutput{
		Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		ValueRepr: res.ValueRepr, Exit: res.Exit, Error: res.Error,
		Session: res.Session, Step: res.Step, SessionEnded: res.SessionEnded, Restarted: res.Restarted,
	}
	if len(res.Value) > 0 {
		// Numbers stay as the job wrote them (no float64 rounding of
		// large integers).
		dec := json.NewDecoder(bytes.NewReader(res.Value))
		dec.UseNumber()
		_ = dec.Decode(&out.Value)
	}
	var b strings.Builder
	b.WriteString(note)
	if res.Restarted {
		b.WriteString("note: the session's previous process had ended, so this code ran in a new one whose variables start empty\n")
	}
	section := func(name, text string, cut bool) {
		if text == "" && !cut {
			return
		}
		fmt.Fprintf(&b, "[%s]\n%s", name, text)
		if !strings.HasSuffix(text, "\n") {
			b.WriteString("\n")
		}
		if cut {
			fmt.Fprintf(&b, "[%s truncated: the rest was dropped]\n", name)
		}
	}
	section("stdout", res.Stdout, res.StdoutTruncated)
	section("stderr", res.Stderr, res.StderrTruncated)
	switch {
	case len(res.Value) > 0:
		section("value", string(res.Value), false)
	case res.ValueRepr != "":
		section("value (repr)", res.ValueRepr, false)
	}
	if e := res.Error; e != nil {
		where := ""
		if e.Line != nil {
			file := "<code>"
			if e.File != nil {
				file = *e.File
			}
			where = fmt.Sprintf(" (%s, line %d)", file, *e.Line)
		}
		msg := fmt.Sprintf("%s: %s%s", e.Type, e.Message, where)
		if e.Hint != "" {
			msg += "\nhint: " + e.Hint
		}
		section("error", msg, false)
	} else if res.Exit != 0 {
		section("error", fmt.Sprintf("SystemExit: exit status %d", res.Exit), false)
	}
	if res.SessionEnded {
		b.WriteString("note: this ended the session's process; its next step starts with empty variables\n")
	}
	if b.Len() == 0 {
		b.WriteString("(no output)\n")
	}
	content := []mcp.Content{&mcp.TextContent{Text: b.String()}}
	// Rich outputs (checked by the pool): images as image content, the
	// rest (HTML, SVG, Markdown, JSON, text) as embedded resources with
	// their MIME type.
	for i, o := range res.Outputs {
		switch o.MIME {
		case "image/png", "image/jpeg":
			data, err := base64.StdEncoding.DecodeString(o.Data)
			if err != nil {
				continue // the pool passes only valid base64 on
			}
			content = append(content, &mcp.ImageContent{MIMEType: o.MIME, Data: data})
		default:
			content = append(content, &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{
				URI: fmt.Sprintf("pynox://output/%d", i+1), MIMEType: o.MIME, Text: o.Data}})
		}
	}
	structured, err := json.Marshal(out)
	if err != nil {
		return nil, nil, err
	}
	return &mcp.CallToolResult{Content: content, StructuredContent: json.RawMessage(structured), IsError: res.Err() != nil}, nil, nil
}
