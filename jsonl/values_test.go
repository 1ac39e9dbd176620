package jsonl

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// "inputs" and "value" / "value_repr" over the pool protocol.

// jsonOf re-encodes a decoded line's value, for JSONEq.
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestServeInputsAndValues(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	// A line holds at most 1 MiB, but its inputs may take more once
	// encoded: U+2028, 3 bytes of UTF-8, is written as \u2028.
	big := strings.Repeat("\u2028", 300000)
	input := strings.Join([]string{
		`{"id": 1, "code": "d['a'].append(len(s)); [d, l, s, n, big]", "inputs": {"d": {"a": [1.5, null]}, "l": [1, [2]], "s": "héllo", "n": 12345678901234567890, "big": -1e300}}`,
		`{"id": 2, "code": "{1, 2}"}`,
		`{"id": 3, "code": "print('no value')"}`,
		`{"id": 4, "code": "'x' * (2 << 20)"}`,
		`{"id": 5, "code": "1", "inputs": {"1x": 1}}`,
		`{"id": 6, "code": "1", "inputs": {"class": 1}}`,
		`{"id": 7, "code": "1", "inputs": [1]}`,
		`{"id": 8, "code": "1", "inputs": "x=1"}`,
		`{"id": 9, "code": "1", "inputs": {"a": 1, "a": 2}}`,
		`{"id": 10, "code": "1", "inputs": {"x": "` + big + `"}}`,
		`{"id": 11, "code": "1", "inputs": {"x-y": 1}}`,
		`{"id": 12, "stats": true, "inputs": {"x": 1}}`,
		`{"id": 13, "code": "len(x)", "inputs": {"x": "` + strings.Repeat("y", 1000) + `"}}`,
		`{"id": 14, "code": "x = 1\n(x +\n  1 / 0)", "name": "cell.py"}`,
		`{"id": 15, "code": "None", "inputs": null}`,
	}, "\n") + "\n"
	lines := byID(t, serveLines(t, p, input))

	require.Equal(t, "", errType(lines["1"]), "%v", lines["1"])
	require.JSONEq(t, `[{"a": [1.5, null, 5]}, [1, [2]], "héllo", 12345678901234567890, -1e300]`, jsonOf(t, lines["1"]["value"]))
	require.NotContains(t, lines["1"], "value_repr")
	require.Equal(t, "", lines["1"]["stdout"])

	require.Equal(t, "{1, 2}", lines["2"]["value_repr"])
	require.NotContains(t, lines["2"], "value")
	require.Equal(t, "no value\n", lines["3"]["stdout"])
	require.NotContains(t, lines["3"], "value")
	require.NotContains(t, lines["3"], "value_repr")
	require.Len(t, lines["4"]["value_repr"], pynox.MaxValueReprBytes)
	require.NotContains(t, lines["4"], "value")

	for id, msg := range map[string]string{
		"5":  `inputs: "1x" is not a name`,
		"6":  `inputs: "class" is a Python keyword`,
		"7":  `inputs: expected an object, got a JSON array`,
		"8":  `inputs: expected an object, got a JSON string`,
		"9":  `inputs: key "a" appears twice`,
		"10": `inputs: 1800008 bytes of JSON; the limit is 1048576`,
		"11": `inputs: "x-y" is not a name`,
		"12": `a stats request takes no other fields than id`,
	} {
		l := lines[id]
		require.Equal(t, "RequestError", errType(l), "id %s: %v", id, l)
		require.Contains(t, l["error"].(map[string]any)["message"], msg, "id %s", id)
		require.NotContains(t, l, "value")
	}
	require.Equal(t, "1000", jsonOf(t, lines["13"]["value"]))
	require.Equal(t, "ZeroDivisionError", errType(lines["14"]))
	require.Equal(t, "3", jsonOf(t, lines["14"]["error"].(map[string]any)["line"]))
	require.NotContains(t, lines["14"], "value")
	require.Equal(t, "", errType(lines["15"]))
	require.NotContains(t, lines["15"], "value")
	require.NotContains(t, lines["15"], "value_repr")
}

func TestServeSessionInputs(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)

	// The first request's inputs, and a later step's: they stay.
	ls.send(`{"id": 1, "session": "nb", "code": "total = sum(xs)\ntotal", "inputs": {"xs": [1, 2, 3]}}`)
	r := ls.await(1)
	require.Equal(t, "", errType(r), "%v", r)
	require.Equal(t, "6", jsonOf(t, r["value"]))
	ls.send(`{"id": 2, "session": "nb", "code": "[total * k, xs]", "inputs": {"k": 10}}`)
	r = ls.await(2)
	require.Equal(t, "", errType(r), "%v", r)
	require.Equal(t, 2, stepOf(r))
	require.JSONEq(t, `[60, [1, 2, 3]]`, jsonOf(t, r["value"]))
	ls.send(`{"id": 3, "session": "nb", "code": "k"}`)
	require.Equal(t, "10", jsonOf(t, ls.await(3)["value"]))

	// Bad inputs on a step are refused; the session lives on unchanged.
	ls.send(`{"id": 4, "session": "nb", "code": "k", "inputs": {"k": 1, "def": 2}}`)
	r = ls.await(4)
	require.Equal(t, "RequestError", errType(r))
	require.Contains(t, r["error"].(map[string]any)["message"], `"def" is a Python keyword`)
	ls.send(`{"id": 5, "session": "nb", "code": "k", "inputs": [1]}`)
	r = ls.await(5)
	require.Equal(t, "RequestError", errType(r))
	require.Contains(t, r["error"].(map[string]any)["message"], "inputs: expected an object")
	ls.send(`{"id": 6, "session": "nb", "code": "k"}`)
	r = ls.await(6)
	require.Equal(t, "10", jsonOf(t, r["value"]))
	require.Equal(t, 4, stepOf(r))

	// A new session refuses bad inputs before it starts.
	ls.send(`{"id": 7, "session": "other", "code": "1", "inputs": {"__name__": "x"}}`)
	r = ls.await(7)
	require.Equal(t, "RequestError", errType(r))
	require.Contains(t, r["error"].(map[string]any)["message"], "dunder")
	ls.send(`{"id": 8, "session": "other", "code": "y", "inputs": {"y": {"ok": true}}}`)
	r = ls.await(8)
	require.JSONEq(t, `{"ok": true}`, jsonOf(t, r["value"]))
	require.Equal(t, 1, stepOf(r))
	ls.finish()
}

func TestClientInputsAndValues(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	c := startClient(t, p)
	ctx := context.Background()
	res, err := c.Run(ctx, pynox.Job{Code: "[x * 2, s]", Inputs: map[string]any{"x": 21, "s": "é"}})
	require.NoError(t, err)
	require.Nil(t, res.Error)
	require.JSONEq(t, `[42, "é"]`, string(res.Value))
	res, err = c.Run(ctx, pynox.Job{Code: "{x}", Inputs: map[string]any{"x": 1}})
	require.NoError(t, err)
	require.Equal(t, "{1}", res.ValueRepr)
	require.Empty(t, res.Value)
	res, err = c.Run(ctx, pynox.Job{Code: "1", Inputs: map[string]any{"if": 1}})
	require.NoError(t, err)
	require.Equal(t, "RequestError", res.Error.Type)

	s := c.Session("values", pynox.Job{Inputs: map[string]any{"ignored": 1}})
	defer s.Close(ctx)
	res, err = s.Run(ctx, pynox.Step{Code: "n = len(xs)\nn", Inputs: map[string]any{"xs": []int{1, 2}}})
	require.NoError(t, err)
	require.Nil(t, res.Error)
	require.JSONEq(t, `2`, string(res.Value))
	res, err = s.Run(ctx, pynox.Step{Code: "xs + [n], 'ignored' in globals()"})
	require.NoError(t, err)
	require.JSONEq(t, `[[1, 2, 2], false]`, string(res.Value))
}
