package main

// Benchmarks of a session step and of a host call through `pynox pool`'s
// JSON Lines, as a client sees them (issue 12's session targets). The
// client is as thin as a client can be: one goroutine on a locked thread
// writes each line with one write(2) and reads the answer with read(2),
// so the figures are the pool's. Its reads and writes are raw system
// calls (a blocking read holds the benchmark's P, which it does not need
// meanwhile): through syscall.Syscall each one woke the test process's
// own monitor thread.
//
//	go test -run '^$' -bench 'PoolSessionStep|PoolHostCall' -benchtime 2000x ./cmd/pynox
//
// PYNOX_BENCH_BIN names another build of the command to measure (to
// alternate runs of two builds).
//
// Besides ns/op each reports, per step or call, the CPU the pool's whole
// process tree used (cpu-us/op, from the tasks' schedstat), its context
// switches (ctxsw/op: voluntary and not, every thread of the pool, its
// templates and the session's process) and, for steps, the pool's own
// duration_us (srv-us/op).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/jsonl"
)

// benchPython is the interpreter of the benchmarks: Debian's, not a pyenv
// shim whose .pth hooks cost per job.
const benchPython = "/usr/bin/python3"

// rawPool is a `pynox pool` driven through raw descriptors.
type rawPool struct {
	cmd  *exec.Cmd
	in   int // the pool's stdin, our write end
	out  int // the pool's stdout, our read end
	buf  []byte
	line []byte
}

func startRawPool(b *testing.B, args ...string) *rawPool {
	b.Helper()
	if _, err := sandbox.ABI(); err != nil {
		b.Skipf("kernel lacks Landlock: %v", err)
	}
	if _, err := os.Stat(benchPython); err != nil {
		b.Skipf("%s is not installed", benchPython)
	}
	bin := os.Getenv("PYNOX_BENCH_BIN") // another build to compare, or this package's
	if bin == "" {
		buildOnce.Do(buildBinary)
		if buildErr != nil {
			b.Fatal(buildErr)
		}
		bin = binPath
	}
	var inp, outp [2]int
	if err := unix.Pipe2(inp[:], unix.O_CLOEXEC); err != nil {
		b.Fatal(err)
	}
	if err := unix.Pipe2(outp[:], unix.O_CLOEXEC); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"pool", "--python=" + benchPython}, args...)...)
	cmd.Dir = b.TempDir()
	cmd.Stdin = os.NewFile(uintptr(inp[0]), "stdin")
	cmd.Stdout = os.NewFile(uintptr(outp[1]), "stdout")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	unix.Close(inp[0])
	unix.Close(outp[1])
	p := &rawPool{cmd: cmd, in: inp[1], out: outp[0], buf: make([]byte, 0, 64<<10)}
	b.Cleanup(func() {
		unix.Close(p.in)
		cmd.Wait()
		unix.Close(p.out)
	})
	if ev := p.next(b); !bytes.Contains(ev, []byte(`"event":"ready"`)) {
		b.Fatalf("no ready line: %s", ev)
	}
	return p
}

// send writes one request line.
func (p *rawPool) send(b *testing.B, line []byte) {
	for len(line) > 0 {
		n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(p.in), uintptr(unsafe.Pointer(&line[0])), uintptr(len(line)))
		if e != 0 {
			b.Fatalf("write: %v", e)
		}
		line = line[n:]
	}
}

// next reads one answer line (without its newline); it stays valid until
// the next call.
func (p *rawPool) next(b *testing.B) []byte {
	if p.line != nil {
		p.buf = append(p.buf[:0], p.line...)
		p.line = nil
	}
	for {
		if i := bytes.IndexByte(p.buf, '\n'); i >= 0 {
			l := p.buf[:i]
			p.line = p.buf[i+1:]
			return l
		}
		if len(p.buf) == cap(p.buf) {
			p.buf = append(p.buf, make([]byte, len(p.buf))...)[:len(p.buf)]
		}
		free := p.buf[len(p.buf):cap(p.buf)]
		n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(p.out), uintptr(unsafe.Pointer(&free[0])), uintptr(len(free)))
		if e == unix.EINTR {
			continue
		}
		if e != 0 || n == 0 {
			b.Fatalf("the pool's stdout ended: %v", e)
		}
		p.buf = p.buf[:len(p.buf)+int(n)]
	}
}

// treeCounters are the CPU time and context switches of a process tree.
type treeCounters struct {
	cpuNS int64
	ctxsw int64
	tasks int
	// per task ("pid/tid comm"): CPU ns and context switches, for
	// PYNOX_BENCH_TASKS=1
	each map[string][2]int64
}

// poolTree sums the counters of every task of pid and its descendants.
func poolTree(pid int) treeCounters {
	ents, _ := os.ReadDir("/proc")
	children := map[int][]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(st, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(st[i+1:]))
		if len(f) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		children[pp] = append(children[pp], p)
	}
	c := treeCounters{each: map[string][2]int64{}}
	var walk func(int)
	walk = func(p int) {
		dir := "/proc/" + strconv.Itoa(p) + "/task"
		tasks, _ := os.ReadDir(dir)
		for _, t := range tasks {
			c.tasks++
			comm, _ := os.ReadFile(filepath.Join(dir, t.Name(), "comm"))
			key := fmt.Sprintf("%d/%s %s", p, t.Name(), strings.TrimSpace(string(comm)))
			var cpu, sw int64
			if ss, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat")); err == nil {
				if f := strings.Fields(string(ss)); len(f) > 0 {
					cpu, _ = strconv.ParseInt(f[0], 10, 64)
				}
			}
			if st, err := os.ReadFile(filepath.Join(dir, t.Name(), "status")); err == nil {
				for _, l := range strings.Split(string(st), "\n") {
					if f := strings.Fields(l); len(f) == 2 && strings.HasSuffix(f[0], "ctxt_switches:") {
						v, _ := strconv.ParseInt(f[1], 10, 64)
						sw += v
					}
				}
			}
			c.cpuNS += cpu
			c.ctxsw += sw
			c.each[key] = [2]int64{cpu, sw}
		}
		for _, k := range children[p] {
			walk(k)
		}
	}
	walk(pid)
	return c
}

// report adds the per-op tree counters to b.
func reportTree(b *testing.B, before, after treeCounters, n int) {
	if n == 0 {
		return
	}
	b.ReportMetric(float64(after.cpuNS-before.cpuNS)/1e3/float64(n), "cpu-us/op")
	b.ReportMetric(float64(after.ctxsw-before.ctxsw)/float64(n), "ctxsw/op")
	if os.Getenv("PYNOX_BENCH_TASKS") != "" {
		for k, v := range after.each {
			w := before.each[k]
			if d := v[1] - w[1]; d > 0 {
				b.Logf("%-40s cpu %7.1f us/op  ctxsw %5.2f/op", k, float64(v[0]-w[0])/1e3/float64(n), float64(d)/float64(n))
			}
		}
	}
}

// BenchmarkPoolSessionStep measures a trivial step of a live session,
// back to back: the client writes the step's line and reads its result.
func BenchmarkPoolSessionStep(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p := startRawPool(b, "--workers=2")
	step := func(i int) int64 {
		p.send(b, fmt.Appendf(nil, `{"id":%d,"session":"b","code":"print(sum(range(100)))"}`+"\n", i))
		l := p.next(b)
		var r struct {
			ID         int    `json:"id"`
			Stdout     string `json:"stdout"`
			DurationUS int64  `json:"duration_us"`
		}
		if err := json.Unmarshal(l, &r); err != nil || r.ID != i || r.Stdout != "4950\n" {
			b.Fatalf("step %d: %s (%v)", i, l, err)
		}
		return r.DurationUS
	}
	for i := range 20 {
		step(-1 - i)
	}
	pid := p.cmd.Process.Pid
	before := poolTree(pid)
	var srv int64
	n := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		srv += step(i)
		n++
	}
	b.StopTimer()
	reportTree(b, before, poolTree(pid), n)
	b.ReportMetric(float64(srv)/float64(n), "srv-us/op")
}

// BenchmarkPoolHostCall measures a host call's round trip as the client
// sees it: from writing the reply to one call until the next call's line
// has arrived (rtt-us/op). The calls are made by steps of one session, at
// most hostCallsPerStep each (a job's MaxCalls is 1,000); the first call
// of each step is not timed, and the counters include the steps' own
// cost spread over their calls.
func BenchmarkPoolHostCall(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p := startRawPool(b, "--workers=2")
	var call struct {
		Event string `json:"event"`
		ID    int64  `json:"call_id"`
		Args  []int  `json:"args"`
	}
	id := 0
	// calls runs one step that makes n calls, and returns the time from
	// each reply to the next call, summed (n-1 round trips).
	calls := func(n int) time.Duration {
		id++
		code := fmt.Sprintf("from pynox_host import f\\nx = 0\\nfor i in range(%d):\\n    x = f(x)\\nprint(x)", n)
		perms := ""
		if id == 1 {
			perms = `"functions":["f"],` // the creating step's only
		}
		p.send(b, fmt.Appendf(nil, `{"id":%d,"session":"h",%s"code":"%s"}`+"\n", id, perms, code))
		var sum time.Duration
		var sent time.Time
		for i := range n {
			l := p.next(b)
			if i > 0 {
				sum += time.Since(sent)
			}
			call.Event = ""
			if err := json.Unmarshal(l, &call); err != nil || call.Event != "call" || len(call.Args) != 1 {
				b.Fatalf("not a call: %s (%v)", l, err)
			}
			reply := fmt.Appendf(nil, `{"id":%d,"reply":{"call_id":%d,"result":%d}}`+"\n", call.ID, call.ID, call.Args[0]+1)
			sent = time.Now()
			p.send(b, reply)
		}
		if l := p.next(b); !bytes.Contains(l, []byte(fmt.Sprintf(`"stdout":"%d\n"`, n))) {
			b.Fatalf("step's result: %s", l)
		}
		return sum
	}
	calls(20)
	calls(20)
	pid := p.cmd.Process.Pid
	before := poolTree(pid)
	var rtt time.Duration
	timed := 0
	b.ResetTimer()
	for left := b.N; left > 0; {
		n := min(left+1, hostCallsPerStep)
		rtt += calls(n)
		timed += n - 1
		left -= n - 1
	}
	b.StopTimer()
	reportTree(b, before, poolTree(pid), timed)
	b.ReportMetric(float64(rtt.Microseconds())/float64(timed), "rtt-us/op")
}

// hostCallsPerStep is how many calls one step of BenchmarkPoolHostCall
// makes.
const hostCallsPerStep = 900

// BenchmarkClientHostCall measures a host call's round trip through
// jsonl.Client, as pynox-bench's host-call row does: from the return of
// the client's host function for one call until the next call reaches
// it (rtt-us/op). Each step makes at most hostCallsPerStep calls.
func BenchmarkClientHostCall(b *testing.B) {
	if _, err := sandbox.ABI(); err != nil {
		b.Skipf("kernel lacks Landlock: %v", err)
	}
	bin := os.Getenv("PYNOX_BENCH_BIN")
	if bin == "" {
		buildOnce.Do(buildBinary)
		if buildErr != nil {
			b.Fatal(buildErr)
		}
		bin = binPath
	}
	cmd := exec.Command(bin, "pool", "--python="+benchPython, "--workers=2")
	cmd.Dir = b.TempDir()
	cmd.Stderr = os.Stderr
	c, err := jsonl.StartCmd(cmd)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var rtt time.Duration
	timed := 0
	var sent time.Time
	first := true
	host := func(_ context.Context, call *pynox.Call) (any, error) {
		if !first {
			rtt += time.Since(sent)
			timed++
		}
		first = false
		var args []int
		if err := json.Unmarshal(call.Args, &args); err != nil || len(args) != 1 {
			return nil, fmt.Errorf("call args %s", call.Args)
		}
		sent = time.Now()
		return args[0] + 1, nil
	}
	sess := c.Session("h", pynox.Job{Functions: []string{"f"}, Host: host})
	steps := func(n int) {
		for left := n; left > 0; {
			k := min(left, hostCallsPerStep)
			first = true
			code := fmt.Sprintf("from pynox_host import f\nx = 0\nfor i in range(%d):\n    x = f(x)\nprint(x)", k)
			r, err := sess.Run(context.Background(), pynox.Step{Code: code})
			if err != nil || r.Stdout != fmt.Sprintf("%d\n", k) {
				b.Fatalf("step: %v %+v", err, r)
			}
			left -= k
		}
	}
	steps(20)
	rtt, timed = 0, 0
	before := poolTree(os.Getpid()) // the client's process and the pool's tree
	b.ResetTimer()
	steps(b.N)
	b.StopTimer()
	reportTree(b, before, poolTree(os.Getpid()), b.N)
	if timed > 0 {
		b.ReportMetric(float64(rtt.Microseconds())/float64(timed), "rtt-us/op")
	}
}
