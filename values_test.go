package pynox

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Inputs and the value of the last expression, against real python3 under
// the real sandbox.

func TestInputsAndValueRoundTrip(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	inputs := map[string]any{
		"d":      map[string]any{"a": 1, "b": []any{"x", 2.5, true, nil}},
		"l":      []any{1, 2, 3},
		"s":      "héllo ✓",
		"n":      7,
		"nested": map[string]any{"deep": []any{map[string]any{"k": []any{[]any{1}}}}},
		"raw":    json.RawMessage(`{"z": [1e3]}`),
		"match":  "soft keywords are names",
		"_x1":    nil,
	}
	// The inputs are globals before the code runs, with Python's types;
	// the last expression's value comes back as JSON.
	r := run(t, p, Job{Inputs: inputs, Code: `
assert type(d) is dict and type(l) is list and type(s) is str and type(n) is int and _x1 is None, (d, l, s, n, _x1)
assert "d" in globals() and __name__ == "__main__"
[d, l, s, n, nested, raw, match]
`})
	requireOK(t, r)
	require.Empty(t, r.ValueRepr)
	require.JSONEq(t, `[{"a": 1, "b": ["x", 2.5, true, null]}, [1, 2, 3], "héllo ✓", 7,
		{"deep": [{"k": [[1]]}]}, {"z": [1000.0]}, "soft keywords are names"]`, string(r.Value))
	require.Empty(t, r.Stdout, "the value is not printed")

	// Inputs are measured as a client writes them: "<" is one byte, not
	// the six of Go's HTML escape \u003c.
	r = run(t, p, Job{Inputs: map[string]any{"html": strings.Repeat("<&>", 300000)}, Code: "len(html), html[:3]"})
	requireOK(t, r)
	require.JSONEq(t, `[900000, "<&>"]`, string(r.Value))

	// Nor do they grow sixfold on their way to the child: with 3 MiB of
	// code they fit its 8 MiB frame.
	r = run(t, p, Job{Inputs: map[string]any{"lt": strings.Repeat("<", 1_000_000)}, Code: "#" + strings.Repeat("x", 3<<20) + "\nlen(lt)"})
	requireOK(t, r)
	require.JSONEq(t, `1000000`, string(r.Value))

	for _, c := range []struct{ code, value string }{
		{"d", `{"a": 1, "b": ["x", 2.5, true, null]}`},
		{"l + [4]", `[1, 2, 3, 4]`},
		{"s.upper()", `"HÉLLO ✓"`},
		{"n * 6", `42`},
		{"x = 1; x + n", `8`},
		{"nested['deep'][0]", `{"k": [[1]]}`},
		{"(1,\n 2)", `[1, 2]`},
		{"False", `false`},
		{"0.5", `0.5`},
	} {
		r := run(t, p, Job{Inputs: inputs, Code: c.code})
		requireOK(t, r)
		require.JSONEq(t, c.value, string(r.Value), "code %q", c.code)
		require.Empty(t, r.ValueRepr, "code %q", c.code)
		require.Empty(t, r.Stdout, "code %q", c.code)
	}
}

func TestValueReprAndNone(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	for _, c := range []struct{ code, repr string }{
		{"{3, 1, 2}", "{1, 2, 3}"},
		{"class C:\n    def __repr__(self):\n        return 'C()'\nC()", "C()"},
		{"class C:\n    pass\nC", "<class '__main__.C'>"},
		{"float('nan')", "nan"},
		{"b'ab'", "b'ab'"},
		{"{1: 'a', '1': 'b'}", "{1: 'a', '1': 'b'}"}, // its JSON repeats a key
		{"'\\ud800'", "'\\ud800'"},                   // its JSON is not UTF-8
		{"import sys\nsys.set_int_max_str_digits(0)\nx = 10 ** 5000\nlen(repr(x)) and type('Big', (int,), {'__repr__': lambda s: 'big'})(x)", "big"},
		{"class R:\n    def __repr__(self):\n        raise ValueError('no')\nR()", "<R object: repr() failed>"},
	} {
		r := run(t, p, Job{Code: c.code})
		requireOK(t, r)
		require.Empty(t, r.Value, "code %q", c.code)
		require.Equal(t, c.repr, r.ValueRepr, "code %q", c.code)
		require.Empty(t, r.Stdout, "code %q", c.code)
	}

	// Nested deeper than every client reads: its repr.
	r := run(t, p, Job{Code: "x = []\nfor _ in range(300):\n    x = [x]\nx"})
	requireOK(t, r)
	require.Empty(t, r.Value)
	require.True(t, strings.HasPrefix(r.ValueRepr, "[[[[[["), r.ValueRepr[:min(len(r.ValueRepr), 50)])

	// Over 1 MiB of JSON: the repr, cut to 64 KiB.
	r = run(t, p, Job{Code: "'x' * (2 << 20)"})
	requireOK(t, r)
	require.Empty(t, r.Value)
	require.Equal(t, "'"+strings.Repeat("x", MaxValueReprBytes-1), r.ValueRepr)
	r = run(t, p, Job{Code: "list(range(300000))"})
	requireOK(t, r)
	require.Empty(t, r.Value)
	require.Len(t, r.ValueRepr, MaxValueReprBytes)
	require.True(t, strings.HasPrefix(r.ValueRepr, "[0, 1, 2, 3"))
	// Just under 1 MiB is still JSON.
	r = run(t, p, Job{Code: "'x' * ((1 << 20) - 2)"})
	requireOK(t, r)
	require.Len(t, r.Value, MaxValueBytes)
	// A repr cut inside a character is cut before it.
	r = run(t, p, Job{Code: "class C:\n    def __repr__(self):\n        return 'x' + '✓' * 30000\nC()"})
	requireOK(t, r)
	require.Equal(t, "x"+strings.Repeat("✓", (MaxValueReprBytes-1)/3), r.ValueRepr)

	// None, a statement, a function call returning None: neither.
	for _, code := range []string{"None", "x = 1", "print('hi')", "def f():\n    return 5", "if True:\n    7", "import os"} {
		r := run(t, p, Job{Code: code})
		requireOK(t, r)
		require.Empty(t, r.Value, "code %q", code)
		require.Empty(t, r.ValueRepr, "code %q", code)
	}
	// A value is not printed; the output of computing it is.
	r = run(t, p, Job{Code: "print('out')\nclass C:\n    def __repr__(self):\n        print('in repr')\n        return 'C'\nC()"})
	requireOK(t, r)
	require.Equal(t, "out\nin repr\n", r.Stdout)
	require.Equal(t, "C", r.ValueRepr)
}

func TestValueTracebacks(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	// A last expression that raises: its line, in the error and the
	// traceback, and no value.
	r := run(t, p, Job{Name: "cell.py", Code: "x = 1\ny = 0\n\n(x +\n  x / y)\n"})
	requireErrorType(t, r, "ZeroDivisionError")
	require.Equal(t, 1, r.Exit)
	require.Equal(t, "cell.py", *r.Error.File)
	require.Equal(t, 5, *r.Error.Line)
	require.Contains(t, r.Stderr, "File \"cell.py\", line 5, in <module>\n    x / y)")
	require.NotContains(t, r.Stderr, "<string>", "the runner's frames are not shown")
	require.Empty(t, r.Value)
	require.Empty(t, r.ValueRepr)

	// Raised in a function the last expression calls.
	r = run(t, p, Job{Name: "cell.py", Code: "def f():\n    return undefined\n\nf()"})
	requireErrorType(t, r, "NameError")
	require.Equal(t, 2, *r.Error.Line)
	require.Contains(t, r.Stderr, "File \"cell.py\", line 4, in <module>\n    f()\n")
	require.Contains(t, r.Stderr, "File \"cell.py\", line 2, in f\n")

	// A statement before the last expression raises: the expression does
	// not run.
	r = run(t, p, Job{Code: "print('a')\nraise KeyError('k')\nprint('b')"})
	requireErrorType(t, r, "KeyError")
	require.Equal(t, 2, *r.Error.Line)
	require.Equal(t, "a\n", r.Stdout)

	// sys.exit as the last expression is an exit, not a value.
	r = run(t, p, Job{Code: "import sys\nsys.exit(3)"})
	require.Equal(t, 3, r.Exit)
	require.Nil(t, r.Error)
	require.Empty(t, r.Value)

	// A syntax error in the last line, and a yield outside a function.
	r = run(t, p, Job{Name: "cell.py", Code: "x = 1\nx +"})
	requireErrorType(t, r, "SyntaxError")
	require.Equal(t, 2, *r.Error.Line)
	r = run(t, p, Job{Name: "cell.py", Code: "x = 1\n(yield x)"})
	requireErrorType(t, r, "SyntaxError")
	require.Equal(t, 2, *r.Error.Line)

	// A lone string is a value, and the module's docstring as before.
	r = run(t, p, Job{Code: "\"doc\""})
	requireOK(t, r)
	require.JSONEq(t, `"doc"`, string(r.Value))
	co := checkout(t, p, Job{})
	requireOK(t, feed(t, co, "'step doc'"))
	r = feed(t, co, "__doc__")
	requireOK(t, r)
	require.JSONEq(t, `"step doc"`, string(r.Value))

	// __main__ as before: the code and its last expression share globals,
	// and a future import still applies to the rest.
	r = run(t, p, Job{Code: "from __future__ import annotations\nimport sys\ndef f(a: Undefined): pass\nf.__annotations__['a'], sys.modules['__main__'].__dict__ is globals(), __name__"})
	requireOK(t, r)
	require.JSONEq(t, `["Undefined", true, "__main__"]`, string(r.Value))
}

func TestInputsRefused(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	deep := any(1)
	for range 300 {
		deep = []any{deep}
	}
	for _, c := range []struct {
		inputs map[string]any
		msg    string
	}{
		{map[string]any{"1x": 1}, `inputs: "1x" is not a name`},
		{map[string]any{"class": 1}, `inputs: "class" is a Python keyword`},
		{map[string]any{"None": 1}, `inputs: "None" is a Python keyword`},
		{map[string]any{"a-b": 1}, `inputs: "a-b" is not a name`},
		{map[string]any{"a b": 1}, `inputs: "a b" is not a name`},
		{map[string]any{"": 1}, `inputs: a name must not be empty`},
		{map[string]any{"é": 1}, `inputs: "é" is not a name: names are ASCII Python identifiers`},
		{map[string]any{"__builtins__": 1}, `inputs: "__builtins__" is a dunder name`},
		{map[string]any{"big": strings.Repeat("x", MaxInputsBytes)}, `inputs: 1048586 bytes of JSON; the limit is 1048576`},
		{map[string]any{"f": math.NaN()}, `inputs: f: expected a JSON value: unsupported value: NaN`},
		{map[string]any{"c": make(chan int)}, `inputs: c: expected a JSON value: unsupported type: chan int`},
		{map[string]any{"deep": deep}, `inputs: cannot be passed to Python: they nest deeper than 256 levels`},
		{map[string]any{"num": json.Number(strings.Repeat("1", 4301))}, `inputs: cannot be passed to Python: a number is longer than 4300 characters`},
		{map[string]any{"dup": json.RawMessage(`{"a": 1, "a": 2}`)}, `inputs: cannot be passed to Python: an object repeats the key "a"`},
	} {
		r := run(t, p, Job{ID: "bad", Inputs: c.inputs, Code: "print('ran')"})
		requireErrorType(t, r, "RequestError")
		require.Contains(t, r.Error.Message, c.msg)
		require.Equal(t, -1, r.Exit)
		require.Empty(t, r.Stdout)
		require.Equal(t, "bad", r.ID)
	}
	// The pool keeps serving, inputs and all.
	advServes(t, p)
	r := run(t, p, Job{Inputs: map[string]any{"x": 1}, Code: "x + 1"})
	requireOK(t, r)
	require.JSONEq(t, "2", string(r.Value))

	// A checkout's job brings no inputs (its steps do).
	_, err := p.Checkout(context.Background(), Job{Inputs: map[string]any{"x": 1}})
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, KindRequest, pe.Kind)
	require.Contains(t, pe.Message, "inputs")
}

func TestSessionInputsAndValues(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	step := func(s Step) *Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ev, err := co.Feed(ctx, s)
		require.NoError(t, err)
		require.NotNil(t, ev.Result)
		return ev.Result
	}
	// The first step's inputs, and its value.
	r := step(Step{Code: "rows = [dict(r, n=i) for i, r in enumerate(rows)]\nrows",
		Inputs: map[string]any{"rows": []any{map[string]any{"a": 1}, map[string]any{"a": 2}}, "limit": 10}})
	requireOK(t, r)
	require.Equal(t, 1, r.Step)
	require.JSONEq(t, `[{"a": 1, "n": 0}, {"a": 2, "n": 1}]`, string(r.Value))
	// They stay, like assignments; a later step's inputs are set too, and
	// replace a global of the same name.
	r = step(Step{Code: "len(rows), limit, extra", Inputs: map[string]any{"extra": "e", "limit": 5}})
	requireOK(t, r)
	require.Equal(t, 2, r.Step)
	require.JSONEq(t, `[2, 5, "e"]`, string(r.Value))
	r = step(Step{Code: "limit"})
	requireOK(t, r)
	require.JSONEq(t, `5`, string(r.Value))
	// Values of later steps: repr, none, an error in the last expression.
	r = step(Step{Code: "{limit}"})
	requireOK(t, r)
	require.Equal(t, "{5}", r.ValueRepr)
	r = step(Step{Code: "x = limit"})
	requireOK(t, r)
	require.Empty(t, r.Value)
	require.Empty(t, r.ValueRepr)
	r = step(Step{Name: "cell.py", Code: "y = 2\nx / (y - 2)"})
	requireErrorType(t, r, "ZeroDivisionError")
	require.Equal(t, 2, *r.Error.Line)
	require.Empty(t, r.Value)
	require.False(t, r.SessionEnded)
	r = step(Step{Code: "'x' * (3 << 20)"})
	requireOK(t, r)
	require.Len(t, r.ValueRepr, MaxValueReprBytes)
	r = step(Step{Code: "'y' * ((1 << 20) - 2)"})
	requireOK(t, r)
	require.Len(t, r.Value, MaxValueBytes)
	require.False(t, r.SessionEnded)
	// A refused step's inputs leave the session as it was.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := co.Feed(ctx, Step{Code: "limit", Inputs: map[string]any{"limit": 1, "class": 2}})
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, KindRequest, pe.Kind)
	require.Contains(t, pe.Message, `"class" is a Python keyword`)
	r = step(Step{Code: "limit"})
	requireOK(t, r)
	require.JSONEq(t, `5`, string(r.Value))
	require.Equal(t, 9, r.Step)
}
