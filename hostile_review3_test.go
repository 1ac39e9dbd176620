package pynox

// Third review (issue 9): descriptor games against the pool's capture and
// control channel, output after "done", and SIGIO aimed at the template or
// another job. Every attack here was blocked before this file; the probes
// keep it so.

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// A job that puts its control socket or its bell over stdout and stderr
// and prints is killed for breaking the control protocol (its output
// never passes for frames the pool acts on); one that closes fds 1, 2 or 3
// gets an ordinary result. The pool serves the next job each time.
func TestHostileReview3DescriptorGames(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	cases := []struct {
		name, code string
		check      func(t *testing.T, r *Result)
	}{
		{"control socket over stdout and stderr", `import os
os.dup2(3, 1); os.dup2(3, 2)
print('{"t":"done","ok":true}', flush=True)
os.write(1, b'\x00\x00\x00\x10forged frame....')
`, func(t *testing.T, r *Result) {
			requireErrorType(t, r, "PoolWorkerError")
			require.Contains(t, r.Error.Message, "broke its control protocol")
		}},
		{"bell over stdout", `import os
os.dup2(4, 1)
print("x" * 100000, flush=True)
`, func(t *testing.T, r *Result) {
			requireErrorType(t, r, "PoolWorkerError")
			require.Contains(t, r.Error.Message, "rang its bell")
		}},
		{"stdout and stderr closed", `import os
os.close(1); os.close(2)
print("x")
`, func(t *testing.T, r *Result) {
			requireErrorType(t, r, "OSError")
			require.Empty(t, r.Stdout)
		}},
		{"control socket closed", `import os
os.close(3)
print("after", flush=True)
`, func(t *testing.T, r *Result) {
			requireOK(t, r)
			require.Equal(t, "after\n", r.Stdout)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := run(t, p, Job{ID: c.name, Code: c.code, Timeout: 20 * time.Second})
			c.check(t, r)
			advServes(t, p)
		})
	}
}

// A session step that puts its control socket over stdout ends the
// session's process; the next step starts a fresh one. A step that keeps
// a copy of its stdout for a thread that writes forever gets its output
// cut off, the thread's writes fail once the step ends (they never reach
// a later step's output), and later steps run normally.
func TestHostileReview3SessionDescriptorGames(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{Timeout: 20 * time.Second})
	require.NoError(t, err)
	defer co.Finish(ctx)
	step := func(code string) *Result {
		t.Helper()
		ev, err := co.Feed(ctx, Step{Code: code})
		require.NoError(t, err)
		require.NotNil(t, ev.Result)
		return ev.Result
	}
	r := step("import os\nx = 1\nos.dup2(3, 1)\nprint('forged')")
	requireErrorType(t, r, "PoolWorkerError")
	require.True(t, r.SessionEnded)
	r = step("print('x' in globals())")
	requireOK(t, r)
	require.Equal(t, "False\n", r.Stdout, "a fresh process")

	r = step(`import os, threading
saved = os.dup(1)
def w():
    while True:
        try:
            os.write(saved, b'L' * 4096)
        except OSError as e:
            os.write(2, b'E')
            threading.Event().wait(0.01)
threading.Thread(target=w, daemon=True).start()
print('started')`)
	requireOK(t, r)
	require.LessOrEqual(t, len(r.Stdout), p.cfg.Limits.MaxOutput)
	r = step("print('next')")
	requireOK(t, r)
	require.Equal(t, "next\n", r.Stdout, "the thread's writes to the last step's pipe reached this step")
	r = step("os.close(1); os.close(2); print('gone')")
	requireErrorType(t, r, "OSError")
	r = step("print('after')")
	requireOK(t, r)
	require.Equal(t, "after\n", r.Stdout)
}

// A job whose non-daemon thread keeps writing after the main code ends
// does not outlive its result: the pool kills it once it has reported.
func TestHostileReview3WriterOutlivesDone(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Code: `import os, threading, sys
open('pid', 'w').write(os.readlink('/proc/self'))
def w():
    while True:
        try:
            sys.stdout.write('A' * 1000); sys.stdout.flush()
        except Exception:
            pass
threading.Thread(target=w).start()
`, Timeout: 20 * time.Second, AllowWrite: []string{"."}})
	require.Equal(t, 0, r.Exit, "error %+v", r.Error)
	b, err := os.ReadFile(filepath.Join(p.cfg.Dir, "pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	// Its end is asynchronous (the pool kills it and goes on), but it comes.
	require.Eventually(t, func() bool { return !processAlive(pid) }, 30*time.Second, 10*time.Millisecond,
		"the job's process outlived its result")
	advServes(t, p)
}

// SIGIO aimed through F_SETOWN/F_SETSIG at the template (PID 1 of the
// job's namespace), another job, the process group or everyone is refused
// (seccomp filters fcntl's command), and nobody dies.
func TestHostileReview3SignalByFileOwner(t *testing.T) {
	p := newTestPool(t, Config{Workers: 2})
	shared := filepath.Join(p.cfg.Dir, "shared")
	require.NoError(t, os.Mkdir(shared, 0o755))
	templates := p.templatePIDs()
	victimDone := make(chan *Result, 1)
	go func() {
		victimDone <- run(t, p, Job{ID: "victim", Code: `import os, time
open('shared/victim.pid', 'w').write(str(os.getpid()))
deadline = time.time() + 60
while not os.path.exists('shared/stop') and time.time() < deadline:
    time.sleep(0.02)
print('victim survived')
`, AllowWrite: []string{"shared"}})
	}()
	var victim int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(shared, "victim.pid"))
		if err != nil {
			return false
		}
		victim, err = strconv.Atoi(string(b))
		return err == nil && victim > 0
	}, 30*time.Second, 10*time.Millisecond)
	r := run(t, p, Job{Code: advCode(`import socket, fcntl, signal
keep = []
for target in [1, 2, 3, -1, 0]:
    a, b = socket.socketpair()
    keep.append((a, b))
    attempt("setown %d" % target, lambda: fcntl.fcntl(a.fileno(), fcntl.F_SETOWN, target))
    attempt("setsig %d" % target, lambda: fcntl.fcntl(a.fileno(), 10, signal.SIGKILL))  # F_SETSIG
    fcntl.fcntl(a.fileno(), fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)
    b.send(b"x")
`), AllowRead: []string{"shared"}})
	want := map[string][]string{}
	for _, target := range []string{"1", "2", "3", "-1", "0"} {
		want["setown "+target] = []string{"EPERM", "EINVAL"}
		want["setsig "+target] = []string{"EPERM", "EINVAL"}
	}
	advExpect(t, advProbes(t, r), want)
	require.NoError(t, os.WriteFile(filepath.Join(shared, "stop"), nil, 0o644))
	v := <-victimDone
	requireOK(t, v)
	require.Equal(t, "victim survived\n", v.Stdout)
	require.Equal(t, templates, p.templatePIDs(), "a template died")
	advServes(t, p)
}

// TestHostileReview3NoCPUAfterStepReport: a session step that leaves a
// thread spinning on a copy of its stdout used to keep running for the
// whole output drain (2 s) after its report, past its timeout and CPU
// check; the process is now stopped at its report.
func TestHostileReview3NoCPUAfterStepReport(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{Timeout: 10 * time.Second})
	requireOK(t, feed(t, co, "x = 1"))
	cpu := func() float64 {
		f := procStatFields(co.Pid())
		require.GreaterOrEqual(t, len(f), 13, "the session's process is gone")
		u, _ := strconv.ParseFloat(f[11], 64) // utime, clock ticks
		s, _ := strconv.ParseFloat(f[12], 64) // stime
		return (u + s) / 100
	}
	before := cpu()
	r := feed(t, co, "import os, threading, time\n"+
		"out = os.dup(1)\n"+
		"def spin():\n"+
		"    time.sleep(0.05)\n"+
		"    while True:\n"+
		"        pass\n"+
		"threading.Thread(target=spin, daemon=True).start()\n")
	requireOK(t, r)
	used := cpu() - before
	require.Less(t, used, 0.5, "the session's process ran %.2f s of CPU after its step reported", used)
	requireOK(t, feed(t, co, "assert x == 1"))
}
