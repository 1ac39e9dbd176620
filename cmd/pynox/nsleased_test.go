package main

import (
	"os"
	"strconv"
	"strings"
)

// mounterLeased counts the mount namespaces the mounter pid holds that a
// process other than it is in: those leased to ready ns spares, which
// enter a namespace from the mounter's stock before their job (the
// mounter keeps its copies of a lease's descriptors until the job's
// mounts are attached); its own is not counted, nor its stock's, which
// no process is in.
func mounterLeased(pid int) int {
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
