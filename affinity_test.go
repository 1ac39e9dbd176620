package pynox

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// cpusAllowed returns the Cpus_allowed_list of process pid, expanded.
func cpusAllowed(t testing.TB, pid int) []int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return parseCPUList(t, strings.TrimSpace(v))
		}
	}
	t.Fatalf("no Cpus_allowed_list in /proc/%d/status", pid)
	return nil
}

// parseCPUList expands a kernel CPU list such as "0-2,5".
func parseCPUList(t testing.TB, s string) []int {
	t.Helper()
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		require.NoError(t, err, s)
		b := a
		if isRange {
			b, err = strconv.Atoi(hi)
			require.NoError(t, err, s)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out
}

// jobCPUs is a job that prints its own CPU affinity as a Python list.
const jobCPUs = "import os\nprint(sorted(os.sched_getaffinity(0)))"

func cpuListString(cpus []int) string {
	return strings.ReplaceAll(fmt.Sprint(cpus), " ", ", ")
}

// TestPinCPUs checks Config.PinCPUs on a process that may run on two
// CPUs or more: each template is pinned to one CPU of the process's
// allowed set, the templates to different CPUs, round robin, and the
// pool reports them; a job and a session inherit their template's CPU;
// a template that replaces a dead one gets its predecessor's CPU.
func TestPinCPUs(t *testing.T) {
	t.Parallel()
	allowed := allowedCPUs()
	if len(allowed) < 2 {
		t.Skipf("the test process may run on %v only; pinning needs two CPUs (TestPinCPUsRestricted covers one)", allowed)
	}
	workers := len(allowed) + 1 // round robin wraps around
	p := newTestPool(t, Config{Workers: workers, PinCPUs: true})
	pins := p.PinnedCPUs()
	require.Len(t, pins, workers)
	for i, c := range pins {
		require.Equal(t, allowed[i%len(allowed)], c, "worker %d's CPU", i)
	}
	pids := p.templatePIDs()
	require.Len(t, pids, workers)
	seen := map[int]bool{}
	for _, pid := range pids {
		got := cpusAllowed(t, pid)
		require.Len(t, got, 1, "template %d's Cpus_allowed_list", pid)
		require.Contains(t, allowed, got[0])
		seen[got[0]] = true
	}
	require.Len(t, seen, len(allowed), "the templates cover every allowed CPU")

	for range 2 * workers {
		res := run(t, p, Job{Code: jobCPUs})
		requireOK(t, res)
		out := strings.TrimSpace(res.Stdout)
		ok := false
		for _, c := range allowed {
			ok = ok || out == fmt.Sprintf("[%d]", c)
		}
		require.True(t, ok, "a job's affinity is one allowed CPU, got %s (allowed %v)", out, allowed)
	}
	co := checkout(t, p, Job{})
	r := feed(t, co, jobCPUs)
	requireOK(t, r)
	require.Equal(t, fmt.Sprintf("[%d]", cpusAllowed(t, co.Pid())[0]), strings.TrimSpace(r.Stdout))
	require.Len(t, cpusAllowed(t, co.Pid()), 1, "a session's process is pinned too")
}

// TestPinCPUsRestart checks that a template that replaces a dead one is
// pinned to the same CPU.
func TestPinCPUsRestart(t *testing.T) {
	allowed := allowedCPUs()
	if len(allowed) < 2 {
		t.Skipf("the test process may run on %v only", allowed)
	}
	p := newTestPool(t, Config{Workers: 1, PinCPUs: true})
	old := p.templatePIDs()[0]
	require.Equal(t, []int{allowed[0]}, cpusAllowed(t, old))
	require.NoError(t, syscall.Kill(old, syscall.SIGKILL))
	pid := awaitNewTemplate(t, p, old)
	require.Equal(t, []int{allowed[0]}, cpusAllowed(t, pid), "the replacement keeps its worker's CPU")
	require.Equal(t, []int{allowed[0]}, p.PinnedCPUs())
	res := run(t, p, Job{Code: jobCPUs})
	requireOK(t, res)
	require.Equal(t, fmt.Sprintf("[%d]", allowed[0]), strings.TrimSpace(res.Stdout))
}

// TestPinCPUsOff checks that a pool without PinCPUs (the library's
// default) leaves its templates and jobs on the process's whole set.
func TestPinCPUsOff(t *testing.T) {
	t.Parallel()
	allowed := allowedCPUs()
	p := newTestPool(t, Config{Workers: 2})
	require.Nil(t, p.PinnedCPUs())
	for _, pid := range p.templatePIDs() {
		require.Equal(t, allowed, cpusAllowed(t, pid), "an unpinned template keeps the process's affinity")
	}
	res := run(t, p, Job{Code: jobCPUs})
	requireOK(t, res)
	require.Equal(t, cpuListString(allowed), strings.TrimSpace(res.Stdout))
}

// TestPinCPUsRestricted runs a pool with PinCPUs in a child test process
// whose affinity is one CPU (the last the test process may use, so that
// a pool that pinned by index, not from its own set, would pick another):
// nothing is pinned outside that CPU, and PinnedCPUs says nothing was
// pinned. The child is this test binary, started from a thread whose
// affinity is that one CPU, so that the child inherits it from its
// first instruction.
func TestPinCPUsRestricted(t *testing.T) {
	if cpu := os.Getenv("PYNOX_PIN_CHILD"); cpu != "" {
		want, err := strconv.Atoi(cpu)
		require.NoError(t, err)
		require.Equal(t, []int{want}, allowedCPUs(), "the child's affinity")
		p := newTestPool(t, Config{Workers: 2, PinCPUs: true})
		require.Nil(t, p.PinnedCPUs(), "one allowed CPU: nothing to pin")
		for _, pid := range p.templatePIDs() {
			require.Equal(t, []int{want}, cpusAllowed(t, pid))
		}
		for range 4 {
			res := run(t, p, Job{Code: jobCPUs})
			requireOK(t, res)
			require.Equal(t, fmt.Sprintf("[%d]", want), strings.TrimSpace(res.Stdout))
		}
		return
	}
	requireSandbox(t)
	allowed := allowedCPUs()
	require.NotEmpty(t, allowed)
	cpu := allowed[len(allowed)-1]
	if len(allowed) < 2 {
		t.Logf("the test process may run on CPU %d only: the child runs with the same affinity", cpu)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPinCPUsRestricted$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "PYNOX_PIN_CHILD="+strconv.Itoa(cpu))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	started := make(chan error, 1)
	go func() {
		// This goroutine's thread is left with the narrow affinity: it
		// exits with the goroutine, which never unlocks it.
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			started <- err
			return
		}
		started <- cmd.Start()
	}()
	err := <-started
	require.NoError(t, err)
	require.NoError(t, cmd.Wait(), "child test:\n%s", out.String())
	require.Contains(t, out.String(), "--- PASS: TestPinCPUsRestricted", out.String())
	require.True(t, slices.Contains(allowed, cpu))
}
