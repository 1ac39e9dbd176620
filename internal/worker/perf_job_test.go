package worker

import (
	"os/exec"
	"time"

	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A spare's descriptors, as the host holds them, are close-on-exec (set by
// the kernel as it received them, MSG_CMSG_CLOEXEC, no fcntl each: issue
// 12) and its output and bell pipes non-blocking (one F_SETFL each), and
// its job runs.
func TestSpareDescriptorFlags(t *testing.T) {
	tpl := startTestTemplate(t, false)
	c, err := tpl.Take(false, nil)
	require.NoError(t, err)
	for _, fd := range []int{c.ctlFd, c.stdoutFd, c.stderrFd, c.pidfd, c.bellFd} {
		f, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		require.NoError(t, err)
		require.NotZero(t, f&unix.FD_CLOEXEC, "descriptor %d is not close-on-exec", fd)
	}
	for _, fd := range []int{c.stdoutFd, c.stderrFd} {
		f, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		require.NoError(t, err)
		require.NotZero(t, f&unix.O_NONBLOCK, "pipe %d is blocking", fd)
		require.Equal(t, unix.O_RDONLY, f&unix.O_ACCMODE)
	}
	c.Close()
	o := runTestJob(t, tpl, Job{Code: "print('job')"})
	require.Equal(t, "job\n", string(o.Stdout), "setup error: %s", o.SetupError)
}

// A one-shot job's /proc files, opened once before its hand-over and read
// with pread at its report (issue 12), read the live process again and
// again, and fail once it is reaped: never another process's figures.
func TestProcFilesReadAgainThenFail(t *testing.T) {
	cmd := exec.Command("/bin/sleep", "60")
	require.NoError(t, cmd.Start())
	pid := cmd.Process.Pid
	f, err := openProcFiles(pid)
	require.NoError(t, err)
	defer f.close()
	for range 3 {
		u, err := f.read(pid, true)
		require.NoError(t, err)
		require.Positive(t, u.MaxRSS)
	}
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	_, err = f.read(pid, false)
	require.Error(t, err, "a reaped process's /proc file must not read")
}

// A one-shot job's usage comes through those files: it is reported, and
// they are closed once it is.
func TestJobUsageThroughProcFiles(t *testing.T) {
	tpl := startTestTemplate(t, false)
	c, err := tpl.Take(false, nil)
	require.NoError(t, err)
	defer c.Close()
	job := Job{Code: "x = bytearray(8 << 20)\nprint('ok')", Name: "<code>", Timeout: 10 * time.Second, MaxOutput: 1 << 16,
		Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10}}
	o := c.Run(&job, nil)
	require.Equal(t, "ok\n", string(o.Stdout), "setup error: %s", o.SetupError)
	require.NotNil(t, o.Usage)
	require.GreaterOrEqual(t, o.Usage.MaxRSS, int64(8<<20))
	require.False(t, c.procFiles.held(), "the /proc files are closed once the usage is read")
}
