package worker

import (
	"io"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestRawConnRead: the raw read of a non-blocking pipe behaves as
// os.File.Read does: it waits in the poller for data, returns what is
// there, io.EOF once the write end is closed, and an error when the file
// is closed while a read waits.
func TestRawConnRead(t *testing.T) {
	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK))
	r := os.NewFile(uintptr(p[0]), "r")
	w := os.NewFile(uintptr(p[1]), "w")
	rc, err := r.SyscallConn()
	require.NoError(t, err)
	buf := make([]byte, 16)

	got := make(chan string, 1)
	go func() {
		n, err := rawConnRead(rc, buf)
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- string(buf[:n])
	}()
	time.Sleep(20 * time.Millisecond) // the read waits in the poller
	_, err = w.Write([]byte("ring"))
	require.NoError(t, err)
	require.Equal(t, "ring", <-got)

	require.NoError(t, w.Close())
	n, err := rawConnRead(rc, buf)
	require.Zero(t, n)
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, r.Close())

	// Closing the file ends a waiting read with an error.
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK))
	r = os.NewFile(uintptr(p[0]), "r")
	defer unix.Close(p[1])
	rc, err = r.SyscallConn()
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { _, err := rawConnRead(rc, buf); done <- err }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, r.Close())
	select {
	case err := <-done:
		require.Error(t, err)
		require.NotErrorIs(t, err, io.EOF)
	case <-time.After(10 * time.Second):
		t.Fatal("a read waiting on a closed file did not end")
	}
}

// TestRawRecvAndRead: the raw recvfrom and read return the bytes there,
// EAGAIN when there are none, and 0 at end of file.
func TestRawRecvAndRead(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fds[0])
	buf := make([]byte, 8)
	_, err = rawRecv(fds[0], buf, unix.MSG_DONTWAIT)
	require.ErrorIs(t, err, unix.EAGAIN)
	_, err = unix.Write(fds[1], []byte("frame"))
	require.NoError(t, err)
	n, err := rawRecv(fds[0], buf, unix.MSG_DONTWAIT)
	require.NoError(t, err)
	require.Equal(t, "frame", string(buf[:n]))
	require.NoError(t, unix.Close(fds[1]))
	n, err = rawRead(fds[0], buf)
	require.NoError(t, err)
	require.Zero(t, n, "end of file")
}
