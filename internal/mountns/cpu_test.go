package mountns

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// mounterCPU is the CPU time the mounter used, its reaped builder
// children's included (utime, stime, cutime and cstime of its stat).
func mounterCPU(t testing.TB, m *Mounter) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(m.cmd.Process.Pid) + "/stat")
	require.NoError(t, err)
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var ticks int64
	for _, i := range []int{11, 12, 13, 14} { // fields 14-17, counted from the state (3)
		n, err := strconv.ParseInt(f[i], 10, 64)
		require.NoError(t, err)
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ 100
}
