package worker

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSessionRepeatedCodeRunsAgain checks the runner's cache of compiled
// steps (_compile_cached): a step whose code an earlier step ran runs
// again in full (its side effects and its last expression's value are
// this run's), its traceback names this step's file name and lines, and
// a syntax error is reported every time.
func TestSessionRepeatedCodeRunsAgain(t *testing.T) {
	tpl := startTestTemplate(t, false)
	c, err := tpl.Take(false, nil)
	require.NoError(t, err)
	defer c.Close()
	o := c.Run(&Job{Code: "n = 0", Name: "<code>", Session: true,
		Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10}, Timeout: time.Minute, MaxOutput: 1 << 16}, nil)
	require.True(t, o.Alive, "setup error %q, stderr %s", o.SetupError, o.Stderr)
	step := func(code, name string) *Outcome {
		o := c.RunStep(&Step{Name: name, Timeout: time.Minute, MaxOutput: 1 << 16, CPUSecs: 10, Code: code}, nil)
		require.True(t, o.Alive, "stderr %s", o.Stderr)
		return o
	}
	for i := 1; i <= 3; i++ {
		o := step("n += 1\nprint(n)\nn * 10", "<code>")
		require.Equal(t, string(rune('0'+i))+"\n", string(o.Stdout))
		require.Equal(t, string(rune('0'+i))+"0", string(o.Value))
	}
	for _, name := range []string{"a.py", "b.py", "a.py"} {
		o := step("x = 1\n1 / 0", name)
		require.Equal(t, 1, o.Exit)
		require.Contains(t, string(o.Stderr), `File "`+name+`", line 2`)
	}
	for range 2 {
		o := step("def (", "<code>")
		require.NotNil(t, o.Error)
		require.Equal(t, "SyntaxError", o.Error.Type)
	}
	// More distinct sources than the cache holds, then the first again.
	for i := range 40 {
		step("v = "+strings.Repeat("1 + ", i)+"1", "<code>")
	}
	o = step("n += 1\nprint(n)\nn * 10", "<code>")
	require.Equal(t, "4\n", string(o.Stdout))
}
