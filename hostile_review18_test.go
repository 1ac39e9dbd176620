package pynox

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/testenv"
)

// Review 18 (issue 13, inline stock builds): an outside reviewer's probes
// against stock namespaces the mounter builds itself, each through a
// holder process it clones with CLONE_VM in the namespace's new user and
// mount namespace and kills once it holds the namespace's descriptors.
// Each probe runs real python3 in the real sandbox. The mounter-side
// probes (a holder's signals, the mounter's death mid-build, builds that
// cannot fork or clone) are internal/mountns's TestReview18*.

// r18UserNS maps each user namespace (its /proc/<pid>/ns/user link) to
// the pids of the processes in it, over the whole machine.
func r18UserNS() map[string][]int {
	out := map[string][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/user"); err == nil {
			out[l] = append(out[l], pid)
		}
	}
	return out
}

// Probe: while a mount job runs, its user namespace (built inline by the
// mounter, through a holder) holds its spare's process only: no holder
// (nor any other process) is left in it, from the job's first instruction
// to its end, as the host sees every process of the machine; the job's
// id maps are the one-id map the mounter writes for every namespace
// (uid and gid 0 inside are 4294967294 outside), so the holder's maps
// were written before it was killed; the mounter holds no child once its
// stock is full.
func TestHostileReview18NoHolderInJobNamespace(t *testing.T) {
	testenv.Slow(t)
	before := mounterPids(t)
	p, data := r13ProcPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	mounter := newMounter(t, before)
	for i := range 4 {
		spare := r13Leased(t, p)
		userNS, err := os.Readlink("/proc/" + strconv.Itoa(spare) + "/ns/user")
		require.NoError(t, err)
		var (
			wg     sync.WaitGroup
			others []int
			done   = make(chan struct{})
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				for _, q := range r18UserNS()[userNS] {
					if q != spare {
						others = append(others, q)
					}
				}
				select {
				case <-done:
					return
				default:
				}
			}
		}()
		res := run(t, p, Job{Mounts: mounts, AllowRead: []string{"/proc"}, Code: r13Self + `import time
print("MAPS", open("/proc/self/uid_map").read().split(), open("/proc/self/gid_map").read().split(), flush=True)
print(open("/data/f.txt").read())
time.sleep(0.3)`})
		close(done)
		wg.Wait()
		requireOK(t, res)
		r13RequireIn(t, res, spare)
		require.Empty(t, others, "job %d: processes besides its own in its user namespace %s", i, userNS)
		require.Contains(t, res.Stdout, "MAPS ['0', '4294967294', '1'] ['0', '4294967294', '1']\n", "job %d", i)
		require.Contains(t, res.Stdout, "hello\n", "job %d", i)
	}
	require.True(t, eventually(func() bool {
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", mounter, mounter))
		return strings.TrimSpace(string(kids)) == ""
	}), "the mounter keeps a child (a holder or builder) with its stock full")
	advServes(t, p)
}

// r18Sweep is a job that asks, with signal 0 (a permission check that
// delivers nothing), whether it may signal each of the next 30,000 pids
// after its own, for about a second of rounds, then tries to
// open the memory, read the mount namespace and list the root of every
// process /proc lists, ten times, and sends
// SIGINT to the pool's mounter (argument MOUNTER); it prints the pids it
// could signal and the errors it got.
const r18Sweep = `import errno, json, os, signal, time
me = os.getpid()
could, errs, rounds = set(), {}, 0
end = time.monotonic() + 1.0
while time.monotonic() < end:
    rounds += 1
    for q in range(me + 1, me + 30000):
        try:
            os.kill(q, 0)
            could.add(q)
        except OSError as e:
            errs[errno.errorcode.get(e.errno, str(e.errno))] = errs.get(errno.errorcode.get(e.errno, str(e.errno)), 0) + 1
# Every process the job may list in /proc (holders come and go): its
# memory, its namespaces, its root.
reach, scanned = {}, set()
for _ in range(10):
    for q in os.listdir("/proc"):
        if not q.isdigit() or int(q) == me:
            continue
        scanned.add(q)
        for what, f in (("mem", lambda: os.close(os.open("/proc/%s/mem" % q, os.O_RDONLY))),
                        ("ns", lambda: os.readlink("/proc/%s/ns/mnt" % q)),
                        ("root", lambda: os.listdir("/proc/%s/root/" % q))):
            try:
                f()
                reach.setdefault(what, []).append(int(q))
            except OSError:
                pass
try:
    os.kill(MOUNTER, signal.SIGINT)
    m = "ok"
except OSError as e:
    m = errno.errorcode.get(e.errno, str(e.errno))
print("SWEEP " + json.dumps({"could": sorted(could), "errs": errs, "rounds": rounds, "mounter": m, "reach": reach, "scanned": len(scanned)}), flush=True)
`

// Probe: in a pool whose templates share the host's PID namespace
// (pid_namespace = "off", so a job can name every process of the
// machine), a job sweeping the pids after its own while other mount jobs
// make the mounter build namespaces inline (a holder is born and killed
// at each build) may signal none of them: no holder, no spare, no
// mounter (Landlock's signal scoping), nor open any other process's
// memory (a holder's is the mounter's), mount namespace or root through
// /proc; its SIGINT to the mounter is refused, and the mounter serves on
// (the same process: mount jobs after it see their mounts).
func TestHostileReview18SignalSweepDuringBuilds(t *testing.T) {
	testenv.Slow(t)
	before := mounterPids(t)
	dir := t.TempDir()
	p := newTestPool(t, Config{Workers: 2, Dir: dir, PIDNamespace: "off", Limits: Limits{AllowRead: []string{dir, "/proc"}}})
	requireNS(t, p)
	if abi, err := sandbox.ABI(); err != nil || abi < 6 {
		// Without Landlock's signal scoping a job running as the pool's
		// uid may signal its processes (SECURITY.md: run the pool as a
		// dedicated user on such kernels).
		t.Skipf("Landlock has no signal scoping here (ABI %d, %v)", abi, err)
	}
	data := helloDataDir(t, dir)
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	mounter := newMounter(t, before)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	builds := 0
	var bad []string // mount jobs that failed meanwhile
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			res := run(t, p, Job{Mounts: mounts, Code: `print(open("/data/f.txt").read())`})
			if res.Error != nil || res.Stdout != "hello\n" {
				bad = append(bad, fmt.Sprintf("%+v %q", res.Error, res.Stdout))
				return
			}
			builds++
		}
	}()
	res := run(t, p, Job{AllowRead: []string{"/proc"}, Code: strings.Replace(r18Sweep, "MOUNTER", strconv.Itoa(mounter), 1)})
	close(stop)
	wg.Wait()
	requireOK(t, res)
	require.Empty(t, bad, "mount jobs failed during the sweep")
	m := r13Line(t, res, "SWEEP")
	t.Logf("mount jobs meanwhile: %d; sweep: rounds %v, errors %v, mounter %v; /proc scan: %v processes", builds, m["rounds"], m["errs"], m["mounter"], m["scanned"])
	require.Greater(t, m["scanned"], float64(1), "the job's /proc lists no other process")
	require.Empty(t, m["could"], "the job may signal these processes")
	require.Empty(t, m["reach"], "the job reached these processes' memory, namespaces or roots")
	require.Equal(t, "EPERM", m["mounter"], "the job's SIGINT to the mounter")
	require.True(t, processAlive(mounter), "the mounter died")
	require.Contains(t, mounterPids(t), mounter)
	for range 3 {
		res := run(t, p, Job{Mounts: mounts, Code: `print(open("/data/f.txt").read())`})
		requireOK(t, res)
		require.Equal(t, "hello\n", res.Stdout)
	}
	advServes(t, p)
}

const r18SelfConfineEnv = "PYNOX_R18_SELFCONFINE"

// Probe: in a pool that confines itself (each namespace's root a slot of
// one shared tmpfs, every stock namespace built inline), jobs with ever
// new mount paths, twice as many as the pool has slots and two more, run
// two at a time: every one is answered, sees its own mount and no other
// job's mountpoint (a slot is emptied before its reuse), and
// the pool serves on: no slot is lost to the churn.
func TestHostileReview18SelfConfinedSlotChurn(t *testing.T) {
	testenv.Slow(t)
	dir, child := nsChildProcess(t, r18SelfConfineEnv)
	if !child {
		return
	}
	p := selfConfinedPool(t, dir, 2)
	requireNS(t, p)
	data := helloDataDir(t, dir)
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: "print(1)"}))
	n := 2*p.ns.nSlots + 2
	require.Greater(t, n, 0, "a self-confined pool with no slots")
	t.Logf("%d slots, %d jobs", p.ns.nSlots, n)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		bad  []string
		jobs = make(chan int)
	)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				name := fmt.Sprintf("r18-%d", i)
				res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/" + name + "/m"}}, Code: `import os
print(open("/` + name + `/m/f.txt").read(), [e for e in ("r18-%d" % j for j in range(` + strconv.Itoa(n) + `)) if os.path.lexists("/" + e)])`})
				if want := "hello ['" + name + "']\n"; res.Error != nil || res.Stdout != want {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%s: %+v %q %s", name, res.Error, res.Stdout, res.Stderr))
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	require.Empty(t, bad)
	advServes(t, p)
}
