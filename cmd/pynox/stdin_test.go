package main

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fdFlags returns the open flags of pid's descriptor fd, from fdinfo.
func fdFlags(t *testing.T, pid, fd int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/fdinfo/" + strconv.Itoa(fd))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "flags:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no flags in fdinfo %d of %d", fd, pid)
	return 0
}

// TestPoolReadsStdinThroughThePoller checks that `pynox pool` reads a pipe
// on standard input through a non-blocking description of its own (so that
// no thread sits in read(2) between requests), and leaves the description
// it inherited, which its parent may share, in blocking mode.
func TestPoolReadsStdinThroughThePoller(t *testing.T) {
	t.Parallel()
	p := startPool(t)
	pid := p.cmd.Process.Pid
	const nonblock = 0o4000
	stdin, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/0")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(stdin, "pipe:"), stdin)
	require.Zero(t, fdFlags(t, pid, 0)&nonblock, "the inherited description must stay blocking")

	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	require.NoError(t, err)
	own := -1
	for _, e := range ents {
		fd, _ := strconv.Atoi(e.Name())
		if target, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + e.Name()); err == nil && fd != 0 && target == stdin {
			own = fd
		}
	}
	require.NotEqual(t, -1, own, "no second descriptor of the stdin pipe in the pool")
	require.NotZero(t, fdFlags(t, pid, own)&nonblock, "the pool's own description of stdin must be non-blocking")

	p.send(t, `{"id": 1, "code": "print(6 * 7)"}`)
	res := p.next(t)
	require.Equal(t, "42\n", res["stdout"], "%v", res)
}
