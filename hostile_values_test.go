package pynox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Adversarial probes of the last expression's value: the child computes
// and encodes it, and the pool passes on only a value an honest runner
// could have reported (valid JSON that every client reads back the same,
// at most MaxValueBytes; or a repr of at most MaxValueReprBytes), however
// the child forges its report.

// forgeReport is Python defining report(b): it writes the bytes b as a
// frame on the control channel the way the runner writes a large one
// (its header and a ring first, then the rest and a ring), so that a
// frame larger than the socket's buffer reaches the pool.
const forgeReport = `import os, struct, time
def report(b):
    os.write(3, struct.pack('<I', len(b)))
    os.write(4, b'!')
    view = memoryview(b)
    while view:
        view = view[os.write(3, view):]
    os.write(4, b'!')
`

// forgedValues are "done" reports whose value an honest runner never
// sends, each after the first step's "started".
var forgedValues = []struct{ name, frame, msg string }{
	{"value over 1 MiB",
		`b'{"t":"done","step":STEP,"exit":0,"error":null,"value":"' + b'x' * (1 << 20) + b'"}'`,
		"the value it reported is 1048578 bytes of JSON; the limit is 1048576"},
	{"value and value_repr",
		`b'{"t":"done","step":STEP,"exit":0,"error":null,"value":1,"value_repr":"1"}'`,
		"both a value and a value_repr"},
	{"value_repr over 64 KiB",
		`b'{"t":"done","step":STEP,"exit":0,"error":null,"value_repr":"' + b'x' * (100 << 10) + b'"}'`,
		"the value_repr it reported is 102400 bytes; the limit is 65536"},
	{"repeated key",
		`b'{"t":"done","step":STEP,"exit":0,"error":null,"value":{"admin":false,"admin":true}}'`,
		`an object repeats the key "admin"`},
	{"deep nesting",
		`b'{"t":"done","step":STEP,"exit":0,"error":null,"value":' + b'[' * 300 + b']' * 300 + b'}'`,
		"they nest deeper than 256 levels"},
	{"long number",
		`b'{"t":"done","step":STEP,"exit":0,"error":null,"value":' + b'9' * 5000 + b'}'`,
		"a number is longer than 4300 characters"},
	{"invalid UTF-8",
		`b'{"t":"done","step":STEP,"exit":0,"error":null,"value":"\xff\xfe"}'`,
		"a string is not valid UTF-8"},
}

func TestHostileValueForgedReport(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	for _, c := range forgedValues {
		code := forgeReport + "report(" + strings.ReplaceAll(c.frame, "STEP", "1") + ")\ntime.sleep(30)\n"
		r := run(t, p, Job{ID: c.name, Code: code, Timeout: 20 * time.Second})
		requireErrorType(t, r, "PoolWorkerError")
		require.Contains(t, r.Error.Message, c.msg, c.name)
		require.Empty(t, r.Value, c.name)
		require.Empty(t, r.ValueRepr, c.name)
	}
	advServes(t, p)
}

func TestHostileValueForgedReportInSession(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	for _, c := range forgedValues {
		// A step of a live process: the forged report ends the session.
		requireOK(t, feed(t, co, "x = 1"))
		r := feed(t, co, forgeReport+"report("+strings.ReplaceAll(c.frame, "STEP", "2")+")\ntime.sleep(30)\n")
		requireErrorType(t, r, "PoolWorkerError")
		require.Contains(t, r.Error.Message, c.msg, c.name)
		require.True(t, r.SessionEnded, c.name)
		require.Empty(t, r.Value, c.name)
		require.Empty(t, r.ValueRepr, c.name)
	}
	r := feed(t, co, "x = 6\nx * 7")
	requireOK(t, r)
	require.JSONEq(t, "42", string(r.Value))
	advServes(t, p)
}

func TestHostileValueHugeRepr(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	// A repr of 32 MiB reaches the pool as 64 KiB.
	r := run(t, p, Job{Code: "class R:\n    def __repr__(self):\n        return '✓' * (32 << 20)\nR()"})
	requireOK(t, r)
	require.Equal(t, strings.Repeat("✓", MaxValueReprBytes/3), r.ValueRepr)
	// A str subclass that is no str to its own methods.
	r = run(t, p, Job{Code: `class S(str):
    def __str__(self): return 'forged'
    def encode(self, *a): return b'forged'
    def __getitem__(self, i): return 'forged'
class R:
    def __repr__(self): return S('real')
R()`})
	requireOK(t, r)
	require.Equal(t, "real", r.ValueRepr)
	// A value whose repr never ends is bounded by the job's timeout.
	r = run(t, p, Job{Timeout: 500 * time.Millisecond, Code: "class R:\n    def __repr__(self):\n        while True:\n            pass\nR()"})
	requireErrorType(t, r, "TimeoutError")
	require.Empty(t, r.ValueRepr)
	// So is one whose JSON encoding never ends (a dict subclass's items).
	// Whichever comes first: the timeout, or the memory allowance (the
	// encoder's list of items grows without end; MemoryError, then the
	// repr), depending on the machine's speed.
	r = run(t, p, Job{Timeout: 500 * time.Millisecond, Code: "import itertools\nclass D(dict):\n    def items(self):\n        return ((str(i), i) for i in itertools.count())\nD(a=1)"})
	if r.Error != nil {
		requireErrorType(t, r, "TimeoutError")
	} else {
		require.Empty(t, r.Value)
		require.Equal(t, "{'a': 1}", r.ValueRepr)
	}
	// A value that exits the process while it is encoded ends the job
	// with its status, and no value.
	r = run(t, p, Job{Code: "import os\nclass R:\n    def __repr__(self):\n        os._exit(9)\nR()"})
	require.Equal(t, 9, r.Exit)
	require.Empty(t, r.ValueRepr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := p.Run(ctx, Job{Code: "[1, 2]"})
	require.NoError(t, err)
	require.JSONEq(t, "[1, 2]", string(res.Value))
}
