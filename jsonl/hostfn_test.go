package jsonl

import (
	"context"
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
