package mountns

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// recvmsgSyscall is recvmsg's number on the machine's architecture; zero
// where the test does not know it.
func recvmsgSyscall() int64 {
	switch runtime.GOARCH {
	case "amd64":
		return 47
	case "arm64":
		return 212
	}
	return 0
}

// A goroutine waiting for the mounter's reply parks (the runtime's poller
// wakes it when the reply comes): no thread of the pool sleeps in a
// blocking recvmsg for as long as the builder takes. Such a thread kept
// the runtime's monitor awake, polling every few tens of microseconds
// and handing the waiting goroutine's P to another thread, about fifteen
// wake-ups per job with a mount (issue 13). The threads' system calls are
// read from /proc/self/task/<tid>/syscall while namespaces are built; no
// time is measured.
func TestRoundTripParksWhileBuilderWorks(t *testing.T) {
	recvmsg := recvmsgSyscall()
	if recvmsg == 0 {
		t.Skipf("recvmsg's number on %s is not listed here", runtime.GOARCH)
	}
	m := preparedMounter(t, 2, 0, false)
	settle(t, m, 1+2)
	a := dataDir(t, "A")
	src := openPath(t, a)
	var done atomic.Bool
	errc := make(chan error, 1)
	go func() {
		defer done.Store(true)
		for range 40 {
			ns, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
			if err != nil {
				errc <- err
				return
			}
			ns.Close()
		}
		errc <- nil
	}()
	var samples, inRecvmsg int
	for !done.Load() {
		tasks, err := os.ReadDir("/proc/self/task")
		require.NoError(t, err)
		for _, task := range tasks {
			sc, err := os.ReadFile("/proc/self/task/" + task.Name() + "/syscall")
			if err != nil {
				continue // an exiting thread
			}
			f := bytes.Fields(sc)
			if len(f) == 0 {
				continue
			}
			if n, err := strconv.ParseInt(string(f[0]), 10, 64); err == nil && n == recvmsg {
				inRecvmsg++
			}
		}
		samples++
		time.Sleep(100 * time.Microsecond)
	}
	require.NoError(t, <-errc)
	require.Positive(t, samples)
	require.Zero(t, inRecvmsg, "a thread slept in recvmsg %d times in %d samples of the threads while the mounter built "+
		"namespaces: a goroutine waiting for its reply held its thread in a blocking system call", inRecvmsg, samples)
}
