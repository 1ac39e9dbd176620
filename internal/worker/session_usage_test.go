package worker

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// procDescriptors lists this process's descriptors that name files of
// /proc/<pid>, by descriptor number.
func procDescriptors(t *testing.T, pid int) map[string]string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	prefix := "/proc/" + strconv.Itoa(pid) + "/"
	got := map[string]string{}
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, prefix) {
			got[e.Name()] = strings.TrimPrefix(target, prefix)
		}
	}
	return got
}

// TestSessionStepUsageThroughHeldFiles checks that a session's steps read
// their usage through /proc files the host opened once for the process's
// life (its stat, status and clear_refs), not per step, that the figures
// are still each step's own, and that closing the session closes them.
func TestSessionStepUsageThroughHeldFiles(t *testing.T) {
	testenv.Slow(t)
	tpl := startTestTemplate(t, false)
	c, err := tpl.Take(false, nil)
	require.NoError(t, err)
	defer c.Close()
	o := c.Run(&Job{Code: "print('first')", Name: "<code>", Session: true,
		Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10}, Timeout: time.Minute, MaxOutput: 1 << 16}, nil)
	require.True(t, o.Alive, "setup error %q, stderr %s", o.SetupError, o.Stderr)
	pid := c.Pid()
	step := func(code string) *Outcome {
		o := c.RunStep(&Step{Name: "<code>", Timeout: time.Minute, MaxOutput: 1 << 16, CPUSecs: 10, Code: code}, nil)
		require.True(t, o.Alive, "stderr %s", o.Stderr)
		require.NotNil(t, o.Usage)
		return o
	}
	step("x = 1")
	held := procDescriptors(t, pid)
	names := map[string]bool{}
	for _, n := range held {
		names[n] = true
	}
	require.Equal(t, map[string]bool{"stat": true, "status": true, "clear_refs": true}, names, "the session process's /proc files held by the host: %v", held)

	// A busy step's figures are its own: CPU time well above an idle
	// step's, and its peak RSS counts the memory it took.
	busy := step("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2:\n    pass\nb = bytearray(64 << 20)")
	idle := step("y = 2")
	require.Greater(t, busy.Usage.CPU, 150*time.Millisecond)
	require.Less(t, idle.Usage.CPU, 100*time.Millisecond)
	require.Greater(t, busy.Usage.MaxRSS, int64(64<<20))
	require.Equal(t, held, procDescriptors(t, pid), "the files were reopened")

	c.Close()
	require.Empty(t, procDescriptors(t, pid), "closing the session closes its /proc files")
}
