package pynox

// Probes of the templates' ready ns spares: the process a template keeps
// pre-forked for the next job with a mount namespace (worker.TakeNS).

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/worker"
)

// nsWarm runs job (which needs a mount namespace) on every worker at
// once, so that each template keeps its ready ns spare from then on.
func nsWarm(t *testing.T, p *Pool, job Job) {
	t.Helper()
	job.Code = "import time; time.sleep(0.2)"
	var wg sync.WaitGroup
	for i := 0; i < p.Workers(); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			requireOK(t, run(t, p, job))
		}()
	}
	wg.Wait()
	for _, w := range p.workers {
		tpl := w.live.Load()
		require.True(t, eventually(func() bool { return tpl.HasNSSpare(false) }), "template %d keeps no ns spare", tpl.Pid())
	}
}

// templateKids lists the pids whose parent is pid (a template's spares,
// jobs and sessions), read from /proc.
func templateKids(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		q, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(q); ok && ppid == pid {
			out = append(out, q)
		}
	}
	return out
}

// procStatus returns the value of a /proc/<pid>/status field.
func procStatus(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return ""
}

// nsSparePid returns the pid of the template's ready ns spare: the one
// child of the template that is neither its ready spare nor one of
// except, once there is exactly one.
func nsSparePid(t *testing.T, tpl *worker.Template, except ...int) int {
	t.Helper()
	var pid int
	require.True(t, eventually(func() bool {
		if !tpl.HasNSSpare(false) || !tpl.HasSpare(false) {
			return false
		}
		// The regular spare has its job layer: two seccomp filters (the
		// template's and the job's); the ns spare has only the
		// template's until it enters a job's namespace.
		var found []int
		for _, q := range templateKids(tpl.Pid()) {
			skip := false
			for _, e := range except {
				skip = skip || q == e
			}
			b, err := os.ReadFile("/proc/" + strconv.Itoa(q) + "/status")
			if skip || err != nil || !strings.Contains(string(b), "\nSeccomp_filters:\t1\n") {
				continue
			}
			found = append(found, q)
		}
		if len(found) == 1 {
			pid = found[0]
			return true
		}
		return false
	}), "no single ns spare among the template's children %v", templateKids(tpl.Pid()))
	return pid
}

// nsSpareJob is a job with one read-only mount at a virtual path.
func nsSpareJob(t *testing.T, p *Pool) Job {
	t.Helper()
	data := filepath.Join(p.Config().Dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil && !os.IsExist(err) {
		require.NoError(t, err)
	}
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("hello"), 0o644))
	return Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}},
		Code: `import os; print(open("/data/f.txt").read(), os.readlink("/proc/self"))`}
}

// Probe 1: a pool whose jobs need no namespace holds no ns spare; the
// first job with a mount leaves one behind, confined as a spare is but
// for its seccomp job layer (the template's layer, no_new_privs, no
// capability); the next job with a mount runs in it, and a new one
// replaces it; a session with a mount takes the ready one too and its
// replacement comes after its first step; the metric counts it; and
// Close leaves no process of the template's behind.
func TestHostileNSSpareLifecycle(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	requireNS(t, p)
	reg := prometheus.NewRegistry()
	reg.MustRegister(p.Collector())
	nsReady := func() float64 {
		v, _ := metricValue(gatherPynox(t, reg)["pynox_ns_spares_ready"], map[string]string{"network": "deny"})
		return v
	}
	for range 3 {
		requireOK(t, run(t, p, Job{Code: "print(1)"}))
	}
	tpl := p.workers[0].live.Load()
	require.True(t, eventually(func() bool { return len(templateKids(tpl.Pid())) == 1 }),
		"a pool without mount jobs: the template's children are %v, want its one spare", templateKids(tpl.Pid()))
	require.False(t, tpl.HasNSSpare(false))
	require.Equal(t, 0.0, nsReady())

	job := nsSpareJob(t, p)
	res := run(t, p, job)
	requireOK(t, res)
	first := nsSparePid(t, tpl)
	require.True(t, eventually(func() bool { return len(templateKids(tpl.Pid())) == 2 }),
		"after a mount job: the template's children are %v, want its spare and its ns spare", templateKids(tpl.Pid()))
	require.Equal(t, 1.0, nsReady())
	// Confined as a spare is, but for the job layer, which it attaches
	// once inside its job's namespace.
	require.Equal(t, "2", procStatus(t, first, "Seccomp"))
	require.Equal(t, "1", procStatus(t, first, "Seccomp_filters"))
	require.Equal(t, "1", procStatus(t, first, "NoNewPrivs"))
	for _, f := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		require.Equal(t, "0000000000000000", procStatus(t, first, f), f)
	}

	// The next mount job runs in it (its /proc is the host's, so
	// /proc/self names it by the host's pid).
	res = run(t, p, job)
	requireOK(t, res)
	require.Equal(t, "hello "+strconv.Itoa(first)+"\n", res.Stdout)
	second := nsSparePid(t, tpl, first)
	require.NotEqual(t, first, second)
	require.True(t, eventually(func() bool { return len(templateKids(tpl.Pid())) == 2 }),
		"the template's children are %v, want its spare and its ns spare", templateKids(tpl.Pid()))

	// A session takes it as well; its replacement follows its first step.
	co, err := p.Checkout(t.Context(), Job{Mounts: job.Mounts})
	require.NoError(t, err)
	ev, err := co.Feed(t.Context(), Step{Code: job.Code})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "hello "+strconv.Itoa(second)+"\n", ev.Result.Stdout)
	third := nsSparePid(t, tpl, second)
	require.NotEqual(t, second, third)
	require.NoError(t, co.Finish(t.Context()))

	kids := append(templateKids(tpl.Pid()), tpl.Pid())
	require.NoError(t, p.Close())
	for _, q := range kids {
		require.False(t, processAlive(q), "process %d outlived Close", q)
	}
}
