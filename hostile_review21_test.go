package pynox

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// review21Descendants returns the live (not zombie) processes below this
// test process, by walking every process's parent in /proc.
func review21Descendants(t *testing.T) map[int]bool {
	t.Helper()
	parent := map[int]int{}
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		parent[pid] = pp
	}
	me := os.Getpid()
	out := map[int]bool{}
	for pid := range parent {
		for q, n := parent[pid], 0; q > 1 && n < 64; q, n = parent[q], n+1 {
			if q == me {
				out[pid] = true
				break
			}
		}
	}
	return out
}

// review21Below reports whether pid has ancestor anc.
func review21Below(pid, anc int) bool {
	for n := 0; n < 64 && pid > 1; n++ {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return false
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 {
			return false
		}
		pid, _ = strconv.Atoi(f[1])
		if pid == anc {
			return true
		}
	}
	return false
}

// A job whose template is killed while it runs, after it tried to leave
// its process group and fork: no process of it outlives its result, and
// its result is a failure, not a success.
func TestReview21TemplateDeathLeavesNoJobProcess(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
	done := make(chan struct{})
	var res *Result
	var err error
	go func() {
		defer close(done)
		res, err = p.Run(context.Background(), Job{Code: `import os, time
try:
    os.setsid()
except Exception:
    pass
try:
    if os.fork() == 0:
        time.sleep(60)
except Exception:
    pass
time.sleep(60)`, Timeout: 20 * time.Second})
	}()
	// Every process beneath the template while the job runs: the job's
	// process (a spare forked before the job came) and any it forked.
	time.Sleep(300 * time.Millisecond)
	tpls := p.templatePIDs()
	require.NotEmpty(t, tpls)
	var jobPids []int
	for pid := range review21Descendants(t) {
		for _, tp := range tpls {
			if review21Below(pid, tp) {
				jobPids = append(jobPids, pid)
			}
		}
	}
	require.NotEmpty(t, jobPids, "no process beneath the template")
	t.Logf("processes beneath the template: %v", jobPids)
	for _, pid := range tpls {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the job's result did not come within 5 s of its template's death")
	}
	if err == nil {
		t.Logf("result: exit %d error %+v", res.Exit, res.Error)
		require.NotNil(t, res.Error, "a job whose template died reported success: %+v", res)
	}
	for range 50 {
		left := 0
		now := review21Descendants(t)
		for _, pid := range jobPids {
			if now[pid] {
				left++
			}
		}
		if left == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("job processes %v outlived their template's death", jobPids)
}

// review21Count is how many descriptors and live children process pid has.
func review21Count(t *testing.T, pid int) (fds, kids int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	require.NoError(t, err)
	all := review21Descendants(t)
	for q := range all {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(q) + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			kids++
		}
	}
	return len(ents), kids
}

// review21Settled waits (up to 4 s) until the mounter's descriptor count
// has held still for 300 ms (its stock refilled, the pool's ns spares'
// leases taken), then returns it and how many of those descriptors are
// not namespaces. The stock and the leases change size as jobs come and
// go, so a count taken mid-refill is no baseline.
func review21Settled(t *testing.T, pid int) (fds, other int) {
	t.Helper()
	last, same := -1, 0
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		n, _ := review21Count(t, pid)
		if n == last {
			same++
		} else {
			last, same = n, 0
		}
		if same >= 6 {
			break
		}
	}
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	require.NoError(t, err)
	for _, e := range ents {
		l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + e.Name())
		if err == nil && (strings.HasPrefix(l, "mnt:[") || strings.HasPrefix(l, "user:[")) {
			continue
		}
		other++
	}
	return len(ents), other
}

// Many mount jobs back to back (refills preempted by the next lease,
// inline builds, deferred drops) leave the mounter with no more
// descriptors or children than a handful of them did: nothing a job
// stream does piles up in it. Each job sees the same root and reaches
// neither an ungranted directory nor another namespace's root.
func TestReview21MountJobsBackToBackNoPileUp(t *testing.T) {
	testenv.Slow(t)
	before := mounterPids(t)
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	code := "import os\nprint(os.stat('/data').st_dev == os.stat('/data/f.txt').st_dev)\nprint(open('/data/f.txt').read())\ntry:\n    os.listdir('/proc/1/root')\n    print('pid1root allowed')\nexcept OSError:\n    print('pid1root denied')"
	for range 4 {
		requireOK(t, run(t, p, Job{Mounts: mounts, Code: code}))
	}
	m := newMounter(t, before)
	review21Settled(t, m)
	fd0, kid0 := review21Count(t, m)
	var first string
	for range 30 {
		r := run(t, p, Job{Mounts: mounts, Code: code})
		requireOK(t, r)
		if first == "" {
			first = r.Stdout
		}
		require.Equal(t, first, r.Stdout, "a job's view changed between jobs")
		require.Contains(t, r.Stdout, "pid1root denied")
	}
	fd1, kid1 := 0, 0
	for range 100 {
		fd1, kid1 = review21Count(t, m)
		if fd1 <= fd0+2 && kid1 <= kid0+2 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the mounter grew from %d fds/%d children to %d/%d over 30 mount jobs", fd0, kid0, fd1, kid1)
}

// A mount job whose template is killed while it runs: its result is a
// failure, no process beneath the dead template is left, and the next
// mount job runs in a fresh namespace with the mount as before; the
// mounter's descriptors come back to where they were.
func TestReview21TemplateDeathDuringMountJob(t *testing.T) {
	testenv.Slow(t)
	before := mounterPids(t)
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	m := newMounter(t, before)
	fd0, other0 := review21Settled(t, m)
	done := make(chan *Result, 1)
	go func() {
		res, err := p.Run(context.Background(), Job{Mounts: mounts, Code: "import time\ntime.sleep(60)", Timeout: 20 * time.Second})
		if err != nil {
			res = nil
		}
		done <- res
	}()
	time.Sleep(300 * time.Millisecond)
	tpls := p.templatePIDs()
	require.NotEmpty(t, tpls)
	var below []int
	for pid := range review21Descendants(t) {
		for _, tp := range tpls {
			if review21Below(pid, tp) {
				below = append(below, pid)
			}
		}
	}
	for _, tp := range tpls {
		syscall.Kill(tp, syscall.SIGKILL)
	}
	select {
	case res := <-done:
		if res != nil {
			require.NotNil(t, res.Error, "%+v", res)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no result within 5 s of the template's death")
	}
	res := run(t, p, Job{Mounts: mounts, Code: "print(open('/data/f.txt').read())"})
	requireOK(t, res)
	require.Equal(t, "hello\n", res.Stdout)
	now := review21Descendants(t)
	for _, pid := range below {
		require.False(t, now[pid], "process %d outlived its template", pid)
	}
	// The new template's ns spares lease namespaces of their own and the
	// stock refills: wait for that to settle, then the mounter holds no
	// more than before (give or take a namespace a build dropped later),
	// and no more descriptors that are not namespaces at all.
	for range 5 {
		fd1, other1 := review21Settled(t, m)
		if fd1 <= fd0+2 && other1 <= other0+1 {
			return
		}
	}
	fd1, other1 := review21Settled(t, m)
	t.Fatalf("the mounter's descriptors grew from %d (%d not namespaces) to %d (%d)", fd0, other0, fd1, other1)
}
