package cgroup

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGroupReusePrefersSameLimit: NewGroup hands out a free group that
// has the memory limit asked for already, even when another was freed
// later (templates ask for limits of their own and share the free list;
// a match spares the limit's writes), and the limit it returns is the
// one asked for, in the kernel too.
func TestGroupReusePrefersSameLimit(t *testing.T) {
	m := requireManager(t)
	defer m.Close()
	limitOf := func(g *Group) int64 {
		b, err := os.ReadFile(filepath.Join(g.memDir, map[string]string{V1: "memory.limit_in_bytes", V2: "memory.max"}[m.Backend()]))
		require.NoError(t, err)
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		require.NoError(t, err)
		return n
	}
	const a, b = 32 << 20, 48 << 20
	ga, err := m.NewGroup(a)
	require.NoError(t, err)
	gb, err := m.NewGroup(b)
	require.NoError(t, err)
	dirsA, dirsB := ga.Dirs(), gb.Dirs()
	gb.Release()
	ga.Release() // freed last

	g, err := m.NewGroup(b)
	require.NoError(t, err)
	require.Equal(t, dirsB, g.Dirs(), "the free group with the limit asked for is reused")
	require.Equal(t, int64(b), limitOf(g))
	g2, err := m.NewGroup(b)
	require.NoError(t, err)
	require.Equal(t, dirsA, g2.Dirs(), "with no match, another free group is reused")
	require.Equal(t, int64(b), g2.Memory())
	require.Equal(t, int64(b), limitOf(g2))
	g.Release()
	g2.Release()
}
