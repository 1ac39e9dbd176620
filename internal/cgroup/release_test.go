package cgroup

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReleaseRacesReuse: a group released on one goroutine and taken
// again by NewGroup on another is released again by its next holder. Only
// the manager's mutex orders the two goroutines. Release used to run under
// a sync.Once that NewGroup reset for the next holder while the first
// release was still finishing it: the race detector reports that, and the
// first release's late "done" could make the next holder's Release a
// no-op, so the group was never given back and Manager.Close waited 35 s
// for it and then left it in place.
func TestReleaseRacesReuse(t *testing.T) {
	m := requireManager(t)
	g, err := m.NewGroup(32 << 20)
	require.NoError(t, err)
	for i := 0; i < 200; i++ {
		go g.Release()
		for deadline := time.Now().Add(10 * time.Second); ; {
			m.mu.Lock()
			n := len(m.free)
			m.mu.Unlock()
			if n > 0 {
				break
			}
			require.True(t, time.Now().Before(deadline), "round %d: Release never gave the empty group back", i)
			time.Sleep(10 * time.Microsecond)
		}
		g2, err := m.NewGroup(32 << 20)
		require.NoError(t, err)
		require.Same(t, g, g2, "the released group is reused")
	}
	g.Release()
	m.mu.Lock()
	n := len(m.free)
	m.mu.Unlock()
	require.Equal(t, 1, n, "the last holder's Release gave the group back")
	require.NoError(t, m.Close())
}
