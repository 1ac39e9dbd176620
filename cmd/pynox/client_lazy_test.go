package main

// A jsonl.Client of StartCmd reads the pool's output on its waiting calls'
// own goroutines (issue 12): these tests drive it against a real
// `pynox pool` and its real Python jobs, with calls that read for
// themselves (a ctx that cannot end), calls that cannot (a ctx that can),
// host functions that make calls of their own, and a pool that dies.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
	"github.com/pynox/pynox/jsonl"
)

// goroutineID returns the calling goroutine's id, from its stack header.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := bytes.Fields(buf)
	if len(f) < 2 {
		return ""
	}
	return string(f[1])
}

// A call whose ctx cannot end reads its own answer: its streamed output
// reaches OnOutput on the caller's goroutine, not on a reader's.
func TestStartCmdClientReadsOnCaller(t *testing.T) {
	t.Parallel()
	c, stderr := startClientIn(t, t.TempDir(), "--python=/usr/bin/python3", "--workers=1")
	me := goroutineID()
	var seen []string
	var out bytes.Buffer
	r, err := c.Run(context.Background(), pynox.Job{Code: "print('a', flush=True)\nprint('b')",
		OnOutput: func(_ pynox.Stream, text string) {
			seen = append(seen, goroutineID())
			out.WriteString(text)
		}})
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.Equal(t, 0, r.Exit, "%+v", r)
	require.Equal(t, "a\nb\n", out.String())
	require.NotEmpty(t, seen)
	for _, g := range seen {
		require.Equal(t, me, g, "OnOutput ran on goroutine %s, not on the caller's %s", g, me)
	}
}

// Calls that read for themselves and calls whose ctx can end, at once:
// each gets its own answer; a call whose ctx ends returns while the others
// go on; Close reads the rest.
func TestStartCmdClientMixedWaiters(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	c, stderr := startClientIn(t, t.TempDir(), "--python=/usr/bin/python3", "--workers=2")
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			if g%2 == 1 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
				defer cancel()
			}
			sess := c.Session("mixed-"+strconv.Itoa(g), pynox.Job{})
			for i := range 8 {
				want := fmt.Sprintf("%d-%d", g, i)
				r, err := sess.Run(ctx, pynox.Step{Code: fmt.Sprintf("print(%q)", want)})
				switch {
				case err != nil:
					errs <- fmt.Errorf("session %d step %d: %v", g, i, err)
					return
				case r.Stdout != want+"\n" || r.Step != i+1:
					errs <- fmt.Errorf("session %d step %d answered %q as step %d", g, i, r.Stdout, r.Step)
					return
				}
			}
		}()
	}
	// A job whose caller gives up: its Run returns with ctx's error while
	// the sessions above go on.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := c.Run(ctx, pynox.Job{Code: "import time\ntime.sleep(30)"})
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	r, err := c.Run(context.Background(), pynox.Job{Code: "print(6 * 7)"})
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.Equal(t, "42\n", r.Stdout)
	require.NoError(t, c.Close())
}

// A host function that makes calls of its own through the same client
// (one with a ctx that cannot end, one with a ctx that can) while the
// job's own Run reads: every call is answered.
func TestStartCmdClientHostCallsNest(t *testing.T) {
	t.Parallel()
	c, stderr := startClientIn(t, t.TempDir(), "--python=/usr/bin/python3", "--workers=2")
	host := func(ctx context.Context, call *pynox.Call) (any, error) {
		var args []int
		if err := json.Unmarshal(call.Args, &args); err != nil || len(args) != 1 {
			return nil, fmt.Errorf("args %s", call.Args)
		}
		inner := context.Background()
		if args[0]%2 == 1 {
			var cancel context.CancelFunc
			inner, cancel = context.WithTimeout(ctx, time.Minute)
			defer cancel()
		}
		r, err := c.Run(inner, pynox.Job{Code: fmt.Sprintf("print(%d + 1)", args[0])})
		if err != nil {
			return nil, err
		}
		return strconv.Atoi(r.Stdout[:len(r.Stdout)-1])
	}
	r, err := c.Run(context.Background(), pynox.Job{Code: "from pynox_host import f\nx = 0\nfor i in range(6):\n    x = f(x)\nprint(x)",
		Functions: []string{"f"}, Host: host})
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.Equal(t, 0, r.Exit, "%+v", r)
	require.Equal(t, "6\n", r.Stdout)
}

// A pool that dies under a waiting call fails that call and every later
// one with ErrClientClosed.
func TestStartCmdClientPoolDies(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	cmd := exec.Command(pynoxBinary(t), "pool", "--python=/usr/bin/python3", "--workers=1")
	cmd.Dir = t.TempDir()
	c, _ := startClientCmd(t, cmd)
	sess := c.Session("dies", pynox.Job{})
	r, err := sess.Run(context.Background(), pynox.Step{Code: "import os\nprint(os.getppid() > 0)"})
	require.NoError(t, err)
	require.Equal(t, "True\n", r.Stdout)
	done := make(chan error, 1)
	go func() {
		_, err := sess.Run(context.Background(), pynox.Step{Code: "import time\ntime.sleep(60)"})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, cmd.Process.Kill())
	select {
	case err := <-done:
		require.ErrorIs(t, err, jsonl.ErrClientClosed)
	case <-time.After(time.Minute):
		t.Fatal("the waiting call did not fail when the pool died")
	}
	_, err = c.Run(context.Background(), pynox.Job{Code: "print(1)"})
	require.ErrorIs(t, err, jsonl.ErrClientClosed)
}
