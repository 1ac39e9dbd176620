package jsonl

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// TestHostErrorTypeOverJSONL: a reply's error_type raises that builtin
// type (still a HostError); an unknown error_type is a RequestError and
// the call fails with plain HostError; error_type without error is
// refused.
func TestHostErrorTypeOverJSONL(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": "t1", "functions": ["page"], "code": "from pynox_host import page, HostError\n` +
		`for i in range(2):\n    try:\n        page(i)\n    except KeyError as e:\n        print('key', isinstance(e, HostError), e.args[0])\n    except HostError as e:\n        print(type(e).__name__, e)"}`)
	c := ls.call()
	ls.send(fmt.Sprintf(`{"reply": {"call_id": %s, "error": "no such page", "error_type": "KeyError"}}`, c["call_id"]))
	c = ls.call()
	ls.send(fmt.Sprintf(`{"id": "r2", "reply": {"call_id": %s, "error": "odd", "error_type": "__import__('os').system('x')"}}`, c["call_id"]))
	r := ls.await("r2")
	require.Equal(t, "RequestError", errType(r))
	require.Contains(t, r["error"].(map[string]any)["message"], "error_type")
	r = ls.await("t1")
	requireLineOK(t, r)
	require.Equal(t, "key True no such page\nHostError odd\n", r["stdout"])

	ls.send(`{"id": "r3", "reply": {"call_id": 1, "result": 1, "error_type": "KeyError"}}`)
	require.Equal(t, "RequestError", errType(ls.await("r3")))
	require.Empty(t, ls.finish())
}

// TestClientRaiseAs: the Go client passes a HostFunc's RaiseAs on as
// error_type.
func TestClientRaiseAs(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	c := startClient(t, p)
	res, err := c.Run(context.Background(), pynox.Job{Functions: []string{"f"}, Code: "from pynox_host import f\ntry:\n    f()\nexcept FileNotFoundError as e:\n    print('fnf', e.args[0])",
		Host: func(context.Context, *pynox.Call) (any, error) {
			return nil, pynox.RaiseAs("FileNotFoundError", "gone")
		}})
	require.NoError(t, err)
	requireOK(t, res)
	require.Equal(t, "fnf gone\n", res.Stdout)
}

// TestDeclaredToolsOverJSONL: "functions" takes function objects with a
// doc and a signature; the job sees them, and a call that does not fit
// the signature is a TypeError in the job and never a call event.
func TestDeclaredToolsOverJSONL(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": "t1", "functions": ["plain", {"name": "search", "doc": "Searches the docs.", "signature": "(query: str, limit: int = 3) -> list[str]"}], ` +
		`"code": "import inspect\nfrom pynox_host import search, plain\nprint(inspect.signature(search), search.__doc__)\n` +
		`try:\n    search('q', limt=2)\nexcept TypeError as e:\n    print('TypeError', e)\nprint(search('q', limit=1))"}`)
	c := ls.call()
	require.Equal(t, "search", c["function"])
	require.Equal(t, map[string]any{"limit": json.Number("1")}, c["kwargs"], "the bad call made no call event")
	ls.send(fmt.Sprintf(`{"reply": {"call_id": %s, "result": ["hit"]}}`, c["call_id"]))
	r := ls.await("t1")
	requireLineOK(t, r)
	require.Equal(t, "(query: str, limit: int = 3) -> list[str] Searches the docs.\nTypeError search(): got an unexpected keyword argument 'limt'\n['hit']\n", r["stdout"])
	require.Equal(t, json.Number("1"), r["calls"])

	for _, fns := range []string{
		`[{"name": "f", "Doc": "x"}]`,
		`[{"doc": "x"}]`,
		`[{"name": "f", "signature": 3}]`,
		`[{"name": "f", "signature": "(a, a)"}]`,
		`[{"name": "f", "signature": "(a):\n pass"}]`,
		`[7]`,
		`["f", {"name": "f"}]`,
	} {
		ls.send(`{"id": "bad", "functions": ` + fns + `, "code": "1"}`)
		r := ls.await("bad")
		require.Equal(t, "RequestError", errType(r), fns)
		require.Contains(t, r["error"].(map[string]any)["message"], "functions", fns)
	}

	// A session's first request declares tools; a later one may not.
	ls.send(`{"id": "s1", "session": "tl", "functions": [{"name": "kv", "signature": "(key)"}], "code": "from pynox_host import kv\ntry:\n    kv()\nexcept TypeError as e:\n    print(e)"}`)
	r = ls.await("s1")
	requireLineOK(t, r)
	require.Equal(t, "kv(): missing a required argument: 'key'\n", r["stdout"])
	ls.send(`{"id": "s2", "session": "tl", "functions": [{"name": "kv"}], "code": "1"}`)
	require.Equal(t, "RequestError", errType(ls.await("s2")))
	require.Empty(t, ls.finish())
}

// TestClientSendsTools: the Go client carries Job.Tools as function
// objects.
func TestClientSendsTools(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	c := startClient(t, p)
	res, err := c.Run(context.Background(), pynox.Job{Tools: []pynox.Tool{{Name: "f", Doc: "Does f.", Signature: "(x: int)"}},
		Code: "import inspect\nfrom pynox_host import f\nprint(inspect.signature(f), f.__doc__, f(x=2))",
		Host: func(_ context.Context, c *pynox.Call) (any, error) { return json.RawMessage(c.Kwargs), nil }})
	require.NoError(t, err)
	requireOK(t, res)
	require.Equal(t, "(x: int) Does f. {'x': 2}\n", res.Stdout)
}

// TestAsyncHostCallsOverJSONL: three calls awaited together are three
// call events before any reply; replied to in reverse order, the gathered
// result is right.
func TestAsyncHostCallsOverJSONL(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": "a1", "functions": ["search"], "code": "import asyncio\nfrom pynox_host import aio\n` +
		`async def main():\n    return await asyncio.gather(aio.search('a'), aio.search('b'), aio.search('c'))\nprint(asyncio.run(main()))"}`)
	var calls []map[string]any
	for range 3 {
		calls = append(calls, ls.call())
	}
	for i := 2; i >= 0; i-- {
		c := calls[i]
		ls.send(fmt.Sprintf(`{"reply": {"call_id": %s, "result": "hit for %s"}}`, c["call_id"], c["args"].([]any)[0]))
	}
	r := ls.await("a1")
	requireLineOK(t, r)
	require.Equal(t, "['hit for a', 'hit for b', 'hit for c']\n", r["stdout"])
	require.Empty(t, ls.finish())
}
