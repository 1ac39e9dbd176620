package worker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// outputPipesForTest returns a Child of a template holding bp whose
// output pipes' read ends are non-blocking, and the pipes' write ends.
func outputPipesForTest(t *testing.T, bp *bellPoller) (c *Child, outW, errW int) {
	t.Helper()
	out, errp, err := outputPipes()
	require.NoError(t, err)
	return &Child{tpl: &Template{bells: bp}, stdoutFd: out[0], stderrFd: errp[0]}, out[1], errp[1]
}

func awaitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the output did not end", what)
	}
}

// TestOutputPipesThroughTemplatePoller: output pipes still open when a
// turn's capture starts are read through the template's epoll instance,
// not os.Files of their own (whose registration with Go's poller and
// closes cost system calls and, at the close, a wake-up of the runtime's
// monitor): output written before and after the capture started is all
// kept, the capture ends at both pipes' end of file, and cutOff, or the
// instance's end, ends it early keeping what was read; every pipe leaves
// the instance.
func TestOutputPipesThroughTemplatePoller(t *testing.T) {
	bp, err := newBellPoller()
	require.NoError(t, err)
	defer bp.close()
	pipesLeft := func() int {
		bp.mu.Lock()
		defer bp.mu.Unlock()
		return len(bp.pipes)
	}

	c, outW, errW := outputPipesForTest(t, bp)
	unix.Write(outW, []byte("early "))
	o := newOutput(1<<16, nil)
	o.start(c)
	require.Empty(t, o.files, "no os.File for a pipe")
	require.NotNil(t, o.pipes)
	unix.Write(outW, []byte("late"))
	unix.Write(errW, []byte("err"))
	unix.Close(outW)
	unix.Close(errW)
	awaitClosed(t, o.closed, "end of file")
	var oc Outcome
	o.finish(&oc)
	require.Equal(t, "early late", string(oc.Stdout))
	require.Equal(t, "err", string(oc.Stderr))
	require.Zero(t, pipesLeft())

	// stderr at end of file already, stdout held open elsewhere: cutOff.
	c, outW, errW = outputPipesForTest(t, bp)
	defer unix.Close(outW)
	unix.Close(errW)
	unix.Write(outW, []byte("kept"))
	o = newOutput(1<<16, nil)
	o.start(c)
	require.Empty(t, o.files)
	require.Equal(t, 1, pipesLeft(), "only the open pipe is watched")
	o.cutOff()
	awaitClosed(t, o.closed, "cutOff")
	o.finish(&oc)
	require.Equal(t, "kept", string(oc.Stdout))
	require.Zero(t, pipesLeft())

	// The instance ends (its template is gone) while a pipe is read.
	c, outW2, errW2 := outputPipesForTest(t, bp)
	defer unix.Close(outW2)
	defer unix.Close(errW2)
	o = newOutput(1<<16, nil)
	o.start(c)
	unix.Write(errW2, []byte("before the end"))
	require.Eventually(t, func() bool {
		bp.mu.Lock()
		defer bp.mu.Unlock()
		return len(o.stderr.keep) > 0
	}, 10*time.Second, time.Millisecond)
	bp.close()
	awaitClosed(t, o.closed, "the instance's end")
	o.finish(&oc)
	require.Equal(t, "before the end", string(oc.Stderr))
	require.Zero(t, pipesLeft())
	require.Nil(t, bp.watchPipes([]int{outW2}, []*sink{&o.stdout}, make(chan struct{})), "a closed instance takes no pipe")
}
