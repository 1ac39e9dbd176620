package worker

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/pynox/pynox/internal/sandbox"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestTemplateCPUs checks Options.CPUs: a template pins itself to the
// CPUs it is given and says so in Info.CPUs; without any it reports the
// affinity it inherited; a CPU the kernel refuses (one that does not
// exist) leaves the inherited affinity and is reported in Info.PinErr,
// without failing the start (pinning is not a confinement step).
func TestTemplateCPUs(t *testing.T) {
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock: %v", err)
	}
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	var set unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &set))
	var allowed []int
	for c := range 1024 {
		if set.IsSet(c) {
			allowed = append(allowed, c)
		}
	}
	start := func(cpus []int) Info {
		tpl, err := Start(Options{Python: py, Dir: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}, CPUs: cpus})
		require.NoError(t, err)
		defer tpl.Close()
		return tpl.Info()
	}
	info := start(nil)
	require.Equal(t, allowed, info.CPUs)
	require.Empty(t, info.PinErr)

	last := allowed[len(allowed)-1]
	info = start([]int{last})
	require.Equal(t, []int{last}, info.CPUs)
	require.Empty(t, info.PinErr)

	info = start([]int{1023})
	require.False(t, slices.Contains(allowed, 1023))
	require.Equal(t, allowed, info.CPUs, "a refused CPU leaves the inherited affinity")
	require.Contains(t, info.PinErr, "sched_setaffinity")
}
