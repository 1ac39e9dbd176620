package main

import (
	"context"
	"io"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestBlockOrder: a pair's blocks alternate in ABBA order, each row gets
// as many blocks as the other, and for an even number of blocks each
// row's mean position in the sequence is the same (a linear drift of the
// machine's speed weighs on both rows alike); the blocks' sizes add up to
// n and differ by at most one.
func TestBlockOrder(t *testing.T) {
	require.Equal(t, []int{0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0}, blockOrder(6))
	require.Equal(t, []int{0, 1}, blockOrder(1))
	for _, blocks := range []int{2, 4, 6, 8} {
		var pos [2]int
		var count [2]int
		for i, w := range blockOrder(blocks) {
			pos[w] += i
			count[w]++
		}
		require.Equal(t, [2]int{blocks, blocks}, count, "blocks=%d", blocks)
		require.Equal(t, pos[0], pos[1], "blocks=%d: mean positions differ", blocks)
	}
	require.Equal(t, []int{50, 50, 50, 50, 50, 50}, blockSizes(300, 6))
	require.Equal(t, []int{84, 84, 83, 83, 83, 83}, blockSizes(500, 6))
	require.Equal(t, []int{3, 2, 2}, blockSizes(7, 3))
	require.Equal(t, []int{1, 1}, blockSizes(2, 6), "no empty blocks")
	require.Equal(t, []int{5}, blockSizes(5, 1))
}

// TestInterleavedPairs runs --only=limit and --only=mounts in a tiny mode
// and checks the blocks as they ran: each pair's rows took turns on their
// servers in ABBA order, pynox's row first, each row in --blocks blocks
// that hold n requests in all, and every row reports n samples and its
// CPU per job.
func TestInterleavedPairs(t *testing.T) {
	requireBenchable(t)
	// ~6 CPU-s: a build of pynox, a pool, the limit loop and a pool with
	// confine_self = false, 14 jobs per row.
	testenv.RequireLong(t, "the bench's interleaved pairs")
	const n = 7
	bin := t.TempDir() + "/pynox"
	out, err := exec.Command("go", "build", "-o", bin, "github.com/pynox/pynox/cmd/pynox").CombinedOutput()
	require.NoError(t, err, "%s", out)
	sizes := []int{3, 3, 2, 2, 2, 2} // blockSizes(7, 3), in ABBA order
	abba := func(a, b string) []blockRecord {
		var want []blockRecord
		for i, w := range blockOrder(3) {
			want = append(want, blockRecord{Row: []string{a, b}[w], N: sizes[i]})
		}
		return want
	}
	for _, c := range []struct {
		only  string
		pairs [][2]string
	}{
		{"limit", [][2]string{{"1", "L1"}, {"2", "L2"}, {"13", "L5"}}},
		{"mounts", [][2]string{{"28", "29"}}},
	} {
		t.Run(c.only, func(t *testing.T) {
			o, ok := parseOptions([]string{"--only=" + c.only, "--pynox=" + bin, "--n=7", "--warm=2", "--blocks=3", "--pandas=off"}, io.Discard)
			require.True(t, ok)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			rep, err := bench(ctx, o)
			require.NoError(t, err)
			require.Contains(t, rep.Settings, "blocks=3")
			if c.only == "mounts" && rep.row("28").Skipped != "" {
				require.Empty(t, rep.blocks)
				t.Skipf("rows 28 and 29 skipped: %s", rep.row("28").Skipped)
			}
			var want []blockRecord
			for _, p := range c.pairs {
				want = append(want, abba(p[0], p[1])...)
			}
			require.Equal(t, want, rep.blocks)
			for _, p := range c.pairs {
				for _, id := range p {
					r := rep.row(id)
					require.Equal(t, n, r.N, "row #%s", id)
					require.NotZero(t, r.CPUPerJobUS, "row #%s", id)
					require.Positive(t, r.CPUHostUS, "row #%s: the server process's own CPU", id)
					if id == "L5" || id == "13" {
						require.Positive(t, r.JobsPerS, "row #%s", id)
					}
				}
			}
			for _, l := range rep.Limit {
				// CPU per job may come out negative over 7 jobs (tick
				// rounding of what the tree reaped, see TestTinyRunJSON).
				require.NotZero(t, l.Pynox, "row %s", l.ID)
				require.NotZero(t, l.Limit, "row %s", l.ID)
			}
			if c.only == "mounts" {
				require.Positive(t, rep.row("29").Ratio)
			}
		})
	}
}
