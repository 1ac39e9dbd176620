package main

import (
	"os"
	"runtime"
)

// workersPerProc is how many workers one Go P serves in `pynox pool`.
// The Go host spends a fraction of what the Python side does per job
// (about 0.5 ms of CPU against 3 ms on a 2-vCPU machine), and a worker
// keeps at most one CPU busy, so a P per four workers leaves the host
// headroom while sparing it the cost of Ps that mostly sleep: with one
// P instead of two for the default two workers, goroutines that hand a
// job from one to another wake no other thread, and the host's CPU per
// job fell by about a fifth at throughput and a third with think time
// (issue 12).
const workersPerProc = 4

// hostProcs is the GOMAXPROCS for a pool of workers when the runtime's
// own choice (the CPUs this process may use, or its cgroup's CPU limit)
// is def: one P per workersPerProc workers, at least one, never more than
// def.
func hostProcs(workers, def int) int {
	n := (workers + workersPerProc - 1) / workersPerProc
	return max(1, min(n, def))
}

// setHostProcs sets GOMAXPROCS for a pool of workers (see hostProcs),
// unless the GOMAXPROCS environment variable chose it. It returns the
// value in force.
func setHostProcs(workers int) int {
	if os.Getenv("GOMAXPROCS") != "" {
		return runtime.GOMAXPROCS(0)
	}
	n := hostProcs(workers, runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(n)
	return n
}
