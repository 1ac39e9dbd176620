package jsonl

// Review 27: an outside review of the front door after reviews 23 and 24
// (decodeRequest, checkUTF8, recoverID, topValues). Each probe asserts
// the safe behaviour.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// review27Lines are request lines meant to make the decoder panic, or to
// make a refusal echo an id that is not the line's own top-level id: ids
// nested in other values, keys spelt with escapes or in another case,
// lines cut inside strings, escapes and numbers, lone and paired
// surrogates, bytes that are not UTF-8, deep nesting.
var review27Lines = []string{
	`{"inputs": {"id": "nested"}, "id": "own", "code": "x" oops}`,
	`{"inputs": {"id": "nested"}, "code": "x" oops}`,
	`{"inputs": ["id", "nested"], "code": "x", "id"`,
	`{"inputs": {"id": "nested"`,
	`{"\u0069d": "esc", "id": "plain", "code": "x"}`,
	`{"\u0069d": "esc", "code": "x" oops}`,
	`{"ID": "upper", "code": "x"}`,
	`{"Id": "upper", "code": "x" oops}`,
	`{"id": "a\"b", "code": "x" oops}`,
	`{"id": "a\`,
	`{"id": "a\u00`,
	`{"id": "\ud800", "code": "x"}`,
	`{"id": "\ud83d\ude00", "code": "x" oops}`,
	`{"id": "\ud83d\u0041", "code": "x"}`,
	`{"id": "\udc00\ud800", "code": "x"}`,
	`{"id": "ok", "session": "\ud800x", "code": "x"}`,
	`{"id": "ok", "cancel": "\udfff"}`,
	"{\"id\": \"a\xffb\", \"code\": \"x\"}",
	"{\"id\": \"ok\", \"code\": \"\xff\"}",
	"{\"id\": \"ok\", \"session\": \"s\xc3\", \"code\": \"x\"}",
	"{\"id\": \"ok\xc3\xa9\", \"code\": \"x\" oops}",
	`{"id": 1e3, "code": "x"}`,
	`{"id": -0, "code": "x" oops}`,
	`{"id": 00, "code": "x"}`,
	`{"id": 1.5`,
	`{"id": 99999999999999999999999, "code": "x" oops}`,
	`{"id": true, "code": "x" oops}`,
	`{"id": null, "code": "x" oops}`,
	`{"id": "x", "id": "y"}`,
	`{"id": "x", "\u0069\u0064": "y"}`,
	`{"id": "x", "inputs": ` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`,
	`{"id": "deep", "inputs": ` + strings.Repeat(`{"a":`, 300) + `1` + strings.Repeat("}", 300) + `}`,
	`{"session": "", "id": "empty-session", "code": "x"}`,
	`{"session": "s", "reply": {"id": 1, "result": "\ud800"}, "id": "r"}`,
	`{"reply": {"id": "\xff", "result": 1}, "id": "r"}`,
	`{"mounts": [{"host": "/tmp", "HOST": "/etc"}], "id": "m", "code": "x"}`,
	`{"mounts": [[{"host": "/tmp"}]], "id": "m2", "code": "x"}`,
	`{"id": "tail", "code": "x"} {"id": "other"}`,
	`{"id": "tail2", "code": "x"}]`,
	`[{"id": "arr"}]`,
	`"id"`,
	`{`,
	`{"`,
	`{"id"`,
	`{"id":`,
	`{"id": "`,
	`{"id": "\`,
	`{"id": "\u`,
	`{"id": "\ud83d\`,
	`{"id": "\ud83d\u`,
	`{"id": -`,
	`{"id": 1,`,
	"\xef\xbb\xbf{\"id\": \"bom\", \"code\": \"x\"}",
	"{\"id\": \"nul\u0000\", \"code\": \"x\"}",
	"{\"id\": \"ctl\x01\", \"code\": \"x\"}",
}

// review27Check fails t unless a refusal's id v may be the line's own:
// its JSON (no HTML escaping) appears in the line, when the line has no
// backslash (escapes could spell it otherwise), and is not nested.
func review27Check(t testing.TB, line []byte, v any) {
	if v == nil {
		return
	}
	switch v.(type) {
	case string, json.Number:
	default:
		t.Fatalf("line %q: id %#v is neither a string nor a number", line, v)
	}
	if bytes.IndexByte(line, '\\') >= 0 {
		return
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(v))
	lit := bytes.TrimSuffix(b.Bytes(), []byte("\n"))
	if !bytes.Contains(line, lit) {
		t.Fatalf("line %q: refusal echoes id %s, which the line does not hold", line, lit)
	}
	if s, ok := v.(string); ok && strings.ContainsRune(s, utf8.RuneError) && !utf8.Valid(line) {
		t.Fatalf("line %q: id %q was altered in decoding", line, s)
	}
}

// Probe 1: no line panics the decoder, and whatever it answers carries
// either no id or the line's own top-level id, as written.
func TestReview27DecodeRequestLines(t *testing.T) {
	for _, l := range review27Lines {
		line := []byte(l)
		req, err := func() (req request, err *pynox.Error) {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("line %q panicked the decoder: %v", l, r)
				}
			}()
			return decodeRequest(line)
		}()
		if err != nil {
			review27Check(t, line, req.ID)
		}
	}
	// The id nested in another value is never echoed, whatever follows.
	for _, l := range review27Lines[:4] {
		req, err := decodeRequest([]byte(l))
		require.NotNil(t, err, l)
		require.NotEqual(t, "nested", req.ID, "line %q was refused with the id of a nested object", l)
	}
	// A lone surrogate or a byte that is not UTF-8 in an id is refused
	// with no id (two ids that differ only there would be one).
	for _, l := range []string{`{"id": "\ud800", "code": "x"}`, "{\"id\": \"a\xffb\", \"code\": \"x\"}", `{"id": "\udc00\ud800", "code": "x"}`, `{"id": "\ud83d\u0041", "code": "x"}`} {
		req, err := decodeRequest([]byte(l))
		require.NotNil(t, err, l)
		require.Nil(t, req.ID, l)
	}
}

// Probe 2: served together, every request line gets exactly one answer
// (a line that holds two objects is one refused line, not two requests),
// and no answer carries an id that no line holds at the top level.
func TestReview27OneAnswerPerLine(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	var lines []string
	for _, l := range review27Lines {
		if strings.Contains(l, "\n") {
			continue
		}
		// No job may run for long: every code is "x" (a NameError) or is
		// refused before it runs.
		lines = append(lines, l)
	}
	out := serveLines(t, p, strings.Join(lines, "\n"))
	var answers []map[string]any
	for _, m := range out {
		if m["event"] == "ready" || m["event"] == "stats" {
			continue
		}
		answers = append(answers, m)
	}
	// Every line is answered once: a refusal, or a job's result.
	require.Len(t, answers, len(lines), "%v", answers)
	seen := map[string]int{}
	for _, a := range answers {
		if a["id"] != nil {
			seen[fmt.Sprint(a["id"])]++
		}
	}
	for id, n := range seen {
		require.NotEqual(t, "nested", id)
		require.NotEqual(t, "other", id, "the second object of a line was taken as a request")
		require.NotEqual(t, "arr", id)
		require.NotEqual(t, "upper", id)
		if id == "esc" || id == "plain" {
			// Only the line whose sole id is spelt "\u0069d" may echo it.
			require.Equal(t, "esc", id, "an id echoed from a line with two ids")
			require.Equal(t, 1, n)
		}
	}
}

// FuzzReview27DecodeRequest: run with -fuzz for the same properties on
// mutated lines (the seed corpus runs as a test).
func FuzzReview27DecodeRequest(f *testing.F) {
	for _, l := range review27Lines {
		if len(l) < 4096 {
			f.Add([]byte(l))
		}
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		req, err := decodeRequest(line)
		if err != nil {
			review27Check(t, line, req.ID)
		}
		_ = recoverID(line)
	})
}

// Probe 3: lines at the bound, ended by "\r\n": one of MaxLine bytes
// runs, one of MaxLine+1 bytes (or MaxLine and a stray "\r") is refused
// as too long, each with exactly one answer, and the line after each is
// read as its own request (no line is split into two, or two joined).
func TestReview27LineBoundCRLF(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	mk := func(id string, size int) string {
		head := `{"id": "` + id + `", "code": "print(len(pad))", "inputs": {"pad": "`
		tail := `"}}`
		return head + strings.Repeat("p", size-len(head)-len(tail)) + tail
	}
	exact := mk("exact", MaxLine)
	over := mk("over", MaxLine+1)
	in := exact + "\r\n" + `{"id": "after1", "code": "print(1)"}` + "\r\n" +
		over + "\r\n" + `{"id": "after2", "code": "print(2)"}` + "\r\n" +
		exact[:len(exact)] + "\r\r\n" + `{"id": "after3", "code": "print(3)"}` + "\n" +
		over[:MaxLine-1] + "\r\n" + `{"id": "after4", "code": "print(4)"}`
	out := serveLines(t, p, in)
	got := map[string]int{}
	for _, m := range out {
		if m["event"] == "ready" {
			continue
		}
		got[fmt.Sprint(m["id"])]++
		if m["id"] == "exact" {
			require.Nil(t, m["error"], "%v", m)
		}
	}
	// exact runs; over and exact+"\r" are too long (no id); over cut to
	// MaxLine-1 bytes is invalid JSON that names its id "over" (a string
	// id whose closing quote was read: the line's own).
	require.Equal(t, map[string]int{"exact": 1, "after1": 1, "after2": 1, "after3": 1, "after4": 1, "<nil>": 2, "over": 1}, got)
}
