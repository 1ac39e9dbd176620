package jsonl

// Load tests through Serve (issue 4): many mixed jobs with exact
// accounting, and templates killed under load. They are long tests: they
// run with PYNOX_LONG=1 (as in .ci/run).

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

func TestLoadMixedJobs(t *testing.T) {
	requireLong(t, "1,000 jobs through Serve")
	p := newTestPool(t, pynox.Config{Workers: 2})
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
	require.Equal(t, st.Jobs, st.OK+st.Failed+st.Timeouts+st.Signals+st.RequestErrors+st.WorkerErrors+st.Cancelled)
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
	p := newTestPool(t, pynox.Config{Workers: 2})
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
			for _, pid := range templatePIDs(t, p) {
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
	pids := templatePIDs(t, p)
	require.Len(t, pids, 2)
	for _, pid := range pids {
		require.True(t, processAlive(pid))
	}
	require.Eventually(t, func() bool { return len(poolProcesses(t, p)) == 2*p.Workers() }, 5*time.Second, 20*time.Millisecond,
		"pool processes after the storm: %v", poolProcesses(t, p))
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

// loadKind is one kind of job in the mixed load, with how its result must
// look.
type loadKind struct {
	name string
	line func(id string) string // the request line
	// check asserts the result line; i is the job's number.
	check func(t *testing.T, id string, r map[string]any)
}
