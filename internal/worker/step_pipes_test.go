package worker

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// pipeDescriptors counts this process's descriptors that are pipes.
func pipeDescriptors(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "pipe:") {
			n++
		}
	}
	return n
}

// TestSessionStepPipesMadeAhead checks that a session's next step's output
// pipes are made while the current step runs (step_pipes.go), that every
// step still gets pipes of its own (new ones each step, never handed out
// before), that each step's output is its own, and that closing the
// session closes the pipes made ahead.
func TestSessionStepPipesMadeAhead(t *testing.T) {
	tpl := startTestTemplate(t, false)
	before := pipeDescriptors(t)
	c, err := tpl.Take(false, nil)
	require.NoError(t, err)
	defer c.Close()
	o := c.Run(&Job{Code: "print('step 1')", Name: "<code>", Session: true,
		Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10}, Timeout: time.Minute, MaxOutput: 1 << 16}, nil)
	require.True(t, o.Alive, "setup error %q, stderr %s", o.SetupError, o.Stderr)
	require.Equal(t, "step 1\n", string(o.Stdout))

	// The inode of the read end of the pipes made ahead, which must be new
	// at every step.
	ahead := func() uint64 {
		c.pidMu.Lock()
		defer c.pidMu.Unlock()
		require.True(t, c.nextPipes.held, "no pipes were made ahead for the next step")
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(c.nextPipes.out[0], &st))
		return st.Ino
	}
	seen := map[uint64]bool{ahead(): true}
	for i := 2; i <= 4; i++ {
		want := "step " + string(rune('0'+i)) + "\n"
		o := c.RunStep(&Step{Name: "<code>", Timeout: time.Minute, MaxOutput: 1 << 16, CPUSecs: 10, Code: "print('" + strings.TrimSuffix(want, "\n") + "')"}, nil)
		require.True(t, o.Alive, "stderr %s", o.Stderr)
		require.Equal(t, want, string(o.Stdout), "step %d's output", i)
		ino := ahead()
		require.False(t, seen[ino], "step %d's pipes made ahead were made before", i+1)
		seen[ino] = true
	}
	c.Close()
	c.pidMu.Lock()
	held := c.nextPipes.held
	c.pidMu.Unlock()
	require.False(t, held)
	require.Eventually(t, func() bool { return pipeDescriptors(t) <= before }, 5*time.Second, 10*time.Millisecond,
		"closing the session left pipes open: %d before, %d after", before, pipeDescriptors(t))
}
