package pynox

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSessionHoldsOneSetOfProcFiles: a live session's process is read
// through one stat and one status descriptor of the host's, those opened
// when its process was delivered (the final review found each session
// holding a second, unused pair for its whole life).
func TestSessionHoldsOneSetOfProcFiles(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	co, err := p.Checkout(context.Background(), Job{})
	require.NoError(t, err)
	defer co.Finish(context.Background())
	for range 3 {
		feedOK(t, co, "x = 1")
	}
	pid := co.Pid()
	require.NotZero(t, pid)
	count := map[string]int{}
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	base := "/proc/" + strconv.Itoa(pid) + "/"
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		if len(l) > len(base) && l[:len(base)] == base {
			count[l[len(base):]]++
		}
	}
	require.Equal(t, 1, count["stat"], "descriptors of the session process's files: %v", count)
	require.Equal(t, 1, count["status"], "descriptors of the session process's files: %v", count)
}
