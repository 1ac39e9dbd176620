package worker

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestBellPollerClosedBeforeItsDescriptor: once a template's epoll
// instance is closed, its descriptor number may be another's (here a
// new epoll instance's, as another template's would be): a bell watched
// after the close is not added to that other instance.
func TestBellPollerClosedBeforeItsDescriptor(t *testing.T) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	require.NoError(t, err)
	f := os.NewFile(uintptr(epfd), "bells")
	rc, err := f.SyscallConn()
	require.NoError(t, err)
	// No run goroutine: the close is seen by watch alone.
	bp := &bellPoller{f: f, rc: rc, epfd: epfd, bells: map[uint64]*Child{}, pipes: map[uint64]*pipeWatch{}}
	bp.close()
	other, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(other)
	if other != epfd {
		t.Skipf("the closed instance's number %d was not reused (got %d)", epfd, other)
	}
	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK))
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	c := &Child{bellFd: p[0], rings: make(chan struct{}, 1), bellClosed: make(chan struct{})}
	require.False(t, bp.watch(c), "a closed instance takes no bell")
	fds := []int{p[0]}
	require.Nil(t, bp.watchPipes(fds, []*sink{{}}, make(chan struct{})), "a closed instance takes no pipe")
	_, err = unix.Write(p[1], []byte{1})
	require.NoError(t, err)
	var ev [4]unix.EpollEvent
	n, err := unix.EpollWait(other, ev[:], 0)
	require.NoError(t, err)
	require.Zero(t, n, "the bell went into another epoll instance")
}
