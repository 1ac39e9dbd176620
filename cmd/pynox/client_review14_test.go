package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
	"github.com/pynox/pynox/jsonl"
)

// TestHostileReview14ClientCallsMixAndPoolDies drives a StartCmd client
// (whose waiting calls read the pool's output themselves) with jobs and
// session steps at once, each making host calls whose answers name the
// call, some with a ctx that can end and some not; then kills the pool
// while calls are in flight. Every call returns exactly once: with its own
// answer (its own output, its own host calls' results, never another
// call's) or with an error; none hangs; calls after the death fail with
// ErrClientClosed.
func TestHostileReview14ClientCallsMixAndPoolDies(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	cmd := exec.Command(pynoxBinary(t), "pool", "--python=/usr/bin/python3", "--workers=2")
	cmd.Dir = t.TempDir()
	c, stderr := startClientCmd(t, cmd)

	// The host function returns its argument tagged, after a short wait
	// that varies, so that answers of several calls interleave.
	host := func(ctx context.Context, call *pynox.Call) (any, error) {
		var args []string
		if err := json.Unmarshal(call.Args, &args); err != nil || len(args) != 1 {
			return nil, fmt.Errorf("args %s", call.Args)
		}
		time.Sleep(time.Duration(len(args[0])%3) * time.Millisecond)
		return "re:" + args[0], nil
	}
	code := func(tag string) string {
		return fmt.Sprintf("from pynox_host import f\nfor i in range(5):\n    print(f('%s-%%d' %% i))\n", tag)
	}
	want := func(tag string) string {
		s := ""
		for i := range 5 {
			s += fmt.Sprintf("re:%s-%d\n", tag, i)
		}
		return s
	}
	var answered atomic.Int64
	var killed atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 256)
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
			var sess *jsonl.Session
			if g%3 == 0 {
				sess = c.Session("r14-"+strconv.Itoa(g), pynox.Job{Functions: []string{"f"}, Host: host})
			}
			for i := 0; ; i++ {
				tag := fmt.Sprintf("g%d-i%d", g, i)
				var r *pynox.Result
				var err error
				if sess != nil {
					r, err = sess.Run(ctx, pynox.Step{Code: code(tag)})
				} else {
					r, err = c.Run(ctx, pynox.Job{Code: code(tag), Functions: []string{"f"}, Host: host})
				}
				answered.Add(1)
				if err != nil {
					if !killed.Load() {
						errs <- fmt.Errorf("%s failed before the pool was killed: %v", tag, err)
					}
					return
				}
				if r.Error != nil {
					if !killed.Load() {
						errs <- fmt.Errorf("%s: %+v", tag, r.Error)
					}
					continue
				}
				if r.Stdout != want(tag) {
					errs <- fmt.Errorf("%s answered with %q", tag, r.Stdout)
					return
				}
			}
		}()
	}
	// Let the calls run for a while, then kill the pool under them.
	require.Eventually(t, func() bool { return answered.Load() >= 30 }, time.Minute, 10*time.Millisecond,
		"stderr: %s", stderr.String())
	killed.Store(true)
	require.NoError(t, cmd.Process.Kill())
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("a call did not return after the pool died")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	_, err := c.Run(context.Background(), pynox.Job{Code: "print(1)"})
	require.True(t, errors.Is(err, jsonl.ErrClientClosed), "after the death: %v", err)
}
