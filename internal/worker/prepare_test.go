package worker

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// fdTarget is what descriptor fd of this process names, or "".
func fdTarget(fd int) string {
	s, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	return s
}

// A spare's /proc stat and status are opened when it is delivered, not
// when its job comes (issue 12: three system calls off the job's path),
// and they are the spare's own; the job takes them, its usage is read
// through them, and they are closed once it is.
func TestSpareProcFilesOpenedAtDelivery(t *testing.T) {
	tpl := startTestTemplate(t, false)
	c, err := tpl.Take(false, nil)
	require.NoError(t, err)
	defer c.Close()
	c.pidMu.Lock()
	f := c.prepared
	c.pidMu.Unlock()
	require.True(t, f.held(), "the spare's /proc files are opened at its delivery")
	pid := strconv.Itoa(c.Pid())
	require.Equal(t, "/proc/"+pid+"/stat", fdTarget(f.stat))
	require.Equal(t, "/proc/"+pid+"/status", fdTarget(f.status))

	job := Job{Code: "x = bytearray(8 << 20)\nprint('ok')", Name: "<code>", Timeout: 10 * time.Second, MaxOutput: 1 << 16,
		Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10}}
	o := c.Run(&job, nil)
	require.Equal(t, "ok\n", string(o.Stdout), "setup error: %s", o.SetupError)
	require.NotNil(t, o.Usage)
	require.GreaterOrEqual(t, o.Usage.MaxRSS, int64(8<<20))
	require.Positive(t, o.Usage.CPU)
	require.False(t, c.procFiles.held())
	c.pidMu.Lock()
	require.False(t, c.prepared.held(), "the job took the prepared files")
	c.pidMu.Unlock()
	require.NotEqual(t, "/proc/"+pid+"/stat", fdTarget(f.stat), "the files are closed once the usage is read")
}

// A spare closed without a job (a pool's Close, a dead template) closes
// the files opened at its delivery: no descriptor is left behind.
func TestSpareProcFilesClosedWithUnusedSpare(t *testing.T) {
	testenv.Slow(t)
	tpl := startTestTemplate(t, false)
	c, err := tpl.Take(false, nil)
	require.NoError(t, err)
	c.pidMu.Lock()
	f := c.prepared
	c.pidMu.Unlock()
	require.True(t, f.held())
	pid := strconv.Itoa(c.Pid())
	c.Close()
	c.pidMu.Lock()
	require.False(t, c.prepared.held())
	c.pidMu.Unlock()
	require.NotEqual(t, "/proc/"+pid+"/stat", fdTarget(f.stat))
	require.NotEqual(t, "/proc/"+pid+"/status", fdTarget(f.status))
}

// With HoldClose, Run ends its job's process (it is killed and reaped)
// but leaves the child's descriptors and cgroup to the caller's Close,
// which the pool calls once the answer is written (issue 12).
func TestHoldCloseLeavesCloseToCaller(t *testing.T) {
	tpl := startTestTemplate(t, false)
	c, err := tpl.Take(false, nil)
	require.NoError(t, err)
	c.HoldClose()
	job := Job{Code: "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\nprint('ok')",
		Name: "<code>", Timeout: 10 * time.Second, MaxOutput: 1 << 16, Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10}}
	o := c.Run(&job, nil)
	require.Equal(t, "ok\n", string(o.Stdout), "setup error: %s", o.SetupError)
	require.NotNil(t, o.Usage)
	require.True(t, c.WaitReaped(10*time.Second), "the process is killed at once, Close or not")
	require.False(t, isClosed(c.closed), "Close is left to the caller")
	c.pidMu.Lock()
	require.GreaterOrEqual(t, c.pidfd, 0)
	c.pidMu.Unlock()
	c.Close()
	require.True(t, isClosed(c.closed))
	c.pidMu.Lock()
	require.Equal(t, -1, c.pidfd)
	c.pidMu.Unlock()
}
