package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/cgroup"
	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/testenv"
	"github.com/pynox/pynox/jsonl"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// TestMain runs the package's parallel tests at least
// testenv.MinParallel at a time (each starts its own `pynox pool` or
// `pynox serve` in its own directory, on port 0, and mostly waits on it).
// What they leave to PATH (the pool's python3, the Python clients) runs
// the tests' interpreter (testenv.PreferPythonOnPath).
//
// When the whole package runs (no -run), the build starts at once in the
// background, so that the sequential tests that need no binary run while
// it links.
func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	testenv.PreferPythonOnPath()
	if testenv.RunsAll() {
		go buildOnce.Do(buildBinary)
	}
	code := m.Run()
	buildOnce.Do(func() {}) // waits for a build still under way
	os.Exit(code)
}

// pynoxBinary builds this command once per test run: the first caller
// builds it, parallel tests that call meanwhile wait for that build.
func pynoxBinary(t *testing.T) string {
	t.Helper()
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock, so jobs cannot run confined: %v", err)
	}
	return builtBinary(t)
}

// builtBinary returns the package's one build of this command (a plain
// `go build`, which stamps the VCS revision as -buildvcs=auto does), for
// tests that need no sandbox; every other test uses pynoxBinary.
func builtBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(buildBinary)
	require.NoError(t, buildErr)
	return binPath
}

// buildBinary builds this command, once (buildOnce): binPath, or
// buildErr with go build's output. The build is testenv.BuildPynox's,
// which every package's tests of this checkout share.
func buildBinary() { binPath, buildErr = testenv.BuildPynox() }

type poolProc struct {
	ready  map[string]any
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Scanner
	stderr *syncBuffer
}

// syncBuffer is a buffer the pool's writers and the test share.
type syncBuffer = testenv.SyncBuffer

func startPool(t *testing.T, args ...string) *poolProc {
	t.Helper()
	return startPoolIn(t, t.TempDir(), args...)
}

func startPoolIn(t *testing.T, dir string, args ...string) *poolProc {
	t.Helper()
	return startBinaryIn(t, pynoxBinary(t), dir, args...)
}

// startBinaryIn starts `bin pool args...` in dir and reads its ready line.
func startBinaryIn(t *testing.T, bin, dir string, args ...string) *poolProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"pool"}, args...)...)
	cmd.Dir = dir
	return startPoolCmd(t, cmd)
}

// startPoolCmd starts a `pynox pool` command made by the caller and waits
// for its ready event.
func startPoolCmd(t *testing.T, cmd *exec.Cmd) *poolProc {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	p := &poolProc{cmd: cmd, stdin: stdin, out: sc, stderr: stderr}
	p.ready = p.next(t)
	require.Equal(t, "ready", p.ready["event"], "stderr: %s", stderr.String())
	return p
}

// startClientCmd starts a `pynox pool` command made by the caller as a
// jsonl.Client, for tests that need no raw bytes on the wire; the test's
// end closes it (and kills the pool if it is still running).
func startClientCmd(t *testing.T, cmd *exec.Cmd) (*jsonl.Client, *syncBuffer) {
	t.Helper()
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	c, err := jsonl.StartCmd(cmd)
	require.NoError(t, err, "stderr: %s", stderr.String())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = c.Close() })
	return c, stderr
}

// startClientIn starts `pynox pool args...` in dir as a jsonl.Client.
func startClientIn(t *testing.T, dir string, args ...string) (*jsonl.Client, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(pynoxBinary(t), append([]string{"pool"}, args...)...)
	cmd.Dir = dir
	return startClientCmd(t, cmd)
}

// runJob runs one job through c with a generous deadline.
func runJob(t *testing.T, c *jsonl.Client, job pynox.Job) *pynox.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := c.Run(ctx, job)
	require.NoError(t, err)
	return r
}

func (p *poolProc) send(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(p.stdin, line+"\n")
	require.NoError(t, err)
}

func (p *poolProc) next(t *testing.T) map[string]any {
	t.Helper()
	require.True(t, p.out.Scan(), "no more output; stderr: %s", p.stderr.String())
	var m map[string]any
	require.NoError(t, json.Unmarshal(p.out.Bytes(), &m))
	return m
}

func TestPoolEOFDrainsAndExitsZero(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := startPool(t, "--workers=2")
	p.send(t, `{"id": "a", "code": "import time; time.sleep(0.3); print('a')"}`)
	p.send(t, `{"id": "b", "code": "print('b')"}`)
	p.send(t, `{"id": "c", "code": "raise SystemExit(3)"}`)
	require.NoError(t, p.stdin.Close())
	got := map[string]map[string]any{}
	for i := 0; i < 3; i++ {
		r := p.next(t)
		got[r["id"].(string)] = r
	}
	require.Equal(t, "a\n", got["a"]["stdout"])
	require.Equal(t, "b\n", got["b"]["stdout"])
	require.Equal(t, float64(3), got["c"]["exit"])
	require.False(t, p.out.Scan())
	require.NoError(t, p.cmd.Wait(), "the pool's own exit status is 0 after EOF; stderr: %s", p.stderr.String())
}

func TestPoolSIGTERMDrains(t *testing.T) {
	p := startPool(t, "--workers=1")
	p.send(t, `{"id": "slow", "code": "import time; time.sleep(0.5); print('done')"}`)
	time.Sleep(150 * time.Millisecond)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	r := p.next(t)
	require.Equal(t, "done\n", r["stdout"])
	require.NoError(t, p.cmd.Wait())
}

// descendants lists the processes below pid, by walking /proc.
func descendants(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		id, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		ppid, _ := strconv.Atoi(fields[1])
		children[ppid] = append(children[ppid], id)
	}
	var out []int
	var walk func(int)
	walk = func(p int) {
		for _, c := range children[p] {
			out = append(out, c)
			walk(c)
		}
	}
	walk(pid)
	return out
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+2:])[0] != "Z"
}

func TestPoolSIGKILLLeavesNoProcess(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := startPool(t, "--workers=2")
	// Two jobs running (one spinning, one sleeping) so that templates and
	// running jobs exist at the moment of the kill (a worker forks its next
	// spare only when its job is over).
	p.send(t, `{"id": "spin", "code": "print('up', flush=True)\nwhile True: pass"}`)
	p.send(t, `{"id": "sleep", "code": "import time; print('up', flush=True); time.sleep(60)"}`)
	// And a session: its process, forked from a template and stopped
	// between steps (it waits for no worker).
	p.send(t, `{"id": "s", "session": "nb", "code": "x = 1"}`)
	deadline := time.Now().Add(10 * time.Second)
	var procs []int
	for time.Now().Before(deadline) {
		procs = descendants(p.cmd.Process.Pid)
		// 2 templates, 2 running jobs, the session's process.
		if len(procs) >= 5 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.GreaterOrEqual(t, len(procs), 5, "expected templates, jobs and a session under the pool")
	require.NoError(t, p.cmd.Process.Kill())
	_ = p.cmd.Wait()
	deadline = time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		left := 0
		for _, pid := range procs {
			if alive(pid) {
				left++
			}
		}
		if left == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, pid := range procs {
		require.False(t, alive(pid), "process %d outlived the SIGKILLed pool", pid)
	}
}

// TestPoolSIGKILLLeavesNoCgroup: a pool killed with SIGKILL cannot remove
// its cgroups; the next pool removes them, and only them.
func TestPoolSIGKILLLeavesNoCgroup(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	l := cgroup.Probe()
	if l.Backend == cgroup.None || os.Geteuid() != 0 {
		t.Skipf("no per-job cgroups for this process: %s", l.Reason)
	}
	owns := l.Dirs()
	ours := func(pid int) []string {
		var dirs []string
		for _, own := range owns {
			m, _ := filepath.Glob(filepath.Join(own, fmt.Sprintf("pynox-%d-*", pid)))
			dirs = append(dirs, m...)
		}
		return dirs
	}
	p := startPool(t, "--workers=1", "--cgroups=require")
	require.Equal(t, l.Backend, p.ready["cgroups"])
	p.send(t, `{"id": "sleep", "code": "import time; print('up', flush=True); time.sleep(60)"}`)
	pid := p.cmd.Process.Pid
	require.Eventually(t, func() bool { return len(descendants(pid)) >= 2 }, 10*time.Second, 10*time.Millisecond)
	procs := descendants(pid)
	left := ours(pid)
	require.Len(t, left, len(owns), "one directory per hierarchy")
	require.NoError(t, p.cmd.Process.Kill())
	_ = p.cmd.Wait()
	require.Eventually(t, func() bool {
		for _, c := range procs {
			if alive(c) {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond)
	// A killed pool cannot remove its cgroups; any pool that starts next
	// (this test's, or one of another test process running meanwhile:
	// `go test ./...` runs packages at once) removes them.
	p2 := startPool(t, "--workers=1", "--cgroups=require")
	for _, d := range left {
		require.NoDirExists(t, d, "the next pool removes a dead pool's cgroups")
	}
	require.Len(t, ours(p2.cmd.Process.Pid), len(owns), "the new pool's own are in place")
	// A pool that ends normally (EOF) removes its own.
	p2.send(t, `{"id": 1, "code": "print(1)"}`)
	require.Equal(t, float64(0), p2.next(t)["exit"])
	require.NoError(t, p2.stdin.Close())
	require.NoError(t, p2.cmd.Wait())
	require.Empty(t, ours(p2.cmd.Process.Pid), "a closed pool leaves no cgroup")
}

func TestPoolBadArguments(t *testing.T) {
	var out, errb strings.Builder
	require.Equal(t, 2, run(nil, strings.NewReader(""), &out, &errb))
	require.Equal(t, 2, run([]string{"pool", "--workers=x"}, strings.NewReader(""), &out, &errb))
	require.Equal(t, 2, run([]string{"frobnicate"}, strings.NewReader(""), &out, &errb))
	errb.Reset()
	require.Equal(t, 2, run([]string{"pool", "--cgroups=maybe"}, strings.NewReader(""), &out, &errb))
	require.Contains(t, errb.String(), `--cgroups=maybe: expected "auto", "require" or "off"`)
	errb.Reset()
	require.Equal(t, 1, run([]string{"pool", "--python=/nonexistent/python3"}, strings.NewReader(""), &out, &errb))
	require.Contains(t, errb.String(), "--python=/nonexistent/python3: does not exist; expected the path or command name of a CPython 3 interpreter")
}

func TestPoolConfigFileAndJSONLog(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	dir := t.TempDir()
	for _, d := range []string{"etc", "data", "work"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o755))
	}
	cfgPath := filepath.Join(dir, "etc", "pynox.toml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(`
[pool]
workers = 3
log = "json"

[pool.limits]
allow_read = ["../data"]
allow_write = ["../work"]
timeout = "5s"

[profiles.zeta]
allow_read = ["../data"]

[profiles.analysis]
allow_write = ["../work"]
`), 0o644))
	p := startPoolIn(t, dir, "--config="+cfgPath, "--workers=1")
	require.Equal(t, cfgPath, p.ready["config"])
	require.Equal(t, []any{"analysis", "zeta"}, p.ready["profiles"])
	require.Equal(t, float64(1), p.ready["workers"], "the command line overrides [pool]")

	p.send(t, `{"id": "w", "profile": "analysis", "code": "open('`+filepath.Join(dir, "work", "x")+`', 'w').write('secret output'); print('secret output')"}`)
	p.send(t, `{"id": 7, "code": "open('/etc/passwd')"}`)
	require.NoError(t, p.stdin.Close())
	got := map[string]map[string]any{}
	for i := 0; i < 2; i++ {
		r := p.next(t)
		got[fmt.Sprint(r["id"])] = r
	}
	require.Nil(t, got["w"]["error"], "%v", got["w"])
	require.NoError(t, p.cmd.Wait())

	// One JSON log line per job on stderr, with exactly the protocol's
	// fields and never the captured output.
	var logLines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(p.stderr.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m["event"] == "job" {
			logLines = append(logLines, m)
		}
	}
	require.Len(t, logLines, 2, p.stderr.String())
	require.NotContains(t, p.stderr.String(), "secret output")
	byID := map[string]map[string]any{}
	for _, l := range logLines {
		keys := make([]string, 0, len(l))
		for k := range l {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		require.Equal(t, []string{"cpu_ms", "duration_ms", "error", "event", "exit", "id", "message", "network", "queue_us", "session", "step", "truncated", "ts_ms"}, keys)
		byID[fmt.Sprint(l["id"])] = l
	}
	require.Nil(t, byID["w"]["error"])
	require.Equal(t, float64(0), byID["w"]["exit"])
	require.Equal(t, "PermissionError", byID["7"]["error"])
	require.Contains(t, byID["7"]["message"], "Permission denied")
	require.Equal(t, "deny", byID["7"]["network"])
	require.Nil(t, byID["7"]["session"])
}

func TestPoolRefusesConfigBeneathItsWriteGrant(t *testing.T) {
	t.Parallel()
	bin := pynoxBinary(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "pynox.toml")
	require.NoError(t, os.WriteFile(cfgPath, []byte("[pool.limits]\nallow_write = [\".\"]\n"), 0o644))
	cmd := exec.Command(bin, "pool", "--config="+cfgPath)
	cmd.Dir = dir
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.Error(t, err)
	require.Empty(t, stdout.String(), "no ready line")
	require.Contains(t, stderr.String(), "beneath its own write ceiling")

	bad := filepath.Join(dir, "bad.toml")
	require.NoError(t, os.WriteFile(bad, []byte("[pool]\nworkrs = 2\n"), 0o644))
	cmd = exec.Command(bin, "pool", "--config="+bad)
	stderr.Reset()
	cmd.Stderr = &stderr
	require.Error(t, cmd.Run())
	require.Contains(t, stderr.String(), bad+":2: unknown key pool.workrs")
}

// The README's first command: the pool over the sample request file.
func TestExamplesRequestsFile(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	bin := pynoxBinary(t)
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	in, err := os.Open(filepath.Join(root, "examples", "requests.jsonl"))
	require.NoError(t, err)
	defer in.Close()
	cmd := exec.Command(bin, "pool")
	cmd.Dir = root
	cmd.Stdin = in
	out, err := cmd.Output()
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	got := map[string]map[string]any{}
	for _, l := range lines[1:] {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		got[fmt.Sprint(m["id"])] = m
	}
	require.Len(t, got, 10)
	require.Equal(t, "hello from a confined CPython\n", got["hello"]["stdout"])
	require.Equal(t, "{'apple': 7, 'pear': 5}\n", got["csv"]["stdout"])
	errType := func(id string) string { return got[id]["error"].(map[string]any)["type"].(string) }
	require.Equal(t, "PermissionError", errType("denied"))
	require.Equal(t, "PermissionError", errType("no-fork"))
	require.Equal(t, "TimeoutError", errType("timeout"))
	require.Equal(t, "RequestError", errType("bad"))
	require.Equal(t, "stats", got["stats"]["event"])
	require.Nil(t, got["nb-1"]["error"], "%v", got["nb-1"])
	require.Equal(t, "3 rows kept between steps\n", got["nb-2"]["stdout"], "%v", got["nb-2"])
	require.Equal(t, float64(2), got["nb-2"]["step"])
	require.Equal(t, true, got["nb-3"]["closed"])
}

func TestExamplesConfigAndPythonClient(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	bin := pynoxBinary(t)
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	p := startPoolIn(t, root, "--config=examples/pynox.toml")
	require.Equal(t, []any{"analysis", "quick"}, p.ready["profiles"])
	p.send(t, `{"id": 1, "profile": "analysis", "code": "import os; print(os.listdir('examples/data'))"}`)
	r := p.next(t)
	require.Equal(t, "['orders.csv']\n", r["stdout"], "%v", r)
	require.NoError(t, p.stdin.Close())
	require.NoError(t, p.cmd.Wait())

	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 to run the example client")
	}
	cmd := exec.Command(python, filepath.Join(root, "examples", "agent_tool.py"), bin)
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "jobs=11 ok=9 failed=2")
	require.Contains(t, string(out), "denied: PermissionError")
	require.Contains(t, string(out), "host call: ['pynox result 0', 'pynox result 1']\n")
	require.Contains(t, string(out), "session: 42\n")
	// One event a line when the machine is quiet (the job sleeps 0.1 s
	// between them); on a loaded machine the pool may read two lines at
	// once (small writes are coalesced: docs/protocol.md), never lose one.
	require.Regexp(t, `streamed stdout: step 0\n(streamed stdout: )?step 1\n(streamed stdout: )?step 2\n`, string(out))
	require.Contains(t, string(out), "interrupted: KeyboardInterrupt - total is 42\n")
	require.Contains(t, string(out), "cancelled: CancelledError\n")
	require.Contains(t, string(out), "['sessions result 0']\n")
	require.Contains(t, string(out), "3 orders\n")
	require.Contains(t, string(out), "search(query: str, limit: int = 3) -> list: Searches the documentation")
}
