package main

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// monitorSlack is the timer slack `pynox pool` gives the Go runtime's
// monitor thread (sysmon). While any P runs, the monitor sleeps 20 µs
// between its passes (retaking Ps from threads blocked in system calls,
// preempting long-running goroutines), which the kernel's default slack
// of 50 µs turns into a wake-up every 70 µs or so: two context switches
// each, several per job, and each burst of activity also wakes it from
// its deep sleep. With 500 µs of slack its passes come every half
// millisecond or so while the host is busy. Measured on a 2-vCPU VM with
// two workers (issue 12): context switches per job 16-17 -> 10.6-10.8 and
// host CPU per job 1.11-1.17 -> 0.96-0.98 ms at throughput; 20.4-21.0 ->
// 15.7-15.8 switches per job with 2 ms of think time. The cost: a
// goroutine blocked in a system call (moving a spare into its cgroup, say)
// keeps the one P for up to that much longer before the monitor hands it
// to another thread. Only the monitor gets the slack: a process inherits
// the slack of the thread that forks it, and the templates must keep the
// default (a job's time.sleep would otherwise oversleep).
const monitorSlack = 500 * time.Microsecond

// slowMonitor sets the timer slack of the runtime's monitor thread to d
// (see monitorSlack) and reports whether it did. It changes nothing when
// the monitor cannot be told apart, or when setting another thread's
// slack is not allowed (it needs CAP_SYS_NICE).
func slowMonitor(d time.Duration) bool {
	tid := monitorTID()
	if tid <= 0 {
		return false
	}
	err := os.WriteFile("/proc/"+strconv.Itoa(tid)+"/timerslack_ns", []byte(strconv.FormatInt(d.Nanoseconds(), 10)), 0)
	return err == nil
}

// monitorTID returns the thread id of the runtime's monitor, or 0. The
// runtime starts the monitor before any other thread (it is the first
// thing runtime.main does on the main thread), so it is the second of the
// process's threads in creation order: thread ids are handed out in
// increasing order from the process's own id, modulo pid_max. As a check,
// a thread seen in a system call must be in nanosleep or futex (the two
// ways the monitor sleeps between its passes) or sched_yield; one seen in
// any other is not taken, and 0 is returned. A busy monitor is often
// seen running: after 50 looks 1 ms apart, the creation order alone
// decides.
func monitorTID() int {
	pid := os.Getpid()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	pidMax := 1 << 22
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			pidMax = n
		}
	}
	var tids []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	after := func(tid int) int { return ((tid-pid)%pidMax + pidMax) % pidMax }
	slices.SortFunc(tids, func(a, b int) int { return after(a) - after(b) })
	if len(tids) < 2 || tids[0] != pid || tids[1] == unix.Gettid() {
		return 0
	}
	tid := tids[1]
	for range 50 {
		b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/syscall")
		if err != nil {
			return 0
		}
		nr, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
		if nr == "running" {
			// Between two passes' sleeps, or runnable on a busy machine.
			time.Sleep(time.Millisecond)
			continue
		}
		if n, err := strconv.Atoi(nr); err == nil && (n == unix.SYS_NANOSLEEP || n == unix.SYS_FUTEX || n == unix.SYS_SCHED_YIELD) {
			return tid
		}
		return 0 // in another system call: not the monitor
	}
	return tid // always seen running: the creation order decides
}
