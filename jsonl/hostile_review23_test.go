package jsonl

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// Review 23: the front door of the pool protocol.

// TestReview23InvalidUTF8Identifiers: encoding/json turns every byte that
// is not UTF-8 in a string into U+FFFD, so two requests whose ids differ
// only in such bytes ("a\xff", "a\xfe") were both answered with the id
// "a\ufffd" (the client cannot tell which answer is whose, and a cancel
// of one ended both), and two session names that differ so ("s\xff",
// "s\xfe") were one session: the second client's step saw the first's
// globals. An id, session or cancel that is not UTF-8 cannot be echoed
// "as written", so it is refused, naming the field; the id is echoed
// null then.
func TestReview23InvalidUTF8Identifiers(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	in := strings.Join([]string{
		"{\"id\": \"a\xff\", \"code\": \"print(1)\"}",
		"{\"id\": \"a\xfe\", \"code\": \"print(2)\"}",
		"{\"id\": \"s1\", \"session\": \"s\xff\", \"code\": \"secret = 42\"}",
		"{\"id\": \"s2\", \"session\": \"s\xfe\", \"code\": \"print(secret)\"}",
		"{\"id\": \"c1\", \"cancel\": \"a\xff\"}",
		"{\"id\": \"code\", \"code\": \"print('\xff')\"}",
	}, "\n") + "\n"
	out := serveLines(t, p, in)
	answers := map[string]int{}
	for _, l := range out[1:] {
		t.Logf("%v", l)
		answers[fmt.Sprint(l["id"])]++
	}
	require.Zero(t, answers["a\ufffd"], "an id that is not UTF-8 was echoed altered (twice): %v", answers)
	for _, l := range out[1:] {
		if l["id"] == "s2" {
			require.NotEqual(t, "42\n", l["stdout"], "session \"s\\xfe\" saw the globals of session \"s\\xff\"")
		}
	}
	got := byID(t, out[:1])
	for _, l := range out[1:] {
		if id, ok := l["id"].(string); ok {
			got[id] = l
		}
	}
	require.Equal(t, "RequestError", errType(got["code"]), "code that is not UTF-8 reached the job altered: %v", got["code"])
	require.Contains(t, errMessage(got["code"]), "not valid UTF-8 at column 32")
	for _, l := range out[1:] {
		if l["id"] == nil {
			require.Equal(t, "RequestError", errType(l), "%v", l)
			require.Contains(t, errMessage(l), "UTF-8", "%v", l)
		}
	}
}

// TestReview23LongestLineWithCRLF: a line may end in "\r\n", and a line
// is at most MaxLine bytes "newline excluded": a request of exactly
// MaxLine bytes ended by "\r\n" must be read, not discarded as too long.
func TestReview23LongestLineWithCRLF(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	mk := func(id string) string {
		head := `{"id": "` + id + `", "code": "#`
		tail := `\nprint(7)"}`
		return head + strings.Repeat("x", MaxLine-len(head)-len(tail)) + tail
	}
	lf, crlf, eof := mk("lf"), mk("crlf"), mk("eof")
	require.Len(t, crlf, MaxLine)
	out := serveLines(t, p, lf+"\n"+crlf+"\r\n"+eof)
	got := byID(t, out)
	for _, id := range []string{"lf", "crlf", "eof"} {
		require.NotNil(t, got[id], "the %s line of exactly MaxLine bytes got no answer of its own: %v", id, got)
		require.Equal(t, "7\n", got[id]["stdout"], "%s: %v", id, got[id]["error"])
	}
}

// TestReview23InvalidUTF8ReplyResult: the UTF-8 rule of request lines
// leaves a reply's result to the documented path, also on the slow
// decoder (a reply line with spaces): the job's call raises HostError and
// the reply gets no answer line.
func TestReview23InvalidUTF8ReplyResult(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": "r", "functions": ["f"], "code": "from pynox_host import f, HostError\ntry:\n    f()\nexcept HostError as e:\n    print('host error')"}`)
	c := ls.call()
	ls.send(fmt.Sprintf("{\"reply\": {\"call_id\": %v, \"result\": \"\xff\"}}", c["call_id"]))
	res := ls.await("r")
	require.Nil(t, res["error"], "%v", res)
	require.Equal(t, "host error\n", res["stdout"])
	rest := ls.finish()
	require.Empty(t, rest, "a reply that reached its call was answered")
}

// TestReview23LoneSurrogateIdentifiers: the same collapse through escapes.
// encoding/json decodes a \u escape of a lone UTF-16 surrogate
// ("\ud800", "\udc00") to U+FFFD, so ids "a\ud800" and "a\udbff" were
// answered as one id and session names "s\ud800" and "s\udc00" shared one
// session. Such a string has no UTF-8 form to echo; it is refused.
func TestReview23LoneSurrogateIdentifiers(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	in := strings.Join([]string{
		`{"id": "a\ud800", "code": "print(1)"}`,
		`{"id": "a\udbff", "code": "print(2)"}`,
		`{"id": "s1", "session": "s\ud800", "code": "secret = 42"}`,
		`{"id": "s2", "session": "s\udc00", "code": "print(secret)"}`,
		`{"id": "c1", "cancel": "a\ud800"}`,
		// A pair is one character, and stays accepted.
		`{"id": "pair\ud83d\ude00", "code": "print(3)"}`,
	}, "\n") + "\n"
	out := serveLines(t, p, in)
	answers := map[string]int{}
	for _, l := range out[1:] {
		t.Logf("%v", l)
		answers[fmt.Sprint(l["id"])]++
		if l["id"] == "s2" {
			require.NotEqual(t, "42\n", l["stdout"], "session \"s\\udc00\" saw the globals of session \"s\\ud800\"")
		}
		if l["id"] == nil {
			require.Equal(t, "RequestError", errType(l), "%v", l)
		}
	}
	require.Zero(t, answers["a\ufffd"], "ids with lone surrogates were echoed altered: %v", answers)
	require.Equal(t, 1, answers["pair\U0001F600"], "%v", answers)
}

func TestReview23LoneSurrogateScan(t *testing.T) {
	for raw, want := range map[string]bool{
		`"a"`: false, `"\ud800"`: true, `"\uDC00"`: true, `"\ud83d\ude00"`: false, `"\ud83d\u0041"`: true,
		`"\\ud800"`: false, `"\\\ud800"`: true, `"\ud83d"`: true, `"x\ud83d\ude00\udc00"`: true, `"\u00e9"`: false, `7`: false,
	} {
		require.Equal(t, want, loneSurrogate([]byte(raw)), raw)
		var s string
		if json.Unmarshal([]byte(raw), &s) == nil && !want {
			require.NotContains(t, s, "\ufffd", "%s decodes with U+FFFD yet was not flagged", raw)
		}
	}
}

// TestReview23RefusalEchoesReadableID: "The id is echoed in a refusal
// whenever it could be read". A line that stopped being JSON after its
// id (cut short by EOF, a stray NUL, nesting deeper than the decoder
// takes) was refused with id null, so the client could not match the
// refusal to its request. The id is read token by token up to where the
// line breaks; a second id, or an id that is not a string or a number,
// is still echoed as null.
func TestReview23RefusalEchoesReadableID(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	lines := []string{
		`{"id": "deep", "code": "print(1)", "inputs": {"a": ` + deep + `}}`,
		"{\"id\": \"nul\", \"code\": \"print(1)\"\x00}",
		`{"id": 7, "env": {"A": "b"}, "code": "print(1)",, }`,
		`{"id": "dup", "code": "x", "id": "again", oops}`,
		`{"id": ["arr"], "code": "x" oops}`,
		`{"id": "ok", "code": "print('ok')"}`,
		`{"id": "cut", "code": "pri`, // the last line, cut short by EOF
	}
	out := serveLines(t, p, strings.Join(lines, "\n"))
	require.Len(t, out, len(lines)+1, "one answer per line")
	ids := map[string]int{}
	for _, l := range out[1:] {
		ids[fmt.Sprint(l["id"])]++
		if l["id"] != "ok" {
			require.Equal(t, "RequestError", errType(l), "%v", l)
		}
		if l["id"] == "deep" {
			require.Contains(t, errMessage(l), "more than 10000 deep")
		}
	}
	require.Equal(t, map[string]int{"deep": 1, "nul": 1, "7": 1, "<nil>": 2, "ok": 1, "cut": 1}, ids)
}

// TestReview23EmptySessionName: {"session": "", "code": "x = 1"} ran as a
// one-shot job, silently: the client that named a session (with a name
// its own code left empty) lost its globals at every step. An empty name
// is refused, naming the field; a close or dump of it was refused already.
func TestReview23EmptySessionName(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	out := serveLines(t, p, strings.Join([]string{
		`{"id": "e1", "session": "", "code": "x = 1"}`,
		`{"id": "e2", "sessio\u006e": "", "code": "x = 1"}`,
		`{"id": "e3", "session": "", "stats": true}`,
		`{"id": "ok", "code": "print('ok')", "name": "session"}`,
	}, "\n")+"\n")
	got := byID(t, out)
	for _, id := range []string{"e1", "e2", "e3"} {
		require.Equal(t, "RequestError", errType(got[id]), "%s ran: %v", id, got[id])
		require.Contains(t, errMessage(got[id]), `session: "" names no session`)
	}
	require.Equal(t, "ok\n", got["ok"]["stdout"])
}

// TestReview23NameWithNUL: a `name` holding a NUL (a file name no file
// system has) was handed to compile(), and the job answered exit 1 with a
// Python ValueError ("embedded null character") as if its code had
// raised; it is a request's mistake, refused before anything runs and
// naming the field, in a job and in a session's step (the session lives).
func TestReview23NameWithNUL(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	out := serveLines(t, p, strings.Join([]string{
		`{"id": "j", "code": "print(1)", "name": "a\u0000b.py"}`,
		`{"id": "s1", "session": "nb", "code": "x = 5"}`,
		`{"id": "s2", "session": "nb", "code": "print(x)", "name": "c\u0000"}`,
		`{"id": "s3", "session": "nb", "code": "print(x)", "name": "ok.py"}`,
	}, "\n")+"\n")
	got := byID(t, out)
	for _, id := range []string{"j", "s2"} {
		require.Equal(t, "RequestError", errType(got[id]), "%s: %v", id, got[id])
		require.Contains(t, errMessage(got[id]), "name: ")
	}
	require.Equal(t, "5\n", got["s3"]["stdout"], "%v", got["s3"])
}

// TestReview23MountKeysExact: "A key must be exactly one of the field
// names … No object may repeat a key — in the request or in any object
// inside it". The exact-key scan did not descend into arrays of objects,
// so inside "mounts" encoding/json's case folding applied: {"host": "a",
// "HOST": "b"} mounted b (the last of two spellings), "Mode": "rw" granted
// a read-write mount that a front end vetting "mode" by exact key would
// not see, and "hoſt" (a long s) was "host". Each is refused now, naming
// mounts[] and the field meant.
func TestReview23MountKeysExact(t *testing.T) {
	for line, want := range map[string]string{
		`{"id": 1, "code": "1", "mounts": [{"host": "a", "HOST": "b"}]}`:                `mounts[]: unknown field "HOST": field names are exact and case-sensitive; did you mean "host"?`,
		`{"id": 2, "code": "1", "mounts": [{"host": "a", "Mode": "rw"}]}`:               `mounts[]: unknown field "Mode"`,
		`{"id": 3, "code": "1", "mounts": [{"host": "a"}, {"hoſt": "b"}]}`:              `mounts[]: unknown field "hoſt"`,
		`{"id": 4, "code": "1", "mounts": [{"host": "a", "path": "/x", "path": "/y"}]}`: `mounts[]: key "path" appears twice`,
		`{"id": 5, "code": "1", "mounts": [{"host": "a", "extra": 1}]}`:                 `mounts[]: unknown field "extra"; the fields of "mounts" are host, mode, path, write_bytes_limit`,
	} {
		req, err := decodeRequest([]byte(line))
		require.NotNil(t, err, "%s was accepted: %+v", line, req.Mounts)
		require.Contains(t, err.Message, want, line)
		require.NotNil(t, req.ID, "the id is echoed: %s", line)
	}
	req, err := decodeRequest([]byte(`{"id": 6, "code": "1", "mounts": [{"host": "a", "mode": "rw", "path": "/x", "write_bytes_limit": "1m"}]}`))
	require.Nil(t, err)
	require.Len(t, req.Mounts, 1)
}
