package worker

import (
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkTakeNSToReady measures the time from a TakeNS call to a child
// that answers its job frame: each iteration takes a process for a job
// with a mount namespace and hands it a job frame without one, which it
// refuses (a setup_error frame) as soon as it has prepared and read the
// frame; the clock stops when that answer is readable. Between
// iterations the timer stops for 10 ms of think time, in which a
// template that keeps a ready ns spare forks the next one; one that
// forks a process per TakeNS forks it on the clock.
//
//	go test -run XXX -bench TakeNSToReady -benchtime 200x ./internal/worker
func BenchmarkTakeNSToReady(b *testing.B) {
	tpl := startTestTemplate(b, false)
	frame, err := marshalFrame(&jobFrame{T: "job", Code: "pass", Name: "<code>", Rules: []uint64{}, Step: 1,
		Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10}})
	if err != nil {
		b.Fatal(err)
	}
	once := func() time.Duration {
		start := time.Now()
		c, err := tpl.TakeNS(false, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if err := c.sendRaw(frame, nil); err != nil {
			b.Fatal(err)
		}
		fds := []unix.PollFd{{Fd: int32(c.ctlFd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 60000); n != 1 || err != nil {
			b.Fatalf("no answer: %d %v", n, err)
		}
		return time.Since(start)
	}
	once() // the first TakeNS asks for the template's first ns spare
	var total time.Duration
	took := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		time.Sleep(10 * time.Millisecond)
		b.StartTimer()
		d := once()
		total += d
		took = append(took, d)
	}
	slices.Sort(took)
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "ready-us/op")
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-us")
}
