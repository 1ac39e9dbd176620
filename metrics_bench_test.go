package pynox

import "testing"

// BenchmarkStatsRecord measures what the pool adds per answered request
// for its counters (Stats and the Prometheus collector read the same
// ones): no timing is asserted; allocs/op must stay 0.
func BenchmarkStatsRecord(b *testing.B) {
	var c statsCounters
	ok := &Result{DurationMS: 3, DurationUS: 2900, QueueUS: 40, Usage: &Usage{CPUMS: 2.5}, kind: KindRuntime}
	failed := &Result{Exit: 1, DurationUS: 1200, Error: &ErrorInfo{Type: "ZeroDivisionError"}, kind: KindRuntime}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%8 == 0 {
			c.record(failed)
		} else {
			c.record(ok)
		}
	}
}
