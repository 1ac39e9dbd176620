package pynox

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/cgroup"
)

// Probes of the per-job cgroups (issue 9, items 3 and 6): memory that
// RLIMIT_AS does not count (memfd, tmpfs) and tasks that RLIMIT_NPROC does
// not count for uid 0 stay within each job's cgroup, the pool removes every
// cgroup it made, and the backend is reported.

// newCgroupPool starts a pool that must have per-job cgroups, or skips.
func newCgroupPool(t *testing.T, cfg Config) *Pool {
	t.Helper()
	requireSandbox(t)
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root here")
	}
	if l := cgroup.Probe(); l.Backend == cgroup.None {
		t.Skipf("no cgroup pids and memory controllers for this process: %s", l.Reason)
	}
	cfg.Cgroups = cgroup.Require
	return newTestPool(t, cfg)
}

// memfdBomb puts 1 GiB into memfd files, which RLIMIT_AS does not count.
const memfdBomb = `import os
fds = []
for i in range(4):
    fd = os.memfd_create("bomb%d" % i)
    os.posix_fallocate(fd, 0, 256 << 20)
    fds.append(fd)
    print("fallocated", i + 1, flush=True)
print("1 GiB in memfd files")
`

func TestHostileCgroupMemory(t *testing.T) {
	p := newCgroupPool(t, Config{Workers: 1})
	shmem := func() int64 {
		b, err := os.ReadFile("/proc/meminfo")
		require.NoError(t, err)
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Shmem:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				require.NoError(t, err)
				return kb << 10
			}
		}
		t.Fatal("no Shmem in /proc/meminfo")
		return 0
	}

	t.Run("memfd bomb", func(t *testing.T) {
		// Sample the host's shared memory while the job runs.
		before := shmem()
		peak := before
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
					peak = max(peak, shmem())
				}
			}
		}()
		r := run(t, p, Job{Code: memfdBomb, Memory: 32 << 20})
		close(stop)
		<-sampled
		t.Logf("memfd bomb under 32 MiB: %+v; stdout %q; host Shmem peak +%d MiB", r.Error, r.Stdout, (peak-before)>>20)
		requireErrorType(t, r, "MemoryError")
		require.Contains(t, r.Error.Message, "memory than its limit")
		require.Contains(t, r.Error.Hint, "32 MiB")
		require.NotContains(t, r.Stdout, "fallocated 2")
		require.Equal(t, cgroup.Probe().Backend, r.Policy.Cgroups, "policy: %+v", r.Policy)
		require.Less(t, peak-before, int64(512<<20), "the host's shared memory grew by %d MiB", (peak-before)>>20)
		advServes(t, p)
	})

	t.Run("tmpfs file", func(t *testing.T) {
		// /dev/shm is tmpfs: its pages count like memfd's.
		if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
			t.Skip("no /dev/shm")
		}
		dir, err := os.MkdirTemp("/dev/shm", "pynox-test-")
		require.NoError(t, err)
		defer os.RemoveAll(dir)
		pc := newCgroupPool(t, Config{Workers: 1, Limits: Limits{AllowWrite: []string{dir}, MaxFileSize: 1 << 30}})
		r := run(t, pc, Job{Code: fmt.Sprintf(`import os
fd = os.open(%q, os.O_CREAT | os.O_RDWR)
os.posix_fallocate(fd, 0, 512 << 20)
print("fallocated")
`, filepath.Join(dir, "big")), Memory: 32 << 20, AllowWrite: []string{dir}, MaxFileSize: 1 << 30})
		requireErrorType(t, r, "MemoryError")
		require.NotContains(t, r.Stdout, "fallocated")
		advServes(t, pc)
	})

	t.Run("socket buffers", func(t *testing.T) {
		// Unix stream sockets' queued data is kernel memory: 1,000 pairs
		// hold some 200 MiB.
		r := run(t, p, Job{Code: `import os, socket
n = 0
keep = []
try:
    for i in range(1000):
        a, b = socket.socketpair()
        a.setblocking(False)
        keep.append((a, b))
        try:
            while True:
                n += a.send(b"x" * 65536)
        except BlockingIOError:
            pass
except OSError as e:
    print("stopped:", e)
print("queued MiB", n >> 20)
`, Memory: 32 << 20})
		t.Logf("socket buffers under 32 MiB: %+v; stdout %q", r.Error, r.Stdout)
		if r.Error == nil {
			// Refused by the kernel inside the job rather than killed:
			// then it queued less than its limit.
			var mib int
			_, err := fmt.Sscanf(r.Stdout[strings.Index(r.Stdout, "queued"):], "queued MiB %d", &mib)
			require.NoError(t, err, r.Stdout)
			require.Less(t, mib, 100, r.Stdout)
		} else {
			requireErrorType(t, r, "MemoryError")
			require.NotContains(t, r.Stdout, "queued")
		}
		advServes(t, p)
	})

	t.Run("within the allowance", func(t *testing.T) {
		// What the allowance promises still works: 24 MiB in a memfd under
		// 32 MiB.
		r := run(t, p, Job{Code: `import os
fd = os.memfd_create("ok")
os.posix_fallocate(fd, 0, 24 << 20)
print("ok")
`, Memory: 32 << 20})
		requireOK(t, r)
	})
}

// threadBomb clones tasks with raw clone(CLONE_THREAD) that need no stack
// (each loops on pause) and prints how many it made and why it stopped.
// The machine code (x86-64) is:
//
//	f:  mov %rdi,%r8; xor %r9d,%r9d
//	1:  mov $56,%eax; mov $0x50f00,%edi (CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM)
//	    xor %esi,%esi; xor %edx,%edx; xor %r10d,%r10d; syscall
//	    test %rax,%rax; jz 3f; js 2f; inc %r9; dec %r8; jnz 1b; mov %r9,%rax; ret
//	2:  neg %rax; imul $1000,%r9,%r9; add %r9,%rax; neg %rax; ret   (-(made*1000+errno))
//	3:  mov $34,%eax; syscall; jmp 3b                               (pause forever)
const threadBomb = `import ctypes, mmap
code = bytes.fromhex("4989f84531c9b838000000bf000f050031f631d24531d20f054885c0741f780c49ffc149ffc875de4c89c8c348f7d84d69c9e80300004c01c848f7d8c3b8220000000f05ebf7")
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
f = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
r = f(3000)
if r < 0:
    print("made", (-r) // 1000, "errno", (-r) % 1000)
else:
    print("made", r, "errno", 0)
`

func TestHostileCgroupTasks(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the raw-clone probe is x86-64 machine code")
	}
	p := newCgroupPool(t, Config{Workers: 1})
	for i := range 2 {
		r := run(t, p, Job{Code: threadBomb, Memory: 16 << 20})
		t.Logf("raw-clone thread bomb %d: %q %+v", i, r.Stdout, r.Error)
		requireOK(t, r)
		var made, errno int
		_, err := fmt.Sscanf(r.Stdout, "made %d errno %d", &made, &errno)
		require.NoError(t, err, "stdout: %q", r.Stdout)
		require.Equal(t, int(unix.EAGAIN), errno, "made %d tasks", made)
		// The job's main thread is one of its tasks.
		require.Less(t, made, DefaultThreads)
		// Templates keep forking: the next job runs.
		advServes(t, p)
	}
	// Ordinary threads work (RLIMIT_AS allows about 15 under the default
	// allowance, with glibc's per-thread arenas and 8 MiB stacks).
	r := run(t, p, Job{Code: `import threading
ev = threading.Event()
ts = [threading.Thread(target=ev.wait) for _ in range(12)]
for t in ts: t.start()
ev.set()
for t in ts: t.join()
print("12 threads")
`})
	requireOK(t, r)
}

// cgroupJobDirs lists the job cgroups beneath the pool's directories.
func cgroupJobDirs(t *testing.T, p *Pool) []string {
	t.Helper()
	var dirs []string
	for _, b := range p.CgroupDirs() {
		ents, err := os.ReadDir(b)
		require.NoError(t, err)
		for _, e := range ents {
			if e.IsDir() {
				dirs = append(dirs, filepath.Join(b, e.Name()))
			}
		}
	}
	sort.Strings(dirs)
	return dirs
}

func TestHostileCgroupLifecycle(t *testing.T) {
	p := newCgroupPool(t, Config{Workers: 2})
	bases := p.CgroupDirs()
	require.NotEmpty(t, bases)
	l := cgroup.Probe()
	for _, b := range bases {
		// Directly beneath the process's own cgroup, never elsewhere.
		require.Contains(t, []string{l.Pids, l.Memory, l.Unified}, filepath.Dir(b))
		require.True(t, strings.HasPrefix(filepath.Base(b), "pynox-"+strconv.Itoa(os.Getpid())+"-"), b)
	}

	// While a job runs, its process is in a cgroup of its own with the
	// limits.
	// The job waits in a host call until the test has found it.
	done := make(chan *Result)
	found := make(chan struct{})
	var foundOnce sync.Once
	release := func() { foundOnce.Do(func() { close(found) }) }
	t.Cleanup(release)
	go func() {
		done <- run(t, p, Job{Code: "from pynox_host import wait\nprint('running', flush=True)\nwait()\n", Memory: 100 << 20,
			Functions: []string{"wait"}, Host: func(ctx context.Context, _ *Call) (any, error) {
				select {
				case <-found:
				case <-ctx.Done():
				}
				return nil, nil
			}})
	}()
	tpls := p.templatePIDs()
	var jobDir string
	require.Eventually(t, func() bool {
		for _, d := range cgroupJobDirs(t, p) {
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				pid, _ := strconv.Atoi(f)
				if _, ppid, ok := procStat(pid); ok && (ppid == tpls[0] || ppid == tpls[1]) {
					limit := filepath.Join(d, "memory.limit_in_bytes")
					if _, err := os.Stat(limit); os.IsNotExist(err) {
						limit = filepath.Join(d, "memory.max")
					}
					if v, err := os.ReadFile(limit); err == nil {
						n, _ := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
						if n > 100<<20 && n < 1<<30 {
							jobDir = d
							return true
						}
					}
				}
			}
		}
		return false
	}, 20*time.Second, 5*time.Millisecond, "no job process found in a job cgroup with its memory limit")
	t.Logf("job cgroup %s", jobDir)
	release()
	requireOK(t, <-done)

	for range 5 {
		requireOK(t, run(t, p, Job{Code: "print(1)"}))
	}
	co := checkout(t, p, Job{Memory: 48 << 20})
	requireOK(t, feed(t, co, "x = 1"))
	r := feed(t, co, memfdBomb)
	requireErrorType(t, r, "MemoryError")
	require.True(t, r.SessionEnded)
	require.NoError(t, co.Finish(context.Background()))

	// Finished jobs' cgroups are reused, not multiplied: no more than the
	// processes that lived at once (two spares, two jobs, a session).
	require.LessOrEqual(t, len(cgroupJobDirs(t, p)), 6*len(bases), "job cgroups: %v", cgroupJobDirs(t, p))
	// And only live spares are in them.
	require.Eventually(t, func() bool {
		tpls := p.templatePIDs()
		for _, d := range cgroupJobDirs(t, p) {
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			require.NoError(t, err)
			for _, f := range strings.Fields(string(b)) {
				pid, _ := strconv.Atoi(f)
				if _, ppid, ok := procStat(pid); ok && ppid != tpls[0] && ppid != tpls[1] {
					return false
				}
			}
		}
		return true
	}, 20*time.Second, 10*time.Millisecond, "a job cgroup holds a process that is no spare")
	require.NoError(t, p.Close())
	for _, b := range bases {
		_, err := os.Stat(b)
		require.True(t, os.IsNotExist(err), "%s is left after Close", b)
	}
}

// TestCgroupHelperProcess is not a test: TestHostileCgroupRequire runs the
// test binary as a helper in a mount namespace without cgroup file systems.
func TestCgroupHelperProcess(t *testing.T) {
	mode := os.Getenv("PYNOX_CGROUP_HELPER")
	if mode == "" {
		t.Skip("helper process only")
	}
	// Detach every cgroup file system from this (private) mount namespace.
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		fmt.Println("mountinfo:", err)
		os.Exit(3)
	}
	var points []string
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		for i, x := range f {
			if x == "-" && i+1 < len(f) && (f[i+1] == "cgroup" || f[i+1] == "cgroup2") {
				points = append(points, f[4])
			}
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	for _, pt := range points {
		if err := unix.Unmount(pt, unix.MNT_DETACH); err != nil {
			fmt.Println("umount", pt, err)
			os.Exit(3)
		}
	}
	p, err := New(Config{Dir: os.TempDir(), Python: testPython(), Workers: 1, Cgroups: mode})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(0)
	}
	defer p.Close()
	// What the ready event (jsonl) and a result report.
	ready, _ := json.Marshal(map[string]any{"event": "ready", "cgroups": p.Cgroups()})
	fmt.Println(string(ready))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := p.Run(ctx, Job{ID: 1, Code: "print(1)"})
	if err != nil {
		fmt.Println("run:", err)
	}
	line, _ := json.Marshal(res)
	fmt.Println(string(line))
	os.Exit(0)
}

func TestHostileCgroupRequire(t *testing.T) {
	requireSandbox(t)
	if os.Geteuid() != 0 {
		t.Skip("a mount namespace needs root here")
	}
	helper := func(mode string) string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCgroupHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "PYNOX_CGROUP_HELPER="+mode)
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	out := helper(cgroup.Require)
	require.Contains(t, out, `error: Spawn: pool.cgroups: "require": per-job cgroups are unavailable`)
	require.NotContains(t, out, `"event":"ready"`)

	// auto starts without them and says so.
	out = helper(cgroup.Auto)
	lines := readyAndResult(t, out)
	require.Equal(t, "none", lines[0]["cgroups"], out)
	require.Equal(t, "none", lines[1]["policy"].(map[string]any)["cgroups"], out)
}

// readyAndResult decodes the ready line and the first result from the
// helper's output.
func readyAndResult(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if !strings.HasPrefix(sc.Text(), "{") {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
		lines = append(lines, m)
	}
	require.GreaterOrEqual(t, len(lines), 2, out)
	require.Equal(t, "ready", lines[0]["event"], out)
	return lines
}

func TestHostileCgroupReported(t *testing.T) {
	p := newCgroupPool(t, Config{Workers: 1})
	// The ready event reports p.Cgroups() (jsonl's TestServeProtocol).
	r := run(t, p, Job{ID: 1, Code: "print(1)"})
	requireOK(t, r)
	want := cgroup.Probe().Backend
	require.Equal(t, want, r.Policy.Cgroups)
	require.Equal(t, want, p.Cgroups())

	// off uses none, and says so.
	po := newTestPool(t, Config{Workers: 1, Cgroups: cgroup.Off})
	require.Equal(t, "none", po.Cgroups())
	require.Empty(t, po.CgroupDirs())
	r = run(t, po, Job{Code: "print(1)"})
	requireOK(t, r)
	require.Equal(t, "none", r.Policy.Cgroups)
}
