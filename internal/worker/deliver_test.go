package worker

import (
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/cgroup"
	"github.com/pynox/pynox/internal/sandbox"
)

// goroutinesIn counts the goroutines whose stack holds fn.
func goroutinesIn(fn string) int {
	return goroutinesInNotIn(fn, "")
}

// goroutinesInNotIn counts the goroutines whose stack holds fn but not
// outer (when outer is not empty): fn called on a goroutine of its own,
// not by outer.
func goroutinesInNotIn(fn, outer string) int {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	n := 0
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, fn) && (outer == "" || !strings.Contains(g, outer)) {
			n++
		}
	}
	return n
}

// TestSparesDeliveredByOneGoroutine: a template that puts its spares in
// cgroups moves each into its cgroup on one long-lived goroutine, not a
// new goroutine per spare (whose stack grew on the way through the join):
// jobs run one after another, each in a cgroup, one delivering goroutine
// serves them all, and it ends with the template.
func TestSparesDeliveredByOneGoroutine(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root here")
	}
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock, so jobs cannot run confined: %v", err)
	}
	m, err := cgroup.NewManager(cgroup.Require, 0)
	if err != nil {
		t.Skipf("no per-job cgroups on this machine: %v", err)
	}
	defer m.Close()
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	// Counted before Start: the template's first spare may be delivered
	// (its delivering goroutine started) before Start returns.
	before := goroutinesIn("worker.(*Template).deliverLoop")
	tpl, err := Start(Options{Python: py, Dir: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}, Cgroups: m})
	require.NoError(t, err)
	for i := range 5 {
		c, err := tpl.Take(false, nil)
		require.NoError(t, err)
		require.NotNil(t, c.cg, "job %d: the spare is in a cgroup", i)
		job := Job{Name: "<code>", Code: "print(6 * 7)", Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10},
			Timeout: 10 * time.Second, MaxOutput: 1 << 16}
		o := c.Run(&job, nil)
		require.True(t, o.Done, "job %d: setup error %q", i, o.SetupError)
		require.Equal(t, "42\n", string(o.Stdout))
		c.Close()
	}
	require.Equal(t, before+1, goroutinesIn("worker.(*Template).deliverLoop"), "one delivering goroutine for the template")
	// (The delivering goroutine may be in deliverTo, delivering the
	// spare that replaces the last one taken.)
	require.Zero(t, goroutinesInNotIn("worker.(*Template).deliverTo", "worker.(*Template).deliverLoop"), "no goroutine of its own per spare")
	tpl.Close()
	require.Eventually(t, func() bool { return goroutinesIn("worker.(*Template).deliverLoop") == before }, 10*time.Second, 10*time.Millisecond,
		"the delivering goroutine ends with its template")
}
