package pynox

// Review 11 of the changes of the last hour: a one-shot job's child is
// only killed when its job ends (HoldClose) and closed after the answer;
// the spare's /proc files are opened at its delivery.

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// Probe: a job that ends holding most of its memory limit is killed but
// closed only after its answer; the next job in the same worker, started
// at once, gets its whole limit (the dying process is charged to its own
// cgroup, never to the next job's) and its usage figures are its own (a
// small peak RSS, not the previous job's). Repeated, and the pool serves.
func TestHostileReview11HoldCloseNextJob(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, Limits: Limits{Memory: 320 << 20}})
	hog := Job{Code: `b = bytearray(240 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
print(len(b))`}
	for range 3 {
		requireOK(t, run(t, p, hog))
		requireOK(t, run(t, p, hog)) // the limit is whole again
		small := run(t, p, Job{Code: "print(1)"})
		requireOK(t, small)
		require.NotNil(t, small.Usage)
		require.Less(t, small.Usage.MaxRSSBytes, int64(120<<20), "the next job's peak RSS is the hog's")
		require.Less(t, small.Usage.MinorFaults, int64(20000), "the next job's faults are the hog's")
	}
}

// Probe: the spare whose /proc files are opened at its delivery is the
// pool's only way to a job's usage figures; a job cannot reach the next
// spare (or any process but its own) to kill it before its delivery and
// so make a pid the pool resolves another process's: signal 0 to every
// pid from 1 to its own + 200 succeeds for itself alone.
func TestHostileReview11SpareUnsignalable(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	res := run(t, p, Job{Code: `import os
me = os.getpid()
hit = []
for q in range(1, me + 200):
    if q == me:
        continue
    try:
        os.kill(q, 0)
        hit.append(q)
    except OSError:
        pass
print(me, hit)`})
	requireOK(t, res)
	t.Log(res.Stdout)
	require.True(t, strings.HasSuffix(res.Stdout, " []\n"), "the job can signal other processes: %s", res.Stdout)
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
}

// Probe: a job whose threads keep writing files into its scratch directory
// after its main code returns (HoldClose: the child is only killed at the
// job's end, its scratch emptied once its exit is reported) leaves none of
// them to the next job of its worker, which may be given that directory.
func TestHostileReview11HoldCloseLateScratch(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	writer := Job{Code: `import os, threading
d = os.environ["TMPDIR"]
def w(k):
    n = 0
    while True:
        n += 1
        try:
            with open(os.path.join(d, "late-%d-%d" % (k, n)), "w") as f:
                f.write("x")
        except OSError:
            pass
for k in range(4):
    threading.Thread(target=w, args=(k,), daemon=True).start()
while not any(n.startswith("late-") for n in os.listdir(d)):
    pass
print(d)`}
	look := Job{Code: `import os
d = os.environ["TMPDIR"]
print(d, [n for n in os.listdir(d) if n.startswith("late-")])`}
	dirs := map[string]bool{}
	for range 5 {
		res := run(t, p, writer)
		requireOK(t, res)
		dirs[strings.TrimSpace(res.Stdout)] = true
		res = run(t, p, look)
		requireOK(t, res)
		f := strings.Fields(res.Stdout)
		require.Len(t, f, 2, res.Stdout)
		require.Equal(t, "[]", f[1], "the next job sees the previous job's late files in %s", f[0])
		dirs[f[0]] = true
	}
	t.Log(len(dirs), "scratch directories seen")
}
