package pynox

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestNumpyStreamsFreshPerJob checks numpy's global generator in jobs
// forked from one template with numpy preloaded: each job draws its own
// uniform and normal numbers (a spare gives the generator a fresh state,
// its cached normal deviate dropped, see runner.py: _reseed_numpy), and the
// state is the Mersenne Twister that numpy.random's legacy functions use.
func TestNumpyStreamsFreshPerJob(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	pandasAvailable(t)
	p := newTestPool(t, Config{Workers: 1, Preload: []string{"numpy"}, Limits: Limits{Memory: 256 << 20}})
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		r := run(t, p, Job{Code: "import numpy as np\nprint(np.random.get_state()[0], np.random.random(), np.random.standard_normal())"})
		requireOK(t, r)
		require.Regexp(t, `^MT19937 0\.\d+ -?\d`, r.Stdout)
		require.False(t, seen[r.Stdout], "two jobs drew the same numbers: %s", r.Stdout)
		seen[r.Stdout] = true
	}
}
