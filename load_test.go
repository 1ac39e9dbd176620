package pynox

// Endurance tests (issue 4): the host's descriptors, processes and memory
// back at baseline after hundreds of jobs (the load tests through Serve
// are in package jsonl). They are long tests: they run with PYNOX_LONG=1
// (as in .ci/run).

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLoadNoLeaks(t *testing.T) {
	requireLong(t, "hundreds of jobs, then the host's resources at baseline")
	p := newTestPool(t, Config{Workers: 2})
	require.NoError(t, os.Mkdir(filepath.Join(p.cfg.Dir, "out"), 0o755))
	fds0 := advWarm(t, p)
	procs0 := loadDescendants(t)
	goroutines0 := runtime.NumGoroutine()
	rss0 := loadRSS(t)
	t.Logf("baseline: %d descriptors, %d descendant processes, %d goroutines, RSS %d KiB", fds0, len(procs0), goroutines0, rss0>>10)
	require.Len(t, loadPoolProcesses(t, p), 2*p.Workers(), "templates and their spares")

	jobs := []Job{
		{Code: "print('ok')"},
		{Code: "raise KeyError('k')"},
		{Code: "import sys; sys.stdout.write('x' * 200000)", MaxOutput: 1000},
		{Code: "import ctypes; ctypes.string_at(0)"},
		{Code: "x = bytearray(64 << 20)", Memory: 32 << 20},
		{Code: "open('out/f', 'w').write('data')", AllowWrite: []string{"out"}},
		{Code: "import threading\nfor _ in range(4):\n    threading.Thread(target=lambda: None).start()"},
		{Code: "import os; os.close(1); os.close(2)"},
		{Code: "import os; os._exit(9)"},
		{Code: "import time; time.sleep(1)", Timeout: 50 * time.Millisecond},
	}
	const n = 500
	start := time.Now()
	var wg sync.WaitGroup
	work := make(chan int)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				job := jobs[i%len(jobs)]
				job.ID = i
				res, err := p.Run(context.Background(), job)
				if err != nil || res == nil || res.ID != i {
					t.Errorf("job %d: %v %+v", i, err, res)
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	took := time.Since(start)
	st := p.Stats()
	require.Equal(t, int64(n+p.Workers()), st.Jobs)
	require.Zero(t, st.WorkerErrors)

	fds := advSteadyFDs(t)
	require.Equal(t, fds0, fds, "host descriptors after %d jobs", n)
	require.Eventually(t, func() bool { return len(loadPoolProcesses(t, p)) == 2*p.Workers() }, 5*time.Second, 20*time.Millisecond,
		"pool processes: %v", loadPoolProcesses(t, p))
	require.Eventually(t, func() bool { return len(loadDescendants(t)) == len(procs0) }, 5*time.Second, 20*time.Millisecond,
		"descendants: %v, baseline %v", loadDescendants(t), procs0)
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= goroutines0+2 }, 5*time.Second, 20*time.Millisecond,
		"goroutines: %d, baseline %d", runtime.NumGoroutine(), goroutines0)
	runtime.GC()
	debug.FreeOSMemory()
	rss := loadRSS(t)
	t.Logf("%d jobs in %s; after: %d descriptors, %d descendants, %d goroutines, RSS %d KiB (%+d KiB)",
		n, took, fds, len(loadDescendants(t)), runtime.NumGoroutine(), rss>>10, (rss-rss0)>>10)
	require.Less(t, rss, rss0+30<<20, "RSS grew from %d to %d KiB", rss0>>10, rss>>10)
}

// loadDescendants returns the pids of every descendant of the test
// process (zombies included), following ppid links through /proc.
func loadDescendants(t testing.TB) []int {
	t.Helper()
	children := map[int][]int{}
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	queue := []int{os.Getpid()}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// loadPoolProcesses returns every process on the host working in the
// pool's (unique) directory: its templates and their children, including
// any orphan that escaped the process tree.
func loadPoolProcesses(t testing.TB, p *Pool) []int {
	t.Helper()
	var out []int
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd"); err == nil && cwd == p.cfg.Dir {
			pid, _ := strconv.Atoi(e.Name())
			out = append(out, pid)
		}
	}
	return out
}

// loadRSS returns the test process's resident set size in bytes.
func loadRSS(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestLoadSessionsNoLeaks opens, uses and ends sessions in every way a
// session can end, and makes host calls, then checks that descriptors,
// processes and goroutines are back to where they started.
func TestLoadSessionsNoLeaks(t *testing.T) {
	requireLong(t, "rounds of sessions, then the host's resources at baseline")
	p := newTestPool(t, Config{Workers: 1, MaxSessions: 4, SessionIdle: 300 * time.Millisecond})
	// One session first: the pool keeps one inotify instance for every
	// session's outputs watch (outputs_watch.go), made with its first
	// session and kept for its life, which is no leak.
	warm, err := p.Checkout(context.Background(), Job{})
	require.NoError(t, err)
	_, err = warm.Feed(context.Background(), Step{Code: "x = 1"})
	require.NoError(t, err)
	require.NoError(t, warm.Finish(context.Background()))
	fds0 := advWarm(t, p)
	procs0 := loadDescendants(t)
	goroutines0 := runtime.NumGoroutine()
	ctx := context.Background()
	host := func(ctx context.Context, c *Call) (any, error) { return 1, nil }
	endings := []string{
		"",                                   // finished by the caller
		"import sys; sys.exit(2)",            // exit
		"import ctypes; ctypes.string_at(0)", // crash
		"while True: pass",                   // timeout
		"import os; os.close(3)",             // a broken channel
	}
	for round := 0; round < 6; round++ {
		var wg sync.WaitGroup
		for i, end := range endings {
			wg.Add(1)
			go func() {
				defer wg.Done()
				co, err := p.Checkout(ctx, Job{Functions: []string{"f"}, Host: host, Timeout: 300 * time.Millisecond})
				if err != nil {
					if errors.Is(err, ErrExhausted) {
						return // more endings than MaxSessions this round
					}
					t.Errorf("checkout: %v", err)
					return
				}
				for s := 0; s < 3; s++ {
					ev, err := co.Feed(ctx, Step{Code: "from pynox_host import f\nprint(f() + f())"})
					if err != nil || ev.Result == nil || ev.Result.Stdout != "2\n" {
						t.Errorf("step: %v %+v", err, ev.Result)
						return
					}
				}
				if end != "" {
					ev, err := co.Feed(ctx, Step{Code: end})
					if err != nil || ev.Result == nil || !ev.Result.SessionEnded {
						t.Errorf("ending %q: %v %+v", end, err, ev.Result)
					}
				}
				if i == 0 && round%2 == 1 {
					return // left to the idle timer every other round
				}
				co.Finish(ctx)
			}()
		}
		wg.Wait()
	}
	require.Eventually(t, func() bool { return p.Stats().SessionsActive == 0 }, 5*time.Second, 20*time.Millisecond)
	fds := advSteadyFDs(t)
	require.Equal(t, fds0, fds, "host descriptors after the sessions")
	require.Eventually(t, func() bool { return len(loadDescendants(t)) == len(procs0) }, 5*time.Second, 20*time.Millisecond,
		"descendants: %v, baseline %v", loadDescendants(t), procs0)
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= goroutines0+2 }, 5*time.Second, 20*time.Millisecond,
		"goroutines: %d, baseline %d", runtime.NumGoroutine(), goroutines0)
	advServes(t, p)
}
