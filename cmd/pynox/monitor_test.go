package main

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// readSlack reads a thread's timer slack in ns.
func readSlack(t *testing.T, tid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/timerslack_ns")
	if os.IsPermission(err) {
		t.Skip("reading another thread's timer slack needs CAP_SYS_NICE")
	}
	require.NoError(t, err)
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	require.NoError(t, err)
	return n
}

// TestMonitorTID: the thread found is one of this process's, neither the
// main thread nor the caller, and it behaves as the runtime's monitor
// does: while a goroutine keeps a P busy, it wakes up again and again
// (its voluntary context switches climb), sleeping in nanosleep or futex.
func TestMonitorTID(t *testing.T) {
	tid := monitorTID()
	require.Positive(t, tid)
	require.NotEqual(t, os.Getpid(), tid)
	require.NotEqual(t, unix.Gettid(), tid)
	_, err := os.Stat("/proc/self/task/" + strconv.Itoa(tid))
	require.NoError(t, err)
	switches := func() int {
		b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/status")
		require.NoError(t, err)
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "voluntary_ctxt_switches:"); ok {
				n, _ := strconv.Atoi(strings.TrimSpace(v))
				return n
			}
		}
		return -1
	}
	before := switches()
	// Busy, with system calls: the first wakes the monitor if it sleeps
	// deeply (no P was running). Backed off as far as it goes, it still
	// passes every 10 ms.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		os.Stat("/")
	}
	require.Greater(t, switches(), before+5, "the monitor polls while a P runs")
}

// TestSlowMonitor: the monitor gets the slack, and the calling thread
// (any thread that might fork a template) keeps its own.
func TestSlowMonitor(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := monitorTID()
	require.Positive(t, tid)
	prev := readSlack(t, tid)
	defer os.WriteFile("/proc/"+strconv.Itoa(tid)+"/timerslack_ns", []byte(strconv.FormatInt(prev, 10)), 0)
	own, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.NoError(t, err)
	if !slowMonitor(monitorSlack) {
		t.Skip("setting another thread's timer slack is not allowed here")
	}
	require.Equal(t, monitorSlack.Nanoseconds(), readSlack(t, tid))
	again, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.NoError(t, err)
	require.Equal(t, own, again, "the caller's own slack is left alone")
}
