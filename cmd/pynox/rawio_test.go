package main

import (
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestPoolWritesStdoutThroughThePoller checks that `pynox pool` writes a
// pipe on standard output through a non-blocking description of its own
// (written with raw writes that wake no runtime thread, rawio.go), and
// leaves the description it inherited, which its parent may share, in
// blocking mode; results still arrive whole and in order.
func TestPoolWritesStdoutThroughThePoller(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := startPool(t)
	pid := p.cmd.Process.Pid
	const nonblock = 0o4000
	stdout, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/1")
	require.NoError(t, err)
	require.Regexp(t, `^pipe:`, stdout)
	require.Zero(t, fdFlags(t, pid, 1)&nonblock, "the inherited description must stay blocking")

	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	require.NoError(t, err)
	own := -1
	for _, e := range ents {
		fd, _ := strconv.Atoi(e.Name())
		if target, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + e.Name()); err == nil && fd != 1 && target == stdout {
			own = fd
		}
	}
	require.NotEqual(t, -1, own, "no second descriptor of the stdout pipe in the pool")
	require.NotZero(t, fdFlags(t, pid, own)&nonblock, "the pool's own description of stdout must be non-blocking")

	// A result larger than a pipe's buffer (64 KiB) waits for room in the
	// poller and arrives whole, in order with the next one.
	p.send(t, `{"id": 1, "code": "print('x' * 300000)"}`)
	p.send(t, `{"id": 2, "session": "s", "code": "print(6 * 7)"}`)
	got := map[float64]map[string]any{}
	for range 2 {
		r := p.next(t)
		got[r["id"].(float64)] = r
	}
	require.Len(t, got[1]["stdout"], 300001, "%v", got[1]["error"])
	require.Equal(t, "42\n", got[2]["stdout"], "%v", got[2])
}
