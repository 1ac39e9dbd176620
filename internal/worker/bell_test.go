package worker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestBellThroughTemplatePoller: a child's bell is read through its
// template's epoll instance, not an os.File of its own (whose close went
// through syscall.Syscall and woke the runtime's monitor once per job):
// the job's frames arrive as before (a report with several prints, and a
// job writing many frames through host calls is covered by the package's
// other tests); once the child is closed its bell is out of the instance
// and its descriptor closed.
func TestBellThroughTemplatePoller(t *testing.T) {
	tpl := startTestTemplate(t, false)
	require.NotNil(t, tpl.bells, "the template has an epoll instance for its children's bells")
	for i := range 3 {
		c, err := tpl.Take(false, nil)
		require.NoError(t, err)
		job := Job{Name: "<code>", Code: "for i in range(3): print(i)",
			Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10}, Timeout: 10 * time.Second, MaxOutput: 1 << 16}
		o := c.Run(&job, nil)
		require.True(t, o.Done, "job %d: setup error %q", i, o.SetupError)
		require.Equal(t, "0\n1\n2\n", string(o.Stdout))
		require.Nil(t, c.bell, "no os.File for the bell")
		require.Positive(t, c.rung.Load(), "the bell rang")
		c.Close()
		tpl.bells.mu.Lock()
		_, held := tpl.bells.bells[c.bellID]
		tpl.bells.mu.Unlock()
		require.False(t, held, "a closed child's bell is out of the instance")
		require.Equal(t, -1, c.bellFd)
		require.True(t, isClosed(c.bellClosed))
	}
}

// TestBellPollerEndsWithTemplate: a template's end closes its epoll
// instance, and a bell it held reads as closed (the turn then polls the
// control socket).
func TestBellPollerEndsWithTemplate(t *testing.T) {
	bp, err := newBellPoller()
	require.NoError(t, err)
	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK))
	defer unix.Close(p[1])
	c := &Child{bellFd: p[0], rings: make(chan struct{}, 1), bellClosed: make(chan struct{})}
	require.True(t, bp.watch(c))
	unix.Write(p[1], []byte{1, 1})
	select {
	case <-c.rings:
	case <-time.After(10 * time.Second):
		t.Fatal("no ring")
	}
	require.Eventually(t, func() bool { return c.rung.Load() == 2 }, 10*time.Second, time.Millisecond)
	bp.close()
	select {
	case <-c.bellClosed:
	case <-time.After(10 * time.Second):
		t.Fatal("the bell did not read as closed")
	}
	require.False(t, bp.watch(c), "a closed instance takes no bell")
	c.closeBell()
}
