package pynox

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// BenchmarkRunMountGap measures, in one pool of two workers, the trivial
// job without mounts ("plain") and with one read-only mount at a virtual
// path ("ro-mount"), one job at a time with 2 ms of think time before
// each (off the clock), as pynox-bench's latency rows do: the think time
// lets a template fork its next spare (or ns spare) before the next job
// arrives.
//
//	go test -run XXX -bench RunMountGap -benchtime 300x .
func BenchmarkRunMountGap(b *testing.B) {
	dir := b.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		b.Fatal(err)
	}
	p := newTestPool(b, Config{Workers: 2, Dir: dir})
	if why := p.nsObstacles(); len(why) > 0 {
		b.Skipf("the pool cannot build mount namespaces here: %v", why)
	}
	for _, c := range []struct {
		name string
		job  Job
	}{
		{"plain", Job{Code: benchTrivialCode}},
		{"ro-mount", Job{Code: benchTrivialCode, Mounts: []MountSpec{{HostPath: "data", Path: "/data"}}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			benchWarm(b, p, c.job, benchTrivialOut)
			var total int64
			took := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				time.Sleep(2 * time.Millisecond)
				b.StartTimer()
				start := time.Now()
				total += benchJob(b, p, c.job, benchTrivialOut)
				took = append(took, time.Since(start))
			}
			slices.Sort(took)
			b.ReportMetric(float64(total)/float64(b.N), "job-us/op")
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-us")
		})
	}
}
