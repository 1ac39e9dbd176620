package cgroup

// Control files held open for a group's life, and the raw system calls
// the package reads and writes control files with.
//
// Every job moves a fresh process into a group (cgroup.procs, once per
// hierarchy) and reads four of its files: the OOM-kill count when the
// process joins, and pids.current, memory.stat and the memory usage when
// it is released. Opening and closing each file every time was 12 of the
// pool's ~80 system calls per job, and a kernfs open is not cheap (a
// path walk, a kernfs_open_file and a seq_file): in a profile of `pynox
// pool` (2 workers, v1) the group's opens and closes were a tenth of the
// host's CPU. A group now opens them once, when it is created, and keeps
// them, through reuse, until it is removed: eight descriptors per group in
// v1, six in v2 (groups number about two per worker, plus one per open
// session).
//
// The calls are raw (syscall.RawSyscall): a call through syscall.Syscall
// tells Go's scheduler that the thread may block, and when every P was
// idle, as it is while the pool waits for a template's next spare, that
// first call wakes the runtime's monitor thread on another CPU (see
// internal/worker/rawsys.go). None of these calls waits for anything
// but the kernel's own locks: a write to cgroup.procs takes 20-500 µs
// of the kernel's time, which the P would have to wait for anyway.

import (
	"sync"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/rawsys"
)

// heldFiles are the descriptors of a group's control files, open for
// the group's life. Its zero value holds none.
type heldFiles struct {
	mu     sync.RWMutex
	files  []heldFile // nil once closed
	closed bool
}

// heldFile is one open control file: the file's name in the group's
// i-th directory.
type heldFile struct {
	i    int
	name string
	fd   int
}

// heldNames are the files a group holds in each of its directories, for
// each backend: what Add and SetMemory write and what OOMKills, empty,
// reclaimed and shmem read. The memory limit's files are written for
// about every other job (each template asks for its own limit, and the
// workers share the free groups): by their absolute paths, two opens of
// up to nine path components each, they were among the larger items of
// the host's CPU per job in a profile of `pynox pool` (v1).
func heldNames(backend string) [][]string {
	if backend == V2 {
		return [][]string{{"cgroup.procs", "pids.current", "memory.current", "memory.stat", "memory.events", "memory.max"}}
	}
	return [][]string{
		{"cgroup.procs", "pids.current"},
		{"cgroup.procs", "memory.usage_in_bytes", "memory.stat", "memory.oom_control",
			"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"},
	}
}

// heldForWriting reports whether the held file name is opened for
// writing (the files Add and SetMemory write) rather than for reading.
func heldForWriting(name string) bool {
	switch name {
	case "cgroup.procs", "memory.max", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes":
		return true
	}
	return false
}

// openHeld opens the group's control files beneath the Manager's base
// descriptors (as Group.readValue does). A file that does not open is
// not held, and is read or written by its path as before.
func (g *Group) openHeld() *heldFiles {
	h := &heldFiles{}
	names := heldNames(g.m.backend)
	g.m.locksMu.RLock()
	defer g.m.locksMu.RUnlock()
	for i := range g.dirs {
		if i >= len(names) || i >= len(g.m.locks) {
			break
		}
		for _, name := range names[i] {
			flags := unix.O_RDONLY
			if heldForWriting(name) {
				flags = unix.O_WRONLY
			}
			fd, err := rawOpenat(g.m.locks[i], g.name+"/"+name, flags|unix.O_CLOEXEC)
			if err == nil {
				h.files = append(h.files, heldFile{i: i, name: name, fd: fd})
			}
		}
	}
	return h
}

// use calls f with the descriptor of the group's file name in its i-th
// directory, and reports false without calling it when that file is not
// held (or no longer: close ran).
func (h *heldFiles) use(i int, name string, f func(fd int)) bool {
	if h == nil {
		return false
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, hf := range h.files {
		if hf.i == i && hf.name == name {
			f(hf.fd)
			return true
		}
	}
	return false
}

// close closes every held file; the group's files are used by their
// paths from then on.
func (h *heldFiles) close() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, hf := range h.files {
		rawClose(hf.fd)
	}
	h.files, h.closed = nil, true
}

// The raw system calls of the held files (see internal/rawsys).
func rawOpenat(dirfd int, path string, flags int) (int, error) {
	return rawsys.Openat(dirfd, path, flags, 0)
}

var (
	rawClose = rawsys.Close
	rawPread = rawsys.Pread
	rawWrite = rawsys.Write
)
