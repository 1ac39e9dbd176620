package worker

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The value of a job's last expression, and what runs before it, for code
// whose last statement the runner finds without a syntax tree (the last
// line at column 0 begins an expression) and for code where that line
// does not begin the last statement, so that the syntax tree decides
// (runner.py: _compile_split, _split_at_last_line). Each case states what
// CPython's own reading of the code gives.
func TestLastExpressionSplit(t *testing.T) {
	tpl := startTestTemplate(t, false)
	for _, c := range []struct {
		code, value, repr, stdout string
		errType                   string
		errLine                   int
	}{
		{code: "1 + 1", value: "2"},
		{code: "x = 3\nx * 2\n\n# a comment\n   \n", value: "6"},
		{code: "x = 3\n(x +\n  1)", value: "4"},                                     // an expression over two lines
		{code: "x = 3\n[x,\n 5]\n", value: "[3,5]"},                                 // its last line is indented
		{code: "x = 1; x + 1", value: "2"},                                          // two statements on the last line
		{code: "x = 1\nx + \\\n1", value: "2"},                                      // a continuation: the last line at column 0 is inside it
		{code: "if True:\n    5", value: ""},                                        // the last statement is an if
		{code: "def f():\n    return 7\nf()", value: "7"},                           // after a block
		{code: "s = '''\nabc\n'''\ns.strip()", value: `"abc"`},                      // a string over lines before it
		{code: "s = '''\n1\n'''", value: ""},                                        // the last line at column 0 is inside a string
		{code: "print('a')\nprint('b')", value: "", stdout: "a\nb\n"},               // print returns None
		{code: "\"doc\"", value: `"doc"`},                                           // a lone string (the docstring)
		{code: "x = 2\n'a' * x", value: `"aa"`},                                     // a string expression after statements
		{code: "import sys\n__doc__ is None, __name__", value: `[true,"__main__"]`}, // no docstring from the split
		{code: "'doc'\n__doc__", value: `"doc"`},                                    // the docstring is kept
		{code: "from __future__ import annotations\ndef f(a: Undefined): pass\nf.__annotations__['a']", value: `"Undefined"`},
		{code: "x = 1\nx +", errType: "SyntaxError", errLine: 2},
		{code: "x = (1,\n2)\n(yield x)", errType: "SyntaxError", errLine: 3},
		{code: "x = 0\n\n(1 +\n  1 / x)", errType: "ZeroDivisionError", errLine: 4},
	} {
		o := runTestJob(t, tpl, Job{Code: c.code})
		require.True(t, o.Started, "code %q: setup error %s", c.code, o.SetupError)
		if c.errType != "" {
			require.NotNil(t, o.Error, "code %q: no error; stderr %s", c.code, o.Stderr)
			require.Equal(t, c.errType, o.Error.Type, "code %q", c.code)
			require.NotNil(t, o.Error.Line, "code %q", c.code)
			require.Equal(t, c.errLine, *o.Error.Line, "code %q", c.code)
			continue
		}
		require.Nil(t, o.Error, "code %q: stderr %s", c.code, o.Stderr)
		if c.value == "" {
			require.Empty(t, o.Value, "code %q", c.code)
		} else {
			require.JSONEq(t, c.value, string(o.Value), "code %q", c.code)
		}
		require.Empty(t, o.ValueRepr, "code %q", c.code)
		require.Equal(t, c.stdout, string(o.Stdout), "code %q", c.code)
	}
}
