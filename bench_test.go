package pynox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Benchmarks of the Go API: each op is one job, from Pool.Run to its
// Result, under the real sandbox with the real interpreter. They report
// ns/op and, as job-us/op, the mean of the pool's own DurationUS (hand-over
// to the child until its result), so the gap between the two is the
// pool's overhead around the child. No timing is asserted; a job that
// fails stops the benchmark.
//
//	go test -run XXX -bench . -benchtime 200x .
//
// cmd/pynox-bench measures the same through the JSONL CLI and against a
// naive fork-per-request server and cold interpreters.

const (
	benchTrivialCode = "print(sum(range(100)))"
	benchTrivialOut  = "4950\n"
	benchPandasCode  = "import pandas as pd; print(pd.DataFrame({'a':[1,2]}).a.sum())"
	benchPandasOut   = "3\n"
)

// benchJob runs one job, failing the benchmark unless it printed want.
// It returns the job's own duration in microseconds.
func benchJob(b *testing.B, p *Pool, job Job, want string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := p.Run(ctx, job)
	if err != nil {
		b.Fatalf("Run: %v", err)
	}
	if res.Error != nil || res.Exit != 0 || res.Stdout != want {
		b.Fatalf("job failed: exit %d error %+v stdout %q stderr %q", res.Exit, res.Error, res.Stdout, res.Stderr)
	}
	return res.DurationUS
}

// benchWarm runs a few unmeasured jobs so that the first measured one does
// not pay for cold caches.
func benchWarm(b *testing.B, p *Pool, job Job, want string) {
	for range 5 {
		benchJob(b, p, job, want)
	}
}

// benchSequential runs b.N jobs one after another.
func benchSequential(b *testing.B, p *Pool, job Job, want string) {
	benchWarm(b, p, job, want)
	var total int64
	n := 0
	for b.Loop() {
		total += benchJob(b, p, job, want)
		n++
	}
	if n > 0 {
		b.ReportMetric(float64(total)/float64(n), "job-us/op")
	}
}

// BenchmarkRunTrivial measures sequential Pool.Run of a trivial job: one
// job outstanding at a time, so each one finds the spare its predecessor
// left forking (with no think time, it may still be forking).
func BenchmarkRunTrivial(b *testing.B) {
	p := newTestPool(b, Config{Workers: 2})
	benchSequential(b, p, Job{Code: benchTrivialCode}, benchTrivialOut)
}

// BenchmarkRunParallel measures throughput with 2 workers: b.RunParallel
// keeps GOMAXPROCS goroutines (on a 2-core machine, one per worker)
// calling Pool.Run; ns/op is wall time per job.
func BenchmarkRunParallel(b *testing.B) {
	p := newTestPool(b, Config{Workers: 2})
	job := Job{Code: benchTrivialCode}
	benchWarm(b, p, job, benchTrivialOut)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			benchJob(b, p, job, benchTrivialOut)
		}
	})
}

// BenchmarkRunWithGrants measures the trivial job with one allow_read and
// one allow_write directory: the grants are opened and checked by the
// pool, passed to the child as descriptors and added to its Landlock
// ruleset. The difference from BenchmarkRunTrivial is their cost.
func BenchmarkRunWithGrants(b *testing.B) {
	dir := b.TempDir()
	for _, d := range []string{"in", "out"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	p := newTestPool(b, Config{Workers: 2, Dir: dir})
	job := Job{Code: benchTrivialCode, AllowRead: []string{"in"}, AllowWrite: []string{"out"}}
	benchSequential(b, p, job, benchTrivialOut)
}

// BenchmarkRunPandas measures a small pandas job sequentially in a pool
// whose templates preloaded pandas.
func BenchmarkRunPandas(b *testing.B) {
	const py = "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		b.Skipf("Debian's %s is not installed, so pandas cannot be preloaded", py)
	}
	if out, err := exec.Command(py, "-c", "import pandas").CombinedOutput(); err != nil {
		b.Skipf("pandas is not importable by %s (apt-get install python3-pandas): %v %s", py, err, out)
	}
	p := newTestPool(b, Config{Workers: 2, Python: py, Preload: []string{"pandas"}})
	benchSequential(b, p, Job{Code: benchPandasCode}, benchPandasOut)
}

// BenchmarkCheckoutFeed measures sequential steps of one session through
// Checkout.Feed: no fork, no confinement; the step's code runs in the
// session's live process.
func BenchmarkCheckoutFeed(b *testing.B) {
	p := newTestPool(b, Config{Workers: 1})
	ctx := context.Background()
	co := checkout(b, p, Job{})
	step := func() int64 {
		ev, err := co.Feed(ctx, Step{Code: benchTrivialCode})
		if err != nil {
			b.Fatalf("Feed: %v", err)
		}
		r := ev.Result
		if r == nil || r.Error != nil || r.Stdout != benchTrivialOut {
			b.Fatalf("step failed: %+v", r)
		}
		return r.DurationUS
	}
	for range 5 {
		step()
	}
	var total int64
	n := 0
	for b.Loop() {
		total += step()
		n++
	}
	b.ReportMetric(float64(total)/float64(n), "step-us/op")
}

// BenchmarkHostCall measures host-function calls: session steps make
// b.N calls, each answered by a Host function in this process, up to the
// 1,000 a step may make; ns/op is the round trip of one call (sandbox to
// Go and back), the steps' own overhead spread over them.
func BenchmarkHostCall(b *testing.B) {
	p := newTestPool(b, Config{Workers: 1})
	ctx := context.Background()
	host := func(ctx context.Context, c *Call) (any, error) {
		return json.RawMessage(c.Args[1 : len(c.Args)-1]), nil
	}
	co := checkout(b, p, Job{Functions: []string{"f"}, Host: host})
	if ev, err := co.Feed(ctx, Step{Code: "from pynox_host import f\nprint(f(1))"}); err != nil || ev.Result.Stdout != "1\n" {
		b.Fatalf("warm-up: %v %+v", err, ev.Result)
	}
	b.ResetTimer()
	for left := b.N; left > 0; {
		n := min(left, MaxCalls)
		left -= n
		ev, err := co.Feed(ctx, Step{Code: fmt.Sprintf("x = 0\nfor i in range(%d):\n    x = f(x) + 1\nprint(x)", n)})
		if err != nil || ev.Result.Error != nil || ev.Result.Stdout != fmt.Sprintf("%d\n", n) {
			b.Fatalf("calls failed: %v %+v", err, ev.Result)
		}
	}
}
