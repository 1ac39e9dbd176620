package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pynox/pynox"
	"golang.org/x/sys/unix"
)

type procInfo struct {
	pid, ppid int
	name      string
	depth     int // below the root
	mem       smaps
}

type smaps struct{ rss, pss, uss int64 }

func readSmaps(pid int) (smaps, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return smaps{}, err
	}
	var m smaps
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Rss:":
			m.rss = v
		case "Pss:":
			m.pss = v
		case "Private_Clean:", "Private_Dirty:":
			m.uss += v
		}
	}
	return m, nil
}

// descendants lists root's descendant processes with their memory.
func descendants(root int) []procInfo {
	ents, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	status := map[int]procInfo{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		p := procInfo{pid: pid}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			v = strings.TrimSpace(v)
			switch k {
			case "Name":
				p.name = v
			case "PPid":
				p.ppid, _ = strconv.Atoi(v)
			}
		}
		parent[pid] = p.ppid
		status[pid] = p
	}
	var out []procInfo
	for pid, p := range status {
		d := 0
		for q := pid; q != 0 && q != root && d < 64; q = parent[q] {
			d++
			if parent[q] == root {
				p.depth = d
				break
			}
		}
		if p.depth == 0 {
			continue
		}
		m, err := readSmaps(pid)
		if err != nil {
			continue // gone already
		}
		p.mem = m
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b procInfo) int { return a.pid - b.pid })
	return out
}

func (m *MemRow) set(p procInfo) {
	m.Pid, m.PSSKiB, m.USSKiB, m.RSSKiB = p.pid, p.mem.pss, p.mem.uss, p.mem.rss
}

// memory samples the pool's process tree idle and while a job runs.
// Templates are the pool's children and spares theirs. A job child is
// told from a spare without relying on how far a spare confines itself
// ahead of time: it is one of the spares that existed before the sleeping
// job was sent, and it is the one blocked in a sleep (or, failing that,
// the one whose template has since forked a replacement).
func (s *server) memory(rep *Report, tplID, spareID, jobID, totalID string) error {
	// Let the spares of the last jobs settle.
	time.Sleep(200 * time.Millisecond)
	root := s.cmd.Process.Pid
	var tpl, spare *procInfo
	before := map[int]bool{}
	tree := descendants(root)
	// A template is a child with children of its own (spares): the pool's
	// other children (its mounter, the interpreter probes) have none.
	parents := map[int]bool{}
	for _, p := range tree {
		if p.depth == 2 {
			parents[p.ppid] = true
		}
	}
	for _, p := range tree {
		switch {
		case p.depth == 1 && tpl == nil && parents[p.pid]:
			tpl = &p
		case p.depth == 2:
			before[p.pid] = true
			if spare == nil {
				spare = &p
			}
		}
	}
	if tpl == nil || spare == nil {
		var tree []string
		for _, p := range descendants(root) {
			tree = append(tree, fmt.Sprintf("pid %d ppid %d depth %d %s", p.pid, p.ppid, p.depth, p.name))
		}
		return fmt.Errorf("%s: could not find an idle template and its spare below pid %d; its descendants: %s", s.name, root, strings.Join(tree, "; "))
	}
	rep.mem(tplID).set(*tpl)
	rep.mem(spareID).set(*spare)

	job := s.start(sleepingCode)
	found := false
	deadline := time.Now().Add(900 * time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	for !found && time.Now().Before(deadline) {
		tree := descendants(root)
		if job := findJobChild(tree, before); job != nil {
			rep.mem(jobID).set(*job)
			found = true
			var total procInfo
			total.pid = root
			if m, err := readSmaps(root); err == nil {
				total.mem = m
			}
			for _, p := range tree {
				total.mem.pss += p.mem.pss
				total.mem.uss += p.mem.uss
				total.mem.rss += p.mem.rss
			}
			rep.mem(totalID).set(total)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := <-job; err != nil {
		return err
	}
	if !found {
		rep.mem(jobID).Skipped = "the running job child was not found"
		rep.mem(totalID).Skipped = "the running job child was not found"
	}
	return nil
}

// findJobChild picks the running job child out of a pool's tree: a
// grandchild that was a spare before the job was sent (before) and is now
// asleep, or else whose template has forked a newer child since.
func findJobChild(tree []procInfo, before map[int]bool) *procInfo {
	var cands []procInfo
	for _, p := range tree {
		if p.depth == 2 && before[p.pid] {
			cands = append(cands, p)
		}
	}
	for _, p := range cands {
		if sleepingSyscalls[currentSyscall(p.pid)] {
			return &p
		}
	}
	var found []procInfo
	for _, p := range cands {
		for _, q := range tree {
			if q.depth == 2 && q.ppid == p.ppid && !before[q.pid] {
				found = append(found, p)
				break
			}
		}
	}
	if len(found) == 1 {
		return &found[0]
	}
	return nil
}

// sleepingSyscalls are the calls time.sleep blocks in.
var sleepingSyscalls = map[int]bool{
	unix.SYS_CLOCK_NANOSLEEP: true, unix.SYS_NANOSLEEP: true, unix.SYS_PSELECT6: true, unix.SYS_PPOLL: true,
}

// currentSyscall is the system call pid is blocked in, or -1.
func currentSyscall(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/syscall")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return -1
	}
	return n
}

// naiveMemory samples the naive server idle and one of its job children
// while it runs.
func (s *server) naiveMemory(idle, job *MemRow) error {
	root := s.cmd.Process.Pid
	m, err := readSmaps(root)
	if err != nil {
		return err
	}
	idle.set(procInfo{pid: root, mem: m})
	done := s.start(sleepingCode)
	time.Sleep(300 * time.Millisecond)
	found := false
	for _, p := range descendants(root) {
		if p.depth == 1 {
			job.set(p)
			found = true
			break
		}
	}
	if !found {
		job.Skipped = "the running job child was not found"
	}
	return <-done
}

// start runs code on its own goroutine; the channel gets its outcome.
func (s *server) start(code string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, _, err := s.run(pynox.Job{Code: code}, trivialOut)
		done <- err
	}()
	return done
}
