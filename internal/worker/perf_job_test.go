package worker

import (
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
	for _, fd := range []int{c.ctlFd, c.stdoutFd, c.stderrFd, c.pidfd, int(c.bell.Fd())} {
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
