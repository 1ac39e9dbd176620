package jsonl

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// Review 24: the front door of the pool protocol, after review 23.

// TestReview24CutNumberIDNotEchoed: review 23 echoes the id read before a
// line stops being JSON. A string id is whole once its closing quote is
// read, but a number is a number at every digit: the last line
// {"id": 123, ...} cut short by EOF after "12" was refused with id 12,
// the id of another request in flight, whose client then took the
// refusal for that request's answer (and saw two answers to it); "12x"
// and "12 34" were echoed 12 too. A number id is echoed only when a ","
// or "}" shows where it ends; a string id, or a number so ended, still is.
// (A second "id" whose value cannot be read is echoed null: that held.)
func TestReview24CutNumberIDNotEchoed(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	out := serveLines(t, p, strings.Join([]string{
		`{"id": 12, "code": "print('twelve')"}`,
		`{"id": 12x, "code": "print(1)"}`,
		`{"id": 12 34, "code": "print(1)"}`,
		`{"id": 7 , "code": "print(1)",, }`,
		`{"id": "s", "code": "print(1)" oops}`,
		`{"id": "twice", "code": "print(1)", "id": oops}`, // a second id, unreadable: not echoed either
		`{"id": 12`, // the last line, cut short by EOF (the client wrote 123)
	}, "\n"))
	ids := map[string]int{}
	for _, l := range out[1:] {
		ids[fmt.Sprint(l["id"])]++
		if fmt.Sprint(l["id"]) == "12" {
			require.Equal(t, "twelve\n", l["stdout"], "a refusal of another line was answered with id 12: %v", l)
		}
	}
	require.Equal(t, map[string]int{"12": 1, "<nil>": 4, "7": 1, "s": 1}, ids)
}

// TestReview24NoSecondDecode: review 23's checks decoded a request line
// a second (and third) time, into a map of every top-level value, when
// it held a \u escape anywhere (as Python's json.dumps writes every
// character beyond ASCII), a "\ud" (an escaped emoji), or the word
// "session" in quotes (a key or any value): a 128 KiB line with one "é" cost 2.4 times the
// pool's CPU of a plain one, one with an emoji 3.4 times (a 1 MiB line:
// tens of milliseconds per request). The key scan that runs anyway now
// passes on the raw values of id, session and cancel. Counted in
// allocations (deterministic), on a line with a few top-level keys: the
// second decode allocated one value per key, and more.
func TestReview24NoSecondDecode(t *testing.T) {
	line := func(extra string) []byte {
		return []byte(`{"id": "b", "code": "print(len(inputs))", "name": "main.py", "env": {"A": "1"}, "timeout": "5s", ` +
			`"inputs": {"t": "` + strings.Repeat("abcdefgh", 1<<10) + extra + `"}}`)
	}
	allocs := func(l []byte) float64 {
		_, err := decodeRequest(l)
		require.Nil(t, err, "%s", l[:40])
		return testing.AllocsPerRun(20, func() { decodeRequest(l) })
	}
	plain := allocs(line(""))
	for _, extra := range []string{`\u00e9`, `\ud83d\ude00`, `", "s": "session`} {
		got := allocs(line(extra))
		t.Logf("%s: %v allocations, %v without", extra, got, plain)
		require.LessOrEqual(t, got, plain+8, "a line with %s was decoded again", extra)
	}
	// The checks the values serve still hold.
	for l, want := range map[string]string{
		`{"id": "x", "session": "", "code": "1", "inputs": {"t": "\u00e9"}}`:  `session: "" names no session`,
		`{"id": "x", "sessio\u006e": "", "code": "1"}`:                        `session: "" names no session`,
		`{"id": "x", "session": "s\udc00", "code": "1"}`:                      "session: a \\u escape of a lone UTF-16 surrogate",
		"{\"id\": \"x\", \"session\": \"s\xff\", \"code\": \"1\"}":            "session: not valid UTF-8",
		"{\"id\": \"x\", \"cancel\": \"s\xff\"}":                              "cancel: not valid UTF-8",
		`{"id": "x", "code": "1", "inputs": {"session": "", "id": "\ud800"}}`: "",
	} {
		req, err := decodeRequest([]byte(l))
		if want == "" {
			require.Nil(t, err, "%s", l)
			continue
		}
		require.NotNil(t, err, "%s was accepted", l)
		require.Contains(t, err.Message, want, l)
		require.Equal(t, "x", req.ID, l)
	}
}

// TestReview24BrokenLineRecoveryCheap: review 23 recovers a broken
// line's id by walking it token by token (json.Decoder.Token), and took
// every token of a large value too: a 1 MiB line of 500,000 numbers in
// inputs, broken at its end, cost ~200 ms of the pool's CPU and 62 MB of
// garbage in 3 million allocations (~8 times what refusing it cost
// before), on the goroutine that reads the connection's lines, for a
// line any client may send at no cost to itself. Each top-level value is
// now read whole by the decoder's scanner. Counted in allocations.
func TestReview24BrokenLineRecoveryCheap(t *testing.T) {
	for _, l := range []string{
		`{"id": 1, "inputs": {"x": [` + strings.Repeat("0,", 100000) + `oops`,
		`{"id": 1, "inputs": {"x": [` + strings.Repeat(`"",`, 100000) + `oops`,
		`{"id": 1, "inputs": {"x": [` + strings.Repeat(`{"a": [0]},`, 30000) + `oops`,
	} {
		req, err := decodeRequest([]byte(l))
		require.NotNil(t, err)
		require.Equal(t, "1", fmt.Sprint(req.ID), "the id is echoed")
		n := testing.AllocsPerRun(3, func() { decodeRequest([]byte(l)) })
		require.Less(t, n, 1000.0, "refusing a broken line of %d bytes took %v allocations", len(l), n)
	}
}
