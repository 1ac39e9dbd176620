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
func TestReview24CutNumberIDNotEchoed(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	out := serveLines(t, p, strings.Join([]string{
		`{"id": 12, "code": "print('twelve')"}`,
		`{"id": 12x, "code": "print(1)"}`,
		`{"id": 12 34, "code": "print(1)"}`,
		`{"id": 7 , "code": "print(1)",, }`,
		`{"id": "s", "code": "print(1)" oops}`,
		`{"id": 12`, // the last line, cut short by EOF (the client wrote 123)
	}, "\n"))
	ids := map[string]int{}
	for _, l := range out[1:] {
		t.Logf("%v", l)
		ids[fmt.Sprint(l["id"])]++
		if fmt.Sprint(l["id"]) == "12" {
			require.Equal(t, "twelve\n", l["stdout"], "a refusal of another line was answered with id 12: %v", l)
		}
	}
	require.Equal(t, map[string]int{"12": 1, "<nil>": 3, "7": 1, "s": 1}, ids)
}
