package pynox

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// feedOK runs one step and requires it to succeed.
func feedOK(t *testing.T, co *Checkout, code string) *Result {
	t.Helper()
	ev, err := co.Feed(context.Background(), Step{Code: code})
	require.NoError(t, err)
	require.NotNil(t, ev.Result)
	requireOK(t, ev.Result)
	return ev.Result
}

func hasPandas() bool {
	return importErr(testPython(), "pandas") == nil
}

func TestDumpRestoreRoundTrip(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	// The DataFrame case (two pandas imports, ~1 CPU-s) runs with PYNOX_LONG=1.
	withPandas := os.Getenv(testenv.LongEnv) == "1" && hasPandas()
	setup := `
import json, os.path as osp
d = {"a": [1, 2, {"b": (3, 4)}], "s": {1, 2}}
same = d["a"]
scale = 10
def f(x, y=2, *, z=3):
    "Multiplies."
    return (x + y + z) * scale
def outer(n):
    def inner(m):
        return n + m
    return inner
add5 = outer(5)
sq = lambda v: v * v
gen = (i for i in range(3))
fh = open("/dev/null")
class Local: pass
obj = Local()
`
	if withPandas {
		// Large enough that pickle writes its columns as out-of-band
		// buffers (PickleBuffer).
		setup += "import pandas as pd\ndf = pd.DataFrame({'x': range(200_000), 'y': [str(i % 7) for i in range(200_000)]})\n"
	}
	feedOK(t, co, setup)
	feedOK(t, co, "counter = 1")
	dump, err := co.Dump(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, dump.Steps)
	require.ElementsMatch(t, []string{"gen", "fh", "Local", "obj"}, dump.Skipped)

	// The dumped session keeps running, its state intact.
	res := feedOK(t, co, "counter += 1\nprint(counter, f(1), next(gen), fh.closed)")
	require.Equal(t, "2 60 0 False\n", res.Stdout)
	require.Equal(t, 3, res.Step)
	require.NoError(t, co.Finish(ctx))

	co2, err := p.Restore(ctx, Job{}, dump.Data)
	require.NoError(t, err)
	defer co2.Finish(ctx)
	check := `
assert d == {"a": [1, 2, {"b": (3, 4)}], "s": {1, 2}}, d
assert same is d["a"]
assert f(1) == 60 and f.__doc__ == "Multiplies." and f(1, z=0) == 30
scale = 1
assert f(1) == 6  # the function reads the restored session's globals
assert add5(1) == 6 and sq(3) == 9
assert json.loads("[1]") == [1] and osp.join("a", "b") == "a/b"
assert counter == 1
for name in ("gen", "fh", "Local", "obj"):
    assert name not in globals(), name
print("ok")
`
	if withPandas {
		check += "assert df.equals(pd.DataFrame({'x': range(200_000), 'y': [str(i % 7) for i in range(200_000)]}))\nprint(df.x.sum())\n"
	}
	res = feedOK(t, co2, check)
	require.Equal(t, 3, res.Step)
	if withPandas {
		require.Equal(t, "ok\n19999900000\n", res.Stdout)
	} else {
		require.Equal(t, "ok\n", res.Stdout)
		t.Log("pandas is not installed for " + testPython() + ", or PYNOX_LONG is not 1: the DataFrame case was skipped")
	}
}

func TestDumpBeforeFirstStep(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	d, err := co.Dump(ctx)
	require.NoError(t, err)
	require.Zero(t, d.Steps)
	co2, err := p.Restore(ctx, Job{}, d.Data)
	require.NoError(t, err)
	res := feedOK(t, co2, "print(sorted(k for k in globals() if not k.startswith('__')))")
	require.Equal(t, "[]\n", res.Stdout)
	require.Equal(t, 1, res.Step)
	_ = strings.TrimSpace
}
