package main

import (
	"os"
	"strconv"
	"strings"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, 100 on
// every Linux architecture).
const userHZ = 100

// cpuTimes is the CPU a server's process tree has used, in seconds, split
// by the part of the tree it ran in: the server process itself (pynox's Go
// host, or the Python loop of the naive server and the limit loop), pynox's
// templates (the server's children, for pynox only), and the processes
// that ran jobs (spares and job children, with their descendants).
// procs is how many processes the tree had at the reading (not carried
// by sub and add).
type cpuTimes struct {
	host, templates, children float64
	procs                     int
}

func (c cpuTimes) total() float64 { return c.host + c.templates + c.children }

func (c cpuTimes) sub(o cpuTimes) cpuTimes {
	return cpuTimes{host: c.host - o.host, templates: c.templates - o.templates, children: c.children - o.children}
}

type procCPU struct {
	ppid        int
	own, reaped float64 // utime+stime; cutime+cstime (reaped descendants)
}

func readProcCPU(pid string) (procCPU, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return procCPU{}, false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procCPU{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return procCPU{}, false
	}
	n := func(k int) float64 { v, _ := strconv.ParseInt(f[k], 10, 64); return float64(v) / userHZ }
	ppid, _ := strconv.Atoi(f[1])
	own := n(11) + n(12)
	if ns := threadsRuntime(pid); ns > 0 {
		own = ns
	}
	return procCPU{ppid: ppid, own: own, reaped: n(13) + n(14)}, true
}

// threadsRuntime is the CPU time, in seconds, the live threads of pid have
// run (the sum of their /proc/<pid>/task/<tid>/schedstat), which has
// nanosecond resolution where /proc/<pid>/stat has ticks; 0 if it cannot be
// read.
func threadsRuntime(pid string) float64 {
	tasks, err := os.ReadDir("/proc/" + pid + "/task")
	if err != nil {
		return 0
	}
	var ns int64
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/" + pid + "/task/" + t.Name() + "/schedstat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) > 0 {
			v, _ := strconv.ParseInt(f[0], 10, 64)
			ns += v
		}
	}
	return float64(ns) / 1e9
}

// treeCPU returns the CPU used so far by root and its descendants. A
// process that has exited and been reaped is counted in its parent's
// cutime/cstime, so the sum over the live tree of each process's own and
// reaped time is all the tree has ever used (less the processes exited but
// not yet reaped at the moment of reading, and the tick rounding of the
// live ones): the difference of two readings is what the tree used in
// between, jobs that came and went included. A live process's own time
// has nanosecond resolution (schedstat); what the tree reaped is in
// ticks of 10 ms. withTemplates says the
// root's children are pynox templates (counted apart) rather than job
// processes.
func treeCPU(root int, withTemplates bool) cpuTimes {
	ents, _ := os.ReadDir("/proc")
	procs := map[int]procCPU{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProcCPU(e.Name()); ok {
			procs[pid] = p
		}
	}
	var c cpuTimes
	add := func(depth int, v float64) {
		switch {
		case depth == 0:
			c.host += v
		case depth == 1 && withTemplates:
			c.templates += v
		default:
			c.children += v
		}
	}
	for pid, p := range procs {
		depth := -1
		for q, d := pid, 0; d < 64; d++ {
			if q == root {
				depth = d
				break
			}
			pq, ok := procs[q]
			if !ok || q <= 1 {
				break
			}
			q = pq.ppid
		}
		if depth < 0 {
			continue
		}
		c.procs++
		add(depth, p.own)
		add(depth+1, p.reaped) // what it reaped ran one level below it
	}
	return c
}
