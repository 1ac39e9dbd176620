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

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
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
		// The ns spare entered the namespace leased for it ahead of its
		// job (hostile_nsfast_test.go): it is the one child in a mount
		// namespace other than the template's.
		tplNS, err := os.Readlink("/proc/" + strconv.Itoa(tpl.Pid()) + "/ns/mnt")
		if err != nil {
			return false
		}
		var found []int
		for _, q := range templateKids(tpl.Pid()) {
			skip := false
			for _, e := range except {
				skip = skip || q == e
			}
			ns, err := os.Readlink("/proc/" + strconv.Itoa(q) + "/ns/mnt")
			if skip || err != nil || ns == tplNS {
				continue
			}
			found = append(found, q)
		}
		if len(found) != 1 {
			pid = 0
			return false
		}
		// The same process twice in a row (eventually polls every 50
		// ms): a job's
		// process that is still exiting (its namespace is readable until
		// it is a zombie) is never taken for the spare.
		if pid != found[0] || !processAlive(pid) {
			pid = found[0]
			return false
		}
		return true
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
// first job with a mount leaves one behind, confined as a spare is, in
// the namespace leased for it (both seccomp layers, no_new_privs, no
// capability); the next job with a mount runs in it, with both seccomp
// layers (setns denied: EPERM) and no capability, and a new one
// replaces it; a session with a mount takes the ready one too and its
// replacement comes after its first step; the metric counts it; and
// Close leaves no process of the template's behind.
func TestHostileNSSpareLifecycle(t *testing.T) {
	testenv.Slow(t)
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
	// Confined as a spare is, with its job layer, which it attached
	// once inside the namespace leased for it, before any job.
	require.Equal(t, "2", procStatus(t, first, "Seccomp"))
	require.Equal(t, "2", procStatus(t, first, "Seccomp_filters"))
	require.Equal(t, "1", procStatus(t, first, "NoNewPrivs"))
	for _, f := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		require.Equal(t, "0000000000000000", procStatus(t, first, f), f)
	}

	// The next mount job runs in it (its /proc is the host's, so
	// /proc/self names it by the host's pid), under both seccomp layers
	// from its first line on, with no capability and no way into
	// another namespace.
	done := make(chan *Result, 1)
	go func() {
		done <- run(t, p, Job{Mounts: job.Mounts, Code: `import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
r = libc.setns(0, 0)
print(open("/data/f.txt").read(), os.readlink("/proc/self"), r, errno.errorcode[ctypes.get_errno()], flush=True)
time.sleep(0.5)`})
	}()
	require.True(t, eventually(func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(first) + "/status")
		return err == nil && strings.Contains(string(b), "\nSeccomp_filters:\t2\n")
	}), "the job's process never attached its job layer")
	for _, f := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		require.Equal(t, "0000000000000000", procStatus(t, first, f), f)
	}
	require.Equal(t, "1", procStatus(t, first, "NoNewPrivs"))
	res = <-done
	requireOK(t, res)
	// setns is denied by the job layer (EPERM), not refused for its
	// descriptor (EINVAL).
	require.Equal(t, "hello "+strconv.Itoa(first)+" -1 EPERM\n", res.Stdout)
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

// Probe 2: a ready ns spare that died (killed from outside) costs the
// next mount job nothing but a retry in the next one, as a dead spare
// does; a template that dies takes its ns spare along, and its
// replacement keeps none until its own first mount job; Shutdown leaves
// no process behind.
func TestHostileNSSpareDeadAndRestart(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 1})
	requireNS(t, p)
	job := nsSpareJob(t, p)
	requireOK(t, run(t, p, job))
	tpl := p.workers[0].live.Load()
	dead := nsSparePid(t, tpl)
	require.NoError(t, unix.Kill(dead, unix.SIGKILL))
	res := run(t, p, job)
	requireOK(t, res)
	require.NotEqual(t, "hello "+strconv.Itoa(dead)+"\n", res.Stdout)
	require.Equal(t, tpl, p.workers[0].live.Load(), "the template was replaced")
	ns := nsSparePid(t, tpl, dead)

	require.NoError(t, unix.Kill(tpl.Pid(), unix.SIGKILL))
	newPid := awaitNewTemplate(t, p, tpl.Pid())
	require.True(t, eventually(func() bool { return !processAlive(ns) }), "the ns spare outlived its template")
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
	tpl = p.workers[0].live.Load()
	require.Equal(t, newPid, tpl.Pid())
	require.True(t, eventually(func() bool { return len(templateKids(newPid)) == 1 }),
		"a new template without mount jobs: children %v, want its one spare", templateKids(newPid))
	require.False(t, tpl.HasNSSpare(false))
	requireOK(t, run(t, p, job))
	ns = nsSparePid(t, tpl)

	kids := append(templateKids(newPid), newPid)
	require.Contains(t, kids, ns)
	require.NoError(t, p.Shutdown(t.Context()))
	for _, q := range kids {
		require.False(t, processAlive(q), "process %d outlived Shutdown", q)
	}
}

// Probe 3: each ns spare is in a job cgroup of its own, as every spare
// is, with the tasks limit of one job: it holds none of another job's
// tasks, so a plain job of a pool with an ns spare ready still starts as
// many threads as a pool without one lets it.
func TestHostileNSSpareCgroup(t *testing.T) {
	testenv.Slow(t)
	p := newCgroupPool(t, Config{Workers: 1, Limits: Limits{Threads: 8}})
	requireNS(t, p)
	job := nsSpareJob(t, p)
	requireOK(t, run(t, p, job))
	tpl := p.workers[0].live.Load()
	ns := nsSparePid(t, tpl)
	// The template's other child is its spare, once the job's process
	// (which may still be listed just after Run) is reaped.
	var spare int
	require.True(t, eventually(func() bool {
		spare = 0
		n := 0
		for _, q := range templateKids(tpl.Pid()) {
			if q != ns {
				spare, n = q, n+1
			}
		}
		return n == 1
	}), "the template's children besides the ns spare %d: %v", ns, templateKids(tpl.Pid()))
	groupOf := func(pid int) string {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
		require.NoError(t, err)
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.SplitN(l, ":", 3)
			if len(f) == 3 && (strings.Contains(","+f[1]+",", ",pids,") || f[1] == "") {
				return f[2]
			}
		}
		return ""
	}
	var dir string
	require.True(t, eventually(func() bool {
		for _, d := range cgroupJobDirs(t, p) {
			if strings.HasSuffix(d, groupOf(ns)) {
				dir = d
			}
		}
		return dir != ""
	}), "the ns spare %d is in no job cgroup (%s)", ns, groupOf(ns))
	t.Logf("ns spare %d in %s", ns, dir)
	require.NotEqual(t, groupOf(ns), groupOf(spare), "the ns spare shares the spare's cgroup")
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(ns), strings.TrimSpace(string(procs)))
	if max, err := os.ReadFile(filepath.Join(dir, "pids.max")); err == nil {
		require.Equal(t, "8", strings.TrimSpace(string(max)))
	}
	threads := `import threading
ev = threading.Event()
ts = [threading.Thread(target=ev.wait) for _ in range(7)]
for t in ts: t.start()
ev.set()
for t in ts: t.join()
print("7 threads")
`
	r := run(t, p, Job{Code: threads})
	requireOK(t, r)
	require.Equal(t, "7 threads\n", r.Stdout)
	r = run(t, p, Job{Code: threads, Mounts: job.Mounts})
	requireOK(t, r)
	require.Equal(t, "7 threads\n", r.Stdout)
}
