package pynox

import "golang.org/x/sys/unix"

// pinPlan returns, per worker, the CPU affinity its templates give
// themselves (Config.PinCPUs): template i gets the i-th CPU, round robin,
// of the CPUs the calling process may run on now. It is all nil when pin
// is false, when that set holds a single CPU (nothing to gain) or cannot
// be read: a CPU outside the process's own set is never named.
func pinPlan(pin bool, workers int) [][]int {
	plan := make([][]int, workers)
	if !pin {
		return plan
	}
	allowed := allowedCPUs()
	if len(allowed) < 2 {
		return plan
	}
	for i := range plan {
		plan[i] = []int{allowed[i%len(allowed)]}
	}
	return plan
}

// allowedCPUs returns the CPUs the calling thread may run on, in
// ascending order, or nil when the kernel does not say.
func allowedCPUs() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}
