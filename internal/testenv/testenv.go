// Package testenv holds the test helpers that more than one package's
// tests share: what the machine must offer for a test to run, the
// interpreter tests use, and what /proc says of processes and of the test
// process's descriptors. Only tests import it.
package testenv

import (
	"flag"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/sandbox"
)

// RequireSandbox skips a test when the kernel cannot confine jobs: every
// job would then fail closed with SandboxSetupError, which other tests
// prove.
func RequireSandbox(t testing.TB) {
	t.Helper()
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock, so jobs cannot run confined: %v", err)
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 on PATH")
	}
}

// LongEnv names the environment variable that runs the long tests: the
// load and endurance runs, the chaos smoke run and the README's blocks.
// `go test ./...` skips them so that a developer's run stays short; CI
// (.ci/run) sets it and runs everything.
const LongEnv = "PYNOX_LONG"

// RequireLong skips a long test unless PYNOX_LONG=1 is set; what says
// what the test does, for the skip message.
func RequireLong(t testing.TB, what string) {
	t.Helper()
	if os.Getenv(LongEnv) != "1" {
		t.Skipf("%s: a long test, run with %s=1 (as .ci/run does)", what, LongEnv)
	}
}

// Slow skips a slow test unless PYNOX_LONG=1 is set, as RequireLong
// does. A test is slow when it took over a second (over two when it runs
// in parallel) on the 2-vCPU reference machine: `go test ./...` keeps
// the rest and stays under a minute; CI (.ci/run) runs every test.
func Slow(t testing.TB) {
	t.Helper()
	if os.Getenv(LongEnv) != "1" {
		t.Skipf("a slow test: it runs with %s=1 (as .ci/run does), so that `go test ./...` stays under a minute", LongEnv)
	}
}

// MinParallel is how many t.Parallel tests a package that calls
// RaiseParallel runs at once unless -parallel says otherwise: most of
// them wait (for a template to start, a timeout to fire, a job to sleep)
// rather than compute, and go test's default, GOMAXPROCS, left a 2-CPU
// machine half idle. Eight rather than four: the slowest parallel tests
// wait for seconds with little CPU, so more of them at once shortens the
// suite's parallel phase.
const MinParallel = 8

// RaceMinParallel is MinParallel under the race detector (`go test
// -race`, as .ci/run runs the suite a second time): every goroutine is
// several times slower there, and eight tests at once on a loaded 2-CPU
// machine pushed a job with a 15 s timeout past it
// (TestHostileReview4ToolKwargsFlood).
const RaceMinParallel = 4

// RaiseParallel raises -test.parallel to MinParallel (RaceMinParallel
// under the race detector) when the command line did not set it and
// GOMAXPROCS is below it. A package's TestMain calls it before m.Run.
func RaiseParallel() {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	n := MinParallel
	if raceEnabled {
		n = RaceMinParallel
	}
	if f := flag.Lookup("test.parallel"); f != nil && !set && runtime.GOMAXPROCS(0) < n {
		if err := f.Value.Set(strconv.Itoa(n)); err != nil {
			panic(err)
		}
	}
}

// RunsAll reports whether the test binary runs all of its package's
// tests: no -test.run (nor -test.list) narrows them.
func RunsAll() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	for _, name := range []string{"test.run", "test.list"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	return true
}

// Python is the interpreter tests use: Debian's when present (it has the
// python3-numpy and python3-pandas packages), else "" (the first python3).
func Python() string {
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return ""
}

// ProcessAlive reports whether pid names a running process (a zombie has
// finished running).
func ProcessAlive(pid int) bool {
	state, _, ok := ProcStat(pid)
	return ok && state != "Z"
}

// ProcStat returns a process's state letter and parent pid from
// /proc/<pid>/stat; ok is false when the process is gone.
func ProcStat(pid int) (state string, ppid int, ok bool) {
	f := ProcStatFields(pid)
	if len(f) < 2 {
		return "", 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return f[0], ppid, err == nil
}

// ProcStatFields returns the fields of /proc/<pid>/stat after the command
// name (field 3, the state, first); nil when the process is gone.
func ProcStatFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// SteadyFDs waits until the test process's descriptor count holds still
// for 200ms, and returns it.
func SteadyFDs(t testing.TB) int {
	t.Helper()
	n, since := FDs(t), time.Now()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := FDs(t); m != n {
			n, since = m, time.Now()
		} else if time.Since(since) > 200*time.Millisecond {
			break
		}
	}
	return n
}

// FDs counts the test process's open descriptors, leaving out the
// control files of job cgroups: a job cgroup holds its control files open
// for its life (internal/cgroup/held.go), and a pool keeps its groups for
// reuse, making more when it needs more at once (a lost process's group
// is released while its replacement's is in use, say); the cgroup
// package's tests count those.
func FDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range ents {
		if !cgroupFile("/proc/self/fd/" + e.Name()) {
			n++
		}
	}
	return n - 1 // the directory being read
}

// cgroupFile reports whether the descriptor at path (in /proc/self/fd) is
// a regular file of a cgroup file system, a control file.
func cgroupFile(path string) bool {
	var fs unix.Statfs_t
	var st unix.Stat_t
	if unix.Statfs(path, &fs) != nil || (fs.Type != unix.CGROUP_SUPER_MAGIC && fs.Type != unix.CGROUP2_SUPER_MAGIC) {
		return false
	}
	return unix.Stat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG
}

// SyncBuffer is a buffer that several goroutines (a log handler, a
// process's output copier, the test) may write and read at once.
type SyncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
