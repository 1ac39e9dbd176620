package main

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHostProcs checks the GOMAXPROCS `pynox pool` picks for its size: a
// P per four workers, at least one, never more than the runtime's own
// choice.
func TestHostProcs(t *testing.T) {
	for _, c := range []struct{ workers, def, want int }{
		{1, 2, 1}, {2, 2, 1}, {4, 8, 1}, {5, 8, 2}, {8, 8, 2}, {16, 8, 4}, {64, 8, 8}, {64, 1, 1}, {2, 1, 1},
	} {
		require.Equal(t, c.want, hostProcs(c.workers, c.def), "%d workers, default %d", c.workers, c.def)
	}
}

// TestSetHostProcs checks that the pool's GOMAXPROCS is applied, and that
// the GOMAXPROCS environment variable overrides it.
func TestSetHostProcs(t *testing.T) {
	prev := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(prev)
	t.Setenv("GOMAXPROCS", "")
	runtime.GOMAXPROCS(2)
	require.Equal(t, 1, setHostProcs(2))
	require.Equal(t, 1, runtime.GOMAXPROCS(0))

	runtime.GOMAXPROCS(2)
	t.Setenv("GOMAXPROCS", "2")
	require.Equal(t, 2, setHostProcs(2))
	require.Equal(t, 2, runtime.GOMAXPROCS(0), "the operator's GOMAXPROCS stands")
}
