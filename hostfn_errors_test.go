package pynox

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestHostRaiseAs: a host function's RaiseAs error reaches the job as
// that builtin type, which is still a pynox_host.HostError; an unknown
// type is plain HostError; a wrapped RaiseAs is found.
func TestHostRaiseAs(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	host := func(ctx context.Context, c *Call) (any, error) {
		switch c.Function {
		case "page":
			return nil, RaiseAs("KeyError", "no such page")
		case "perm":
			return nil, fmt.Errorf("wrapped: %w", RaiseAs("PermissionError", "not yours"))
		case "odd":
			return nil, RaiseAs("SystemExit", "nope")
		}
		return nil, errors.New("plain")
	}
	code := `from pynox_host import page, perm, odd, plain, HostError
try:
    page('x')
except KeyError as e:
    print(type(e).__name__, isinstance(e, HostError), e.args[0])
try:
    perm()
except PermissionError as e:
    print(type(e).__name__, isinstance(e, HostError), isinstance(e, OSError), e.args[0])
for f in (odd, plain):
    try:
        f()
    except HostError as e:
        print(type(e).__name__, e)
page('y')
`
	res := run(t, p, Job{Functions: []string{"page", "perm", "odd", "plain"}, Host: host, Code: code})
	require.Equal(t, "KeyError True no such page\nPermissionError True True not yours\nHostError nope\nHostError plain\n", res.Stdout)
	// Uncaught, the job's error is the builtin type's name.
	requireErrorType(t, res, "KeyError")

	// Every listed type is raised as itself.
	for _, typ := range HostErrorTypes() {
		res := run(t, p, Job{Functions: []string{"f"}, Host: func(context.Context, *Call) (any, error) {
			return nil, RaiseAs(typ, "m")
		}, Code: "import builtins\nfrom pynox_host import f, HostError\ntry:\n    f()\nexcept builtins." + typ + " as e:\n    print(type(e).__name__, isinstance(e, HostError))"})
		requireOK(t, res)
		require.Equal(t, typ+" True\n", res.Stdout)
	}

	// A job that rebinds the builtin does not change what it catches.
	res = run(t, p, Job{Functions: []string{"page"}, Host: host, Code: "import builtins\nreal = KeyError\nbuiltins.KeyError = ValueError\n" +
		"from pynox_host import page\ntry:\n    page()\nexcept real as e:\n    print('real', type(e).__mro__[1] is real)"})
	requireOK(t, res)
	require.Equal(t, "real True\n", res.Stdout)
}

// TestCheckoutResumeRaiseError: Checkout.Resume answers with a typed
// error through RaiseError.
func TestCheckoutResumeRaiseError(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{Functions: []string{"get"}})
	require.NoError(t, err)
	defer co.Finish(ctx)
	ev, err := co.Feed(ctx, Step{Code: "from pynox_host import get\ntry:\n    get()\nexcept TimeoutError as e:\n    print('timeout', e)\nget()"})
	require.NoError(t, err)
	require.NotNil(t, ev.Call)
	ev, err = co.Resume(ctx, ev.Call.ID, RaiseError(RaiseAs("TimeoutError", "slow backend")))
	require.NoError(t, err)
	require.NotNil(t, ev.Call)
	ev, err = co.Resume(ctx, ev.Call.ID, RaiseError(errors.New("plain")))
	require.NoError(t, err)
	require.NotNil(t, ev.Result)
	require.Equal(t, "timeout slow backend\n", ev.Result.Stdout)
	requireErrorType(t, ev.Result, "HostError")
}
