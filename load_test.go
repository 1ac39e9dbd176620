package pynox

// Load and endurance tests (issue 4): many mixed jobs through Serve with
// exact accounting, templates killed under load, and the host's
// descriptors, processes and memory back at baseline after hundreds of
// jobs. They are long tests: they run with PYNOX_LONG=1 (as in .ci/run).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// loadKind is one kind of job in the mixed load, with how its result must
// look.
type loadKind struct {
	name string
	line func(id string) string // the request line
	// check asserts the result line; i is the job's number.
	check func(t *testing.T, id string, r map[string]any)
}

func loadKinds() []loadKind {
	req := func(id, code string, extra string) string {
		b, _ := json.Marshal(code)
		return fmt.Sprintf(`{"id": %q, "code": %s%s}`, id, b, extra)
	}
	return []loadKind{
		{"ok", func(id string) string { return req(id, fmt.Sprintf("print(%q)", id), "") },
			func(t *testing.T, id string, r map[string]any) {
				require.Nil(t, r["error"], id)
				require.Equal(t, json.Number("0"), r["exit"], id)
				require.Equal(t, id+"\n", r["stdout"], id)
			}},
		{"exception", func(id string) string { return req(id, fmt.Sprintf("raise ValueError(%q)", id), "") },
			func(t *testing.T, id string, r map[string]any) {
				require.Equal(t, "ValueError", errType(r), id)
				require.Equal(t, id, errMessage(r), id)
				require.Equal(t, json.Number("1"), r["exit"], id)
			}},
		{"timeout", func(id string) string { return req(id, "while True:\n    pass", `, "timeout": "200ms"`) },
			func(t *testing.T, id string, r map[string]any) {
				require.Equal(t, "TimeoutError", errType(r), id)
				require.Equal(t, json.Number("-1"), r["exit"], id)
			}},
		{"segfault", func(id string) string { return req(id, "import ctypes\nctypes.string_at(0)", "") },
			func(t *testing.T, id string, r map[string]any) {
				require.Equal(t, "SignalError", errType(r), id)
				require.Contains(t, errMessage(r), "SIGSEGV", id)
			}},
		{"exit 3", func(id string) string { return req(id, "import sys\nprint('bye')\nsys.exit(3)", "") },
			func(t *testing.T, id string, r map[string]any) {
				require.Nil(t, r["error"], id)
				require.Equal(t, json.Number("3"), r["exit"], id)
				require.Equal(t, "bye\n", r["stdout"], id)
			}},
		{"request error", func(id string) string { return req(id, "print(1)", `, "bogus": 1`) },
			func(t *testing.T, id string, r map[string]any) {
				require.Equal(t, "RequestError", errType(r), id)
				require.Nil(t, r["policy"], id)
			}},
	}
}

func TestLoadMixedJobs(t *testing.T) {
	requireLong(t, "1,000 jobs through Serve")
	p := newTestPool(t, Config{Workers: 2})
	kinds := loadKinds()
	byName := map[string]loadKind{}
	for _, k := range kinds {
		byName[k.name] = k
	}
	// Out of every 20 jobs: 1 timeout (5%), 1 request error, 2 segfaults,
	// 3 exceptions, 2 sys.exit(3), 11 successes; shuffled.
	mix := []string{"timeout", "request error", "segfault", "segfault", "exception", "exception", "exception", "exit 3", "exit 3"}
	for len(mix) < 20 {
		mix = append(mix, "ok")
	}
	const n = 1000
	rng := rand.New(rand.NewSource(4))
	kindOf := map[string]string{}
	count := map[string]int64{}
	var in strings.Builder
	for i := 0; i < n; i++ {
		name := mix[rng.Intn(len(mix))]
		if i < 20 {
			name = mix[i] // every kind at least once
		}
		id := fmt.Sprintf("load-%04d", i)
		kindOf[id] = name
		count[name]++
		in.WriteString(byName[name].line(id))
		in.WriteByte('\n')
	}
	start := time.Now()
	lines := serveLines(t, p, in.String())
	took := time.Since(start)

	require.Equal(t, "ready", lines[0]["event"])
	got := byID(t, lines) // fails on an id answered twice
	require.Len(t, got, n, "every request answered")
	for id, name := range kindOf {
		r := got[id]
		require.NotNil(t, r, "%s (%s) not answered", id, name)
		byName[name].check(t, id, r)
	}

	st := p.Stats()
	t.Logf("%d jobs over 2 workers through Serve in %s (%v); stats %+v", n, took, count, st)
	require.Equal(t, int64(n), st.Jobs)
	require.Equal(t, st.Jobs, st.OK+st.Failed+st.Timeouts+st.Signals+st.RequestErrors+st.WorkerErrors)
	require.Equal(t, count["ok"], st.OK)
	require.Equal(t, count["exception"]+count["exit 3"], st.Failed)
	require.Equal(t, count["timeout"], st.Timeouts)
	require.Equal(t, count["segfault"], st.Signals)
	require.Equal(t, count["request error"], st.RequestErrors)
	require.Zero(t, st.WorkerErrors)
	require.Equal(t, map[string]int64{
		"ValueError":   count["exception"],
		"TimeoutError": count["timeout"],
		"SignalError":  count["segfault"],
		"RequestError": count["request error"],
	}, st.Errors)
	var durMS, queueUS int64
	for _, r := range lines[1:] {
		d, _ := r["duration_ms"].(json.Number).Int64()
		q, _ := r["queue_us"].(json.Number).Int64()
		durMS += d
		queueUS += q
	}
	require.Equal(t, durMS, st.DurationMSTotal)
	require.Equal(t, queueUS, st.QueueUSTotal)
	require.Less(t, took, 90*time.Second)
}

func TestLoadTemplatesKilledDuringForkStorm(t *testing.T) {
	requireLong(t, "templates killed under load")
	p := newTestPool(t, Config{Workers: 2})
	const n = 100
	var in strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&in, `{"id": %d, "code": "import time\ntime.sleep(0.01)\nprint(%d * 7)"}`+"\n", i, i)
	}
	stop := make(chan struct{})
	var kills atomic.Int64
	var killer sync.WaitGroup
	killer.Add(1)
	go func() {
		defer killer.Done()
		rng := rand.New(rand.NewSource(7))
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(15+rng.Intn(60)) * time.Millisecond):
			}
			for _, pid := range p.templatePIDs() {
				if rng.Intn(2) == 0 && syscall.Kill(pid, syscall.SIGKILL) == nil {
					kills.Add(1)
				}
			}
		}
	}()
	start := time.Now()
	lines := serveLines(t, p, in.String())
	took := time.Since(start)
	close(stop)
	killer.Wait()

	got := byID(t, lines)
	require.Len(t, got, n, "every job answered exactly once")
	var ok, crashed int
	for i := 0; i < n; i++ {
		r := got[strconv.Itoa(i)]
		require.NotNil(t, r, "job %d not answered", i)
		if typ := errType(r); typ != "" {
			require.Equal(t, "PoolWorkerError", typ, "job %d: %s", i, errMessage(r))
			crashed++
			continue
		}
		require.Equal(t, json.Number("0"), r["exit"], "job %d", i)
		require.Equal(t, fmt.Sprintf("%d\n", i*7), r["stdout"], "job %d", i)
		ok++
	}
	t.Logf("%d jobs in %s with %d template kills: %d ok, %d PoolWorkerError", n, took, kills.Load(), ok, crashed)
	require.Positive(t, kills.Load())
	st := p.Stats()
	require.Equal(t, int64(crashed), st.WorkerErrors)
	require.Equal(t, int64(ok), st.OK)

	// The pool recovers: live templates, correct answers.
	for i := 0; i < 4; i++ {
		advServes(t, p)
	}
	pids := p.templatePIDs()
	require.Len(t, pids, 2)
	for _, pid := range pids {
		require.True(t, processAlive(pid))
	}
	require.Eventually(t, func() bool { return len(loadPoolProcesses(t, p)) == 2*p.Workers() }, 5*time.Second, 20*time.Millisecond,
		"pool processes after the storm: %v", loadPoolProcesses(t, p))
}

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
