package pynox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseSignature: the strict grammar takes what Python takes and
// refuses the rest, evaluating nothing.
func TestParseSignature(t *testing.T) {
	t.Parallel()
	sig, err := ParseSignature("(query: str, limit: int = 3) -> list[str]")
	require.NoError(t, err)
	require.Equal(t, &Signature{Returns: "list[str]", Params: []Param{
		{Name: "query", Kind: "POSITIONAL_OR_KEYWORD", Annotation: "str"},
		{Name: "limit", Kind: "POSITIONAL_OR_KEYWORD", Annotation: "int", Default: "3", HasDefault: true},
	}}, sig)
	sig, err = ParseSignature("(a, b: dict[str, int] = {'x=': 1, 'y': (2, 3)}, /, c=None, *args, d: 'a, b' = \"),\", **kw)")
	require.NoError(t, err)
	kinds := []string{}
	for _, p := range sig.Params {
		kinds = append(kinds, p.Name+":"+p.Kind)
	}
	require.Equal(t, []string{"a:POSITIONAL_ONLY", "b:POSITIONAL_ONLY", "c:POSITIONAL_OR_KEYWORD", "args:VAR_POSITIONAL", "d:KEYWORD_ONLY", "kw:VAR_KEYWORD"}, kinds)
	require.Equal(t, "{'x=': 1, 'y': (2, 3)}", sig.Params[1].Default)
	require.Equal(t, `"),"`, sig.Params[4].Default)
	for _, bad := range []string{
		"", "x", "(", "(a", "(a))", "(a, a)", "(a=1, b)", "(*, )", "(*)", "(**kw, a)", "(/, a)", "(a, *, b, *c)",
		"(class)", "(1x)", "(a: )", "(a=)", "(a)\n", "(a) -> ", "(a) x", "(a=[)", "(a='x)", "(*a=1)", "(a, /, b, /)",
		"(a, b=1, /, c)", "(é)",
	} {
		_, err := ParseSignature(bad)
		require.Error(t, err, "%q", bad)
	}
}

// TestBindError: the pool's check of a call's shape says what Python's
// inspect.Signature.bind says (asked of the real python3), case by case.
func TestBindError(t *testing.T) {
	t.Parallel()
	sigs := []string{"(a, /, b, c=1, *, d, e=2)", "(a, b=2, *args, c, **kw)", "(x, /, *, y=1)", "()", "(*args, **kw)", "(a, /, **kw)"}
	type tc struct {
		Sig string   `json:"sig"`
		N   int      `json:"n"`
		Kw  []string `json:"kw"`
	}
	var cases []tc
	kws := [][]string{nil, {"a"}, {"b"}, {"d"}, {"x"}, {"y"}, {"c", "d"}, {"a", "b", "d"}, {"b", "d", "e"}, {"zz", "a"}, {"d", "zz"}}
	for _, s := range sigs {
		for n := 0; n <= 4; n++ {
			for _, kw := range kws {
				cases = append(cases, tc{s, n, kw})
			}
		}
	}
	in, err := json.Marshal(cases)
	require.NoError(t, err)
	script := `import inspect, json, sys
out = []
for c in json.load(sys.stdin):
    ns = {}
    exec("def f%s: pass" % c["sig"], ns)
    try:
        inspect.signature(ns["f"]).bind(*range(c["n"]), **{k: 0 for k in (c["kw"] or [])})
        out.append("")
    except TypeError as e:
        out.append(str(e))
print(json.dumps(out))
`
	cmd := exec.Command(testPython(), "-I", "-c", script)
	cmd.Stdin = bytes.NewReader(in)
	b, err := cmd.Output()
	require.NoError(t, err)
	var want []string
	require.NoError(t, json.Unmarshal(b, &want))
	for i, c := range cases {
		sig, err := ParseSignature(c.Sig)
		require.NoError(t, err)
		require.Equal(t, want[i], sig.bindError(c.N, c.Kw), "%s with %d positional and %v", c.Sig, c.N, c.Kw)
	}
}

// TestDeclaredTools: a declared tool has its docstring and signature in
// the sandbox (inspect.signature, help), and a call that does not fit the
// signature is a TypeError in the job that never reaches the host — also
// when the job bypasses its pynox_host and writes the call frame itself.
func TestDeclaredTools(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	var calls atomic.Int64
	host := func(ctx context.Context, c *Call) (any, error) {
		calls.Add(1)
		return []any{c.Function, json.RawMessage(c.Args), json.RawMessage(c.Kwargs)}, nil
	}
	tools := []Tool{
		{Name: "search", Doc: "Searches the documentation.\n\nReturns the titles of the best pages.", Signature: "(query: str, limit: int = 3, *, lang: Optional[str] = None) -> list[str]"},
		{Name: "fetch", Doc: "Fetches a page.", Parameters: json.RawMessage(`{"type": "object", "properties": {"raw": {"type": "boolean", "default": false}, "url": {"type": "string"}}, "required": ["url"]}`)},
		{Name: "odd", Signature: "(x: __import__('os').system('id') = open('/etc/passwd'), y: typing.List[int] = lambda: 1)"},
	}
	code := `import inspect, pynox_host
from pynox_host import search, fetch, odd
print(inspect.signature(search))
print(inspect.signature(fetch))
print(inspect.signature(odd))
print(search.__doc__.splitlines()[0])
help(search)
print(search('pynox', 2, lang='en'))
print(fetch('http://x'))
for f, a, k in ((search, (), {}), (search, ('q',), {'limits': 2}), (search, ('q', 1, 2), {}), (fetch, ('u',), {'url': 'u'})):
    try:
        f(*a, **k)
    except TypeError as e:
        print('TypeError', e)
`
	res := run(t, p, Job{Tools: tools, Host: host, Code: code})
	requireOK(t, res)
	require.Equal(t, int64(2), calls.Load(), "only the calls that fit reached the host")
	out := res.Stdout
	require.Contains(t, out, "(query: str, limit: int = 3, *, lang: Optional[str] = None) -> list[str]\n")
	require.Contains(t, out, "(url: str, raw: bool = False)\n")
	// Not evaluated: shown as text.
	require.Contains(t, out, `(x: "__import__('os').system('id')" = open('/etc/passwd'), y: List[int] = lambda: 1)`+"\n")
	require.Contains(t, out, "Searches the documentation.\n")
	require.Contains(t, out, "search(query: str, limit: int = 3, *, lang: Optional[str] = None) -> list[str]\n")
	require.Contains(t, out, "    Returns the titles of the best pages.\n")
	require.Contains(t, out, `['search', ['pynox', 2], {'lang': 'en'}]`)
	require.Contains(t, out, `['fetch', ['http://x'], {}]`)
	require.Contains(t, out, "TypeError search(): missing a required argument: 'query'\n")
	require.Contains(t, out, "TypeError search(): got an unexpected keyword argument 'limits'\n")
	require.Contains(t, out, "TypeError search(): too many positional arguments\n")
	require.Contains(t, out, "TypeError fetch(): multiple values for argument 'url'\n")

	// A job that bypasses its own check gets no further: the pool refuses
	// the call with a TypeError before the host sees it.
	calls.Store(0)
	forge := `import json, os, struct
b = json.dumps({'t': 'call', 'step': 1, 'function': 'search', 'args': ['q'], 'kwargs': {'limits': 2}}).encode()
os.write(3, struct.pack('<I', len(b)) + b)
os.write(4, b'!')
n = struct.unpack('<I', os.read(3, 4))[0]
r = json.loads(os.read(3, n))
print(r.get('error_type'), r.get('error'))
`
	res = run(t, p, Job{Tools: tools, Host: host, Code: forge})
	requireOK(t, res)
	require.Equal(t, "TypeError search(): got an unexpected keyword argument 'limits'\n", res.Stdout)
	require.Zero(t, calls.Load())

	// Bad declarations are refused before anything runs, naming the field.
	for _, bad := range []Tool{
		{Name: "x", Signature: "(a, a)"},
		{Name: "x", Signature: "(a):\n  import os"},
		{Name: "x", Parameters: json.RawMessage(`{"type": "object", "properties": {"class": {}}}`)},
		{Name: "x", Parameters: json.RawMessage(`[1]`)},
		{Name: "_x"},
		{Name: "search"},
	} {
		res := run(t, p, Job{Functions: []string{"search"}, Tools: []Tool{bad}, Host: host, Code: "1"})
		requireErrorType(t, res, "RequestError")
		require.Contains(t, res.Error.Message, "functions")
	}
}

// TestToolSchema: a Tool's JSON Schema comes from its Parameters or its
// signature.
func TestToolSchema(t *testing.T) {
	t.Parallel()
	tl := Tool{Name: "search", Signature: "(query: str, limit: int = 3, tags: list[str] = [], *rest, **kw)"}
	b, err := tl.Schema()
	require.NoError(t, err)
	require.JSONEq(t, `{"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}, "tags": {"type": "array"}}, "required": ["query"]}`, string(b))
}

// TestDeclaredToolSignaturesMatchPython: for signatures of every shape,
// the declared tool's inspect.signature in the sandbox reads as Python's
// own for a function defined with that signature.
func TestDeclaredToolSignaturesMatchPython(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	sigs := []string{
		"()",
		"(a, b, /, c, d=4, *args, e, f=None, **kw) -> None",
		"(x: int | None = None, *, y: dict[str, list[int]] = {})",
		"(q: str = 'a, b', n: float = -1.5e3, t: tuple = (1, (2,)), s: set = {1})",
		"(a: typing.Optional[int], b: Literal['x', 'y'] = 'x', c: Callable[[int], str] = None) -> Any",
		"(*, only)",
		"(a, /)",
		"(*args: int, **kwargs: str) -> list[dict]",
		"(flag: bool = True, nothing=None, data: bytes = b'\\x00')",
	}
	var tools []Tool
	var code strings.Builder
	code.WriteString("import inspect, typing\nfrom typing import *\nimport pynox_host\n")
	for i, s := range sigs {
		tools = append(tools, Tool{Name: fmt.Sprintf("f%d", i), Signature: s})
		fmt.Fprintf(&code, "def g%d%s: pass\n", i, s)
		fmt.Fprintf(&code, "print(%d, str(inspect.signature(pynox_host.f%d)) == str(inspect.signature(g%d)), inspect.signature(pynox_host.f%d), inspect.signature(g%d))\n", i, i, i, i, i)
	}
	res := run(t, p, Job{Tools: tools, Host: func(context.Context, *Call) (any, error) { return nil, nil }, Code: code.String()})
	requireOK(t, res)
	for i, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		require.Contains(t, line, fmt.Sprintf("%d True ", i), "signature %q", sigs[i])
	}
}

// FuzzParseSignature: the grammar never panics, and what it accepts has
// valid, distinct parameter names and bounded text.
func FuzzParseSignature(f *testing.F) {
	for _, s := range []string{"()", "(a, /, b=1, *c, d, **e) -> int", "(x: dict[str, 'a,b'] = {'k': (1, 2)})", "(*, a)", "(a='\\'', b=\")\")", "((", "(a:[)]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sig, err := ParseSignature(s)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, p := range sig.Params {
			if !isIdentifier(p.Name) || seen[p.Name] {
				t.Fatalf("%q: accepted parameter %q", s, p.Name)
			}
			seen[p.Name] = true
		}
		if len(s) > MaxSignature {
			t.Fatalf("accepted %d bytes", len(s))
		}
	})
}
