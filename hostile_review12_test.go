package pynox

// Review 12 of the changes of the last hour: a session reads its process's
// usage through /proc files opened at delivery and resets its peak RSS only
// while its pidfd shows it alive; a session's next process starts only
// after the previous one is reaped; TakeSession and TakeNSSession share
// holdReady.

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// review12Hog fills 200 MiB and then ends its own process by end.
func review12Hog(end string) string {
	return `import os, signal, threading
b = bytearray(200 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
open(os.path.join(os.environ["TMPDIR"], "mine"), "w").write("x")
` + end
}

// review12Fresh requires a step right after one that ended its process to
// see an empty scratch (no files; the outputs directory is there from the
// start) and usage figures of a fresh process of its own.
func review12Fresh(t *testing.T, co *Checkout) {
	t.Helper()
	r := feedOK(t, co, `import os
print(sorted(os.path.relpath(os.path.join(r, f), os.environ["TMPDIR"]) for r, _, fs in os.walk(os.environ["TMPDIR"]) for f in fs))`)
	require.True(t, r.Restarted, "the step after an exit did not run in a new process")
	require.Equal(t, "[]\n", r.Stdout, "the next process's scratch is not empty")
	require.NotNil(t, r.Usage)
	require.Less(t, r.Usage.MaxRSSBytes, int64(120<<20), "the next step's peak RSS is the dead process's")
	require.Less(t, r.Usage.MinorFaults, int64(20000), "the next step's faults are the dead process's")
}

// Probe: a session step that ends its own process at an odd moment (after
// filling 200 MiB: os._exit, SIGKILL of itself, os._exit while threads
// write into its scratch, os.abort from a thread) leaves the next step a
// fresh process with an empty scratch and usage figures of its own; the
// session and the pool keep serving.
func TestHostileReview12SessionSelfKill(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, Limits: Limits{Memory: 400 << 20}})
	co := checkout(t, p, Job{})
	ends := []string{
		"os._exit(3)",
		"os.kill(os.getpid(), signal.SIGKILL)",
		`def w(k):
    n = 0
    while True:
        n += 1
        try:
            open(os.path.join(os.environ["TMPDIR"], "late-%d-%d" % (k, n)), "w").write("x")
        except OSError:
            pass
for k in range(4):
    threading.Thread(target=w, args=(k,), daemon=True).start()
import time
time.sleep(0.05)
os._exit(0)`,
		"threading.Thread(target=os.abort).start()\nimport time\ntime.sleep(5)",
	}
	for _, end := range ends {
		r := feed(t, co, review12Hog(end))
		require.True(t, r.SessionEnded, "the step that ended its process did not end the session's process: %s", end)
		review12Fresh(t, co)
	}
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
}

// Probe: two sessions side by side in one worker: while one fills 200 MiB
// and ends its process, the other's steps report figures of their own
// (small peak RSS and faults) and neither sees the other's scratch files.
func TestHostileReview12SessionsSideBySide(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, Limits: Limits{Memory: 400 << 20}})
	a := checkout(t, p, Job{})
	b := checkout(t, p, Job{})
	feedOK(t, b, `import os
open(os.path.join(os.environ["TMPDIR"], "b-file"), "w").write("b")`)
	for range 2 {
		ra := feed(t, a, review12Hog("print(sorted(f for _, _, fs in os.walk(os.environ['TMPDIR']) for f in fs))"))
		requireOK(t, ra)
		require.Equal(t, "['mine']\n", ra.Stdout, "session A sees B's files")
		require.Greater(t, ra.Usage.MaxRSSBytes, int64(150<<20), "A's own peak is missing")
		rb := feedOK(t, b, `import os
print(sorted(os.path.relpath(os.path.join(r, f), os.environ["TMPDIR"]) for r, _, fs in os.walk(os.environ["TMPDIR"]) for f in fs))`)
		require.Equal(t, "['b-file']\n", rb.Stdout, "session B sees A's files")
		require.Less(t, rb.Usage.MaxRSSBytes, int64(120<<20), "B's peak RSS is A's")
		require.Less(t, rb.Usage.MinorFaults, int64(20000), "B's faults are A's")
		ra = feedOK(t, a, "import os\nos.remove(os.path.join(os.environ['TMPDIR'], 'mine'))\nprint(1)")
		require.Less(t, ra.Usage.MaxRSSBytes, int64(400<<20))
		// A's step after a hog that is still held: its peak was reset.
		ra = feedOK(t, a, "del b\nprint(2)")
		require.Less(t, ra.Usage.MaxRSSBytes, int64(260<<20))
		re := feed(t, a, review12Hog("os._exit(1)"))
		require.True(t, re.SessionEnded)
		review12Fresh(t, a)
		rb = feedOK(t, b, "print(open(os.path.join(os.environ['TMPDIR'], 'b-file')).read())")
		require.Equal(t, "b\n", rb.Stdout)
		require.Less(t, rb.Usage.MaxRSSBytes, int64(120<<20), "B's peak RSS is A's dead process's")
	}
}

// Probe: TakeSession and TakeNSSession share holdReady: a plain session and
// a session with a mount (its own mount namespace) in one worker, each
// ending its process in turn after filling 200 MiB, get back a process of
// their own kind (the mount session sees its mount again, the plain one
// never does), with figures and scratch of their own; one-shot jobs of
// both kinds keep running alongside.
func TestHostileReview12PlainAndNSSessions(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data-r12"}}
	plain := checkout(t, p, Job{})
	withNS := checkout(t, p, Job{Mounts: mounts})
	see := `import os
print(os.path.exists("/data-r12/f.txt"))`
	for range 2 {
		for _, c := range []struct {
			co   *Checkout
			want string
		}{{plain, "False\n"}, {withNS, "True\n"}} {
			r := feed(t, c.co, review12Hog("os._exit(5)"))
			require.True(t, r.SessionEnded)
			review12Fresh(t, c.co)
			require.Equal(t, c.want, feedOK(t, c.co, see).Stdout, "a restarted session got the other kind of process")
		}
		requireOK(t, run(t, p, Job{Code: "print(1)"}))
		requireOK(t, run(t, p, Job{Mounts: mounts, Code: `print(open("/data-r12/f.txt").read())`}))
	}
}

// Probe: while one session's steps fill 200 MiB and end their process
// (each next step waits for the previous process's reaping), another
// session's steps run at the same time and each reports figures of its own.
func TestHostileReview12ConcurrentRestarts(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, Limits: Limits{Memory: 400 << 20}})
	a := checkout(t, p, Job{})
	b := checkout(t, p, Job{})
	done := make(chan error, 1)
	go func() {
		for range 3 {
			ev, err := a.Feed(t.Context(), Step{Code: review12Hog("os._exit(7)")})
			if err != nil {
				done <- err
				return
			}
			if !ev.Result.SessionEnded {
				done <- fmt.Errorf("the hog step did not end its process: %+v", ev.Result)
				return
			}
		}
		done <- nil
	}()
	for i := 0; ; i++ {
		r := feedOK(t, b, "x = 1")
		require.NotNil(t, r.Usage)
		require.Less(t, r.Usage.MaxRSSBytes, int64(120<<20), "B's peak RSS is A's (step %d)", i)
		require.Less(t, r.Usage.MinorFaults, int64(20000), "B's faults are A's (step %d)", i)
		select {
		case err := <-done:
			require.NoError(t, err)
			review12Fresh(t, a)
			return
		default:
		}
	}
}
