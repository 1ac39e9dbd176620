package pynox

import (
	"os"
	"strconv"
	"strings"
)

// Leased namespaces (issue 13's latency point): each ready ns spare
// enters a prepared namespace the pool's mounter leases to it before any
// job, drops its capabilities and attaches its seccomp job layer there,
// off its job's path; at the job, the mounter attaches the job's mounts
// to that namespace, and only then does the spare get its job.

// nsLeased counts the mount namespaces the mounter pid holds that a
// process other than it is in: those leased to ready ns spares (its own
// is not counted; its stock's have no process).
func nsLeased(pid int) int {
	held := map[string]bool{}
	dir := "/proc/" + strconv.Itoa(pid)
	own, _ := os.Readlink(dir + "/ns/mnt")
	ents, _ := os.ReadDir(dir + "/fd")
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "mnt:[") && l != own {
			held[l] = true
		}
	}
	n := 0
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		q, err := strconv.Atoi(e.Name())
		if err != nil || q == pid {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/mnt"); err == nil && held[l] {
			n++
			delete(held, l)
		}
	}
	return n
}
