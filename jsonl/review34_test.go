package jsonl

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// Review 34: a host function of a jsonl.Client whose result is too large
// to be a reply line (over MaxCallBytes, or within it but over MaxLine
// once wrapped in its reply envelope) must not leave the job's call
// waiting until the job's timeout: the pool discards such a line (or
// refuses the reply) and no correct reply ever follows. The call must
// fail promptly in the job (HostError), and the job go on.
func TestReview34ClientOversizedHostResult(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	c := startClient(t, p)
	for _, n := range []int{pynox.MaxCallBytes - 10, 2 * pynox.MaxCallBytes} {
		host := func(ctx context.Context, call *pynox.Call) (any, error) {
			return strings.Repeat("x", n), nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		start := time.Now()
		res, err := c.Run(ctx, pynox.Job{Functions: []string{"big"}, Host: host, Timeout: 20 * time.Second,
			Code: "from pynox_host import big, HostError\ntry:\n    v = big()\n    print('len', len(v))\nexcept HostError as e:\n    print('HostError')\n"})
		cancel()
		require.NoError(t, err)
		took := time.Since(start)
		require.Nil(t, res.Error, "n=%d: the job failed (after %v): %+v", n, took, res.Error)
		require.Less(t, took, 10*time.Second, "n=%d: the call waited %v for a reply that never came; stdout %q", n, took, res.Stdout)
		require.Equal(t, "HostError\n", res.Stdout)
	}
	// An error text too long for a reply line, plain and typed.
	for _, typ := range []string{"", "KeyError"} {
		host := func(ctx context.Context, call *pynox.Call) (any, error) {
			return nil, &pynox.HostError{Type: typ, Message: strings.Repeat("e", 2*MaxLine)}
		}
		start := time.Now()
		res, err := c.Run(context.Background(), pynox.Job{Functions: []string{"bad"}, Host: host, Timeout: 20 * time.Second,
			Code: "from pynox_host import bad, HostError\ntry:\n    bad()\nexcept HostError as e:\n    print('HostError')\n"})
		require.NoError(t, err)
		require.Nil(t, res.Error, "type %q: the job failed (after %v): %+v", typ, time.Since(start), res.Error)
		require.Equal(t, "HostError\n", res.Stdout)
	}
}

// Review 34: every error of the configuration file names its key (the
// brief: "each must be a clear error naming the flag or key"). An integer
// too large for 64 bits named only the line; a size of 0 passed silently
// for "not set" (the default, 1g of memory or 256m per file), although
// docs/protocol.md says sizes are positive and a request's "memory": 0
// is refused.
func TestReview34ConfigErrorsNameTheKey(t *testing.T) {
	tests := []struct{ content, want string }{
		{"[pool]\nworkers = 99999999999999999999\n", `:2: pool.workers: `},
		{"[pool]\nmax_sessions = 99999999999999999999\n", `:2: pool.max_sessions: `},
		{"[pool.limits]\nmemory = 99999999999999999999\n", `:2: pool.limits.memory: `},
		{"[pool.limits]\nmemory = 0\n", `:2: pool.limits.memory: `},
		{"[pool.limits]\nmax_file_size = 0\n", `:2: pool.limits.max_file_size: `},
		{"[pool.limits]\nmax_output = 0\n", `:2: pool.limits.max_output: `},
		{"[profiles.a]\nmemory = 0\n", `:2: profiles.a.memory: `},
	}
	for i, tc := range tests {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			path := writeFile(t, filepath.Join(t.TempDir(), "pynox.toml"), tc.content)
			_, err := LoadConfig(path)
			require.Error(t, err, "%q was accepted", tc.content)
			require.Contains(t, err.Error(), path+tc.want)
		})
	}
}

// Review 34: a JSON null where a request takes a string inside an array
// or an object ("args": [null], "env": {"A": null}) was decoded by
// encoding/json as "" and run: the job got an empty argument or an empty
// variable the client never wrote. docs/protocol.md: "a value of the
// wrong type" is a RequestError naming the field. (A null field, such as
// "timeout": null, stays "not set".) A line that is JSON null is not a
// request object either, and must be told so.
func TestReview34NullIsNoString(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	lines := serveLines(t, p, strings.Join([]string{
		`{"id": "args", "code": "import sys; print(sys.argv)", "args": [null, "x"]}`,
		`{"id": "env", "code": "import os; print(repr(os.environ.get('A')))", "env": {"A": null}}`,
		`{"id": "collect", "code": "print(1)", "collect": [null]}`,
		`null`,
		`{"id": "ok", "code": "print(1)", "timeout": null, "args": null}`,
	}, "\n")+"\n")
	got := byID(t, lines)
	for id, field := range map[string]string{"args": "args", "env": "env", "collect": "collect"} {
		r := got[id]
		require.NotNil(t, r, "%s: no answer: %v", id, lines)
		require.NotNil(t, r["error"], "%s: null taken for a string: stdout %q", id, r["stdout"])
		e := r["error"].(map[string]any)
		require.Equal(t, "RequestError", e["type"], id)
		require.Contains(t, e["message"], field, id)
		require.Contains(t, e["message"], "null", id)
	}
	require.Equal(t, "1\n", got["ok"]["stdout"])
	var nullAnswer map[string]any
	for _, l := range lines[1:] {
		if l["id"] == nil {
			nullAnswer = l
		}
	}
	require.NotNil(t, nullAnswer)
	require.Contains(t, nullAnswer["error"].(map[string]any)["message"], "must be a JSON object")
}

// Review 34: a duration or a size too large for the pool was refused as
// if it had no unit ("want a number with a unit, such as \"5s\""), which
// it had: the message must say it is too large, and what the bound is.
func TestReview34UnitOverflowSaysTooLarge(t *testing.T) {
	for line, field := range map[string]string{
		`{"id": 1, "code": "1", "timeout": "99999999999h"}`:         "timeout",
		`{"id": 1, "code": "1", "memory": "99999999999999999g"}`:    "memory",
		`{"id": 1, "code": "1", "max_file_size": "9999999999999t"}`: "max_file_size",
		`{"id": 1, "code": "1", "memory": 99999999999999999999}`:    "memory",
	} {
		_, err := decodeRequest([]byte(line))
		require.NotNil(t, err, line)
		require.Contains(t, err.Message, field+": ", line)
		require.Contains(t, err.Message, "too large", line)
		require.NotContains(t, err.Message, "with a unit, such as", line)
	}
}

// Review 34: a reply whose result is over the 1 MiB a call takes is a
// line over MaxLine (MaxCallBytes == MaxLine), so the documented refusal
// of a too-large reply, which names its call_id ("A reply that is
// malformed, too large, or reaches no waiting call is answered with a
// refusal of this shape ... the call_id it named"), was never written:
// the line was refused as a job line, id null and no call_id, and the
// client could not tell which of its calls still waited. The refusal must
// name the call_id, and the call must still take a correct reply.
func TestReview34TooLongReplyNamesItsCall(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	served := make(chan error, 1)
	go func() {
		served <- Serve(context.Background(), p, inR, outW)
		outW.Close()
	}()
	sc := bufio.NewScanner(outR)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	next := func() map[string]any {
		require.True(t, sc.Scan())
		m, err := decodeLine(sc.Bytes())
		require.NoError(t, err)
		return m
	}
	next() // ready
	send := func(line string) {
		_, err := io.WriteString(inW, line+"\n")
		require.NoError(t, err)
	}
	send(`{"id": "j", "functions": ["f"], "timeout": "20s", "code": "from pynox_host import f, HostError\ntry:\n    f()\nexcept HostError as e:\n    print('HostError', e)"}`)
	call := next()
	require.Equal(t, "call", call["event"])
	callID := call["call_id"].(json.Number).String()
	for _, head := range []string{`{"reply":{"call_id":` + callID + `,"result":"`, `{"reply": {"call_id": ` + callID + `, "result": "`} {
		send(head + strings.Repeat("x", MaxLine) + `"}}`)
		r := next()
		require.Nil(t, r["id"])
		require.Equal(t, json.Number(callID), r["call_id"], "the refusal of a too-long reply names no call: %v", r)
		require.Equal(t, "RequestError", r["error"].(map[string]any)["type"])
		require.NotContains(t, r, "stdout", "a reply's refusal has the reply refusal's shape: %v", r)
	}
	send(`{"reply": {"call_id": ` + callID + `, "error": "too big"}}`)
	r := next()
	require.Equal(t, "j", r["id"])
	require.Equal(t, "HostError too big\n", r["stdout"])
	inW.Close()
	for sc.Scan() {
	}
	require.NoError(t, <-served)
}

// Review 34: when Serve's ctx ends (SIGTERM to `pynox pool`) the reading
// stops, and a host call waiting for its reply fails in its job. It
// failed with "the client closed its input, so no reply can come", which
// the client had not done: the message must say the pool is shutting
// down.
func TestReview34ShutdownFailsCallsWithItsReason(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- Serve(ctx, p, inR, outW)
		outW.Close()
	}()
	defer inW.Close()
	sc := bufio.NewScanner(outR)
	next := func() map[string]any {
		require.True(t, sc.Scan())
		m, err := decodeLine(sc.Bytes())
		require.NoError(t, err)
		return m
	}
	next() // ready
	_, err := io.WriteString(inW, `{"id": "j", "functions": ["f"], "code": "from pynox_host import f\nf()"}`+"\n")
	require.NoError(t, err)
	require.Equal(t, "call", next()["event"])
	cancel()
	r := next()
	require.Equal(t, "j", r["id"])
	msg := r["error"].(map[string]any)["message"].(string)
	require.NotContains(t, msg, "the client closed its input")
	require.Contains(t, msg, "shutting down")
	require.NoError(t, <-served)
}

// Review 34: docs/protocol.md (Limits and errors of calls): "A result is
// held to the rule of arguments: ... no key repeated in an object. One
// that breaks it reaches the call as an error: the job's call raises
// HostError ..., and the job goes on (such a result used to leave the job
// waiting until its timeout)." The line's strict key check refused such
// a reply first, as a job line (no call_id), and the call waited until
// the job's timeout. The reply is still refused (the key check's
// message), naming its call_id, and the call fails with HostError.
func TestReview34RepeatedKeyResultFailsTheCall(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	served := make(chan error, 1)
	go func() {
		served <- Serve(context.Background(), p, inR, outW)
		outW.Close()
	}()
	sc := bufio.NewScanner(outR)
	next := func() map[string]any {
		require.True(t, sc.Scan())
		m, err := decodeLine(sc.Bytes())
		require.NoError(t, err)
		return m
	}
	next() // ready
	send := func(line string) {
		_, err := io.WriteString(inW, line+"\n")
		require.NoError(t, err)
	}
	send(`{"id": "j", "functions": ["f"], "timeout": "20s", "code": "from pynox_host import f, HostError\ntry:\n    print(f())\nexcept HostError as e:\n    print('HostError', e)"}`)
	call := next()
	require.Equal(t, "call", call["event"])
	callID := call["call_id"].(json.Number).String()
	start := time.Now()
	send(`{"id": "r", "reply": {"call_id": ` + callID + `, "result": {"a": 1, "a": 2}}}`)
	got := map[string]map[string]any{}
	for len(got) < 2 {
		r := next()
		got[fmt.Sprint(r["id"])] = r
	}
	require.Equal(t, json.Number(callID), got["r"]["call_id"], "%v", got["r"])
	require.Contains(t, got["r"]["error"].(map[string]any)["message"], `reply.result: key "a" appears twice`)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Contains(t, got["j"]["stdout"], "HostError", "%v", got["j"])
	require.Contains(t, got["j"]["stdout"], "repeats the key")
	inW.Close()
	for sc.Scan() {
	}
	require.NoError(t, <-served)
}

// Review 34: docs/protocol.md: "A reply that is malformed, too large, or
// reaches no waiting call ... is answered with a refusal of this shape"
// ({"id", "call_id", "exit": -1, "error"}: "the call_id it named (null if
// none)"). A reply line refused by the strict decoding (an unknown or
// repeated key, a wrong type) was answered as a job line instead: a
// result's shape, without call_id.
func TestReview34MalformedReplyRefusalShape(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	lines := serveLines(t, p, strings.Join([]string{
		`{"id": "a", "reply": {"call_id": 7, "result": 1}, "extra": 1}`,
		`{"id": "b", "reply": {"call_id": 8, "reslt": 1}}`,
		`{"id": "c", "reply": {"call_id": 9, "error": 5}}`,
		`{"id": "d", "reply": {"call_id": "x", "result": 1}}`,
		`{"id": "e", "reply": {"call_id": null, "reslt": 1}}`,
	}, "\n")+"\n")
	got := byID(t, lines)
	for id, callID := range map[string]any{"a": json.Number("7"), "b": json.Number("8"), "c": json.Number("9"), "d": nil, "e": nil} {
		r := got[id]
		require.NotNil(t, r, id)
		require.Contains(t, r, "call_id", "%s: %v", id, r)
		require.Equal(t, callID, r["call_id"], id)
		require.NotContains(t, r, "stdout", "%s: a reply's refusal is not a result: %v", id, r)
		require.Equal(t, "RequestError", r["error"].(map[string]any)["type"], id)
	}
}

// Review 34: "restore" takes a dump as a base64 string; a number there
// was refused with "expected an array", which is no form restore takes.
func TestReview34RestoreWrongTypeSaysBase64(t *testing.T) {
	for _, v := range []string{`5`, `true`, `{}`} {
		_, err := decodeRequest([]byte(`{"id": 1, "session": "s", "code": "1", "restore": ` + v + `}`))
		require.NotNil(t, err, v)
		require.Contains(t, err.Message, "restore: ", v)
		require.Contains(t, err.Message, "base64", v)
		require.NotContains(t, err.Message, "expected an array", v)
	}
}

// Review 34: a profile's setting beyond the ceiling was refused naming
// the request field ("timeout 1h0m0s exceeds the pool's ceiling",
// "allow_network: ..."), although the request did not set it: the
// message must name the profile that did, as the write grants' already
// does ("profile \"x\" allow_write").
func TestReview34ProfileRefusalNamesTheProfile(t *testing.T) {
	dir := t.TempDir()
	p := newTestPool(t, pynox.Config{Dir: dir, Workers: 1, Profiles: map[string]pynox.Profile{
		"slow": {Timeout: time.Hour},
		"net":  {AllowNetwork: true},
		"big":  {Memory: 1 << 40},
		"rd":   {AllowRead: []string{"/etc"}},
	}})
	lines := serveLines(t, p, strings.Join([]string{
		`{"id": "slow", "code": "1", "profile": "slow"}`,
		`{"id": "net", "code": "1", "profile": "net"}`,
		`{"id": "big", "code": "1", "profile": "big"}`,
		`{"id": "rd", "code": "1", "profile": "rd"}`,
		`{"id": "own", "code": "1", "profile": "slow", "timeout": "2h"}`,
	}, "\n")+"\n")
	got := byID(t, lines)
	for _, id := range []string{"slow", "net", "big", "rd"} {
		msg := got[id]["error"].(map[string]any)["message"].(string)
		require.Contains(t, msg, `profile "`+id+`"`, id)
	}
	msg := got["own"]["error"].(map[string]any)["message"].(string)
	require.NotContains(t, msg, "profile", "the request's own timeout is the request's")
}

// Review 34: the "too large" message is only for well-formed durations.
func TestReview34MalformedDurationNotTooLarge(t *testing.T) {
	for _, v := range []string{"s", ".s", "5", "1e3s", "5 parsecs", "-"} {
		_, err := pynox.ParseDuration(v)
		require.Error(t, err, v)
		require.NotContains(t, err.Error(), "too large", v)
		require.Contains(t, err.Error(), "want a number with a unit", v)
	}
	for _, v := range []string{"99999999999h", "3000000h1s", "+9999999999999999999ns", "106751.99999999999d"} {
		_, err := pynox.ParseDuration(v)
		require.Error(t, err, v)
		if v != "106751.99999999999d" { // "d" is no unit
			require.Contains(t, err.Error(), "too large", v)
		}
	}
}
