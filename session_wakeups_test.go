package pynox

// Where a session's process waits for the pool (issue 12): in poll, asked
// for input only, never in a read of its control socket (the runner waits
// so for its next step too, but a step's process is stopped wherever the
// pool's SIGSTOP finds it, so only a host call's wait is checked here). A reader blocked
// on a Unix socket is woken whenever the other end reads from it (the
// kernel tells the socket's waiters it has room again), so a process
// that waited for its next step or for a host call's answer in a read was
// woken once more per step and per call, each time the pool read its
// report or its call, for nothing. The kernel says which system call a
// sleeping process is in (/proc/<pid>/syscall); no time is measured.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pollSyscalls are the numbers of poll and ppoll on the machine's
// architecture; nil where the test does not know them.
func pollSyscalls() map[int64]string {
	switch runtime.GOARCH {
	case "amd64":
		return map[int64]string{7: "poll", 271: "ppoll"}
	case "arm64":
		return map[int64]string{73: "ppoll"}
	}
	return nil
}

// waitingSyscall waits until the process pid sleeps in state (S, or T
// for stopped) and returns the system call it is in. It skips the test
// when /proc/<pid>/syscall cannot be read (it needs ptrace access).
func waitingSyscall(t *testing.T, pid int, state byte) int64 {
	t.Helper()
	p := "/proc/" + strconv.Itoa(pid)
	for range 5000 {
		stat, err := os.ReadFile(p + "/stat")
		require.NoError(t, err)
		i := bytes.LastIndexByte(stat, ')')
		require.Positive(t, i, "malformed %s/stat: %s", p, stat)
		if i+2 < len(stat) && stat[i+2] == state {
			sc, err := os.ReadFile(p + "/syscall")
			if errors.Is(err, fs.ErrPermission) {
				t.Skipf("%s/syscall cannot be read: %v", p, err)
			}
			require.NoError(t, err)
			f := bytes.Fields(sc)
			require.NotEmpty(t, f, "%s/syscall is empty", p)
			if n, err := strconv.ParseInt(string(f[0]), 10, 64); err == nil {
				// Still in state? Then that is where it sleeps.
				if again, _ := os.ReadFile(p + "/stat"); bytes.Equal(again[:i+3], stat[:i+3]) {
					return n
				}
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("process %d was never seen in state %c", pid, state)
	return -1
}

// During a host call, asleep until the answer comes: in poll.
func TestSessionWaitsInPollDuringHostCall(t *testing.T) {
	t.Parallel()
	polls := pollSyscalls()
	if polls == nil {
		t.Skipf("the poll system calls of %s are not listed here", runtime.GOARCH)
	}
	p := newTestPool(t, Config{Workers: 1})
	var co *Checkout
	seen := make(chan int64, 8)
	host := func(ctx context.Context, c *Call) (any, error) {
		seen <- waitingSyscall(t, co.Pid(), 'S')
		return json.RawMessage(c.Args[1 : len(c.Args)-1]), nil
	}
	co = checkout(t, p, Job{Functions: []string{"f"}, Host: host})
	ev, err := co.Feed(context.Background(), Step{Code: "from pynox_host import f\nprint(f(1) + f(2) + f(3))"})
	require.NoError(t, err)
	require.Equal(t, "6\n", ev.Result.Stdout, "%+v", ev.Result)
	close(seen)
	calls := 0
	for n := range seen {
		calls++
		require.Contains(t, polls, n, "waiting for a host call's answer the session's process is in system call %d, not in poll", n)
	}
	require.Equal(t, 3, calls)
}
