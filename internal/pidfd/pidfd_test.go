//go:build linux

package pidfd

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestPid(t *testing.T) {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	defer unix.Close(fd)
	pid, err := Pid(fd)
	require.NoError(t, err)
	require.Equal(t, os.Getpid(), pid)
	_, err = Pid(0) // not a pidfd
	require.Error(t, err)
}
