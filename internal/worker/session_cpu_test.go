package worker

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestSessionStepCPULimit runs a session step that lifts its soft
// CPU-time limit as far as it can, ignores SIGXCPU and spins on one
// thread: the pool ends it once it has used its step's allowance (here
// 1 s, and 1 s more) past the CPU time of the steps before, long before
// its timeout. Its hard limit, which the code cannot lift, is the
// session's whole life's.
func TestSessionStepCPULimit(t *testing.T) {
	testenv.Slow(t)
	tpl := startTestTemplate(t, false)
	c, err := tpl.Take(false, nil)
	require.NoError(t, err)
	defer c.Close()
	// The first step uses some CPU time, so that the second's allowance
	// starts above zero.
	o := c.Run(&Job{Code: "x = sum(range(5000000))\nprint('first')", Name: "<code>", Session: true,
		Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10}, Timeout: time.Minute, MaxOutput: 1 << 16}, nil)
	require.True(t, o.Alive, "setup error %q, stderr %s", o.SetupError, o.Stderr)
	require.Equal(t, "first\n", string(o.Stdout))

	o = c.RunStep(&Step{Name: "<code>", Timeout: time.Minute, MaxOutput: 1 << 16, CPUSecs: 1, Code: "import resource, signal\n" +
		"signal.signal(signal.SIGXCPU, signal.SIG_IGN)\n" +
		"soft, hard = resource.getrlimit(resource.RLIMIT_CPU)\n" +
		"print('hard', hard, flush=True)\n" +
		"try:\n" +
		"    resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n" +
		"except ValueError:\n" +
		"    print('refused', flush=True)\n" +
		"resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))\n" +
		"while True:\n" +
		"    pass\n"}, nil)
	require.False(t, o.TimedOut, "the step ran to its timeout: its CPU time was not limited")
	require.True(t, o.CPUExceeded, "status %+v, stderr %s", o.Status, o.Stderr)
	require.False(t, o.Alive)
	require.Equal(t, fmt.Sprintf("hard %d\nrefused\n", SessionCPU), string(o.Stdout), "stderr: %s", o.Stderr)
}
