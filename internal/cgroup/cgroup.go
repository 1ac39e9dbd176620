// Package cgroup gives each pynox job process a control group of its own,
// with a limit on its tasks (pids) and on its memory, so that the limits
// hold for uid 0 (RLIMIT_NPROC does not apply to root) and count what
// RLIMIT_AS cannot see: memfd and tmpfs pages, pipe and socket buffers,
// and the job's copies of its template's pages.
//
// # What is used
//
// [Probe] looks once, per process, at /proc/self/cgroup and
// /proc/self/mountinfo:
//
//   - cgroup v2 ("v2") when the process's own unified cgroup offers both
//     the pids and the memory controllers (its cgroup.controllers lists
//     them: the cgroup was delegated, as systemd's Delegate=yes or a
//     container with a cgroup namespace do);
//   - else cgroup v1 ("v1") when both a pids and a memory hierarchy are
//     mounted and the process's own cgroup in each is visible;
//   - else nothing ("none"), with the reason.
//
// Each [Manager] (one per pool) creates one directory of its own beneath
// the process's own cgroup in each hierarchy it uses, named
// pynox-<pid>-<random>, and each job's cgroup beneath that, named
// j<n>. It never creates, writes or removes anything elsewhere, with one
// exception in v2: the "no internal processes" rule forbids a cgroup that
// holds processes from giving controllers to its children, so when the
// process's own cgroup holds the pool's process and nothing else, the
// pool moves itself into a leaf of its own beneath it (pynox-<pid>-self)
// and enables the pids and memory controllers in its own cgroup's
// cgroup.subtree_control. That leaf stays until the process exits.
//
// # Removal
//
// A job's cgroup is released once its process has exited (a cgroup that
// still holds a task is retried with a growing pause): kept for the next
// spare when nothing of its last process is left in it (no task, no tmpfs
// or memfd pages, at most 4 MiB still charged once the kernel reclaimed
// what it could: a tmpfs's inodes and dentries are kernel memory no
// reclaim frees), else removed (rmdir). Reuse matters: a removed memory
// cgroup with page cache still charged to it lingers in the kernel until
// the pages are reclaimed, and the kernel allows 65,535 memory cgroups,
// lingering ones included. [Manager.Close] waits for every release and
// then removes every group and the pool's own directories. A pool that died without closing leaves its directories
// behind: the next Manager removes directories named pynox-<pid>-… whose
// pid is no longer a running process, children first, with rmdir only
// (which the kernel refuses for a cgroup that still holds a task or a
// child), so nothing in use can be disturbed.
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pynox/pynox/internal/pidfd"
	"golang.org/x/sys/unix"
)

// The backends a probe can find.
const (
	V1   = "v1"
	V2   = "v2"
	None = "none"
)

// The modes a pool can ask for (its `[pool] cgroups` setting).
const (
	// Auto uses what the machine offers, or nothing.
	Auto = "auto"
	// Require refuses to start without per-job cgroups.
	Require = "require"
	// Off uses no cgroups.
	Off = "off"
)

// DefaultTasks is the default tasks limit (pids.max) of a job's cgroup:
// threads count, and a job cannot create processes anyway.
const DefaultTasks = 64

// Layout is where the calling process's own cgroups are, as [Probe]
// found them.
type Layout struct {
	// Backend is V2, V1 or None.
	Backend string
	// Pids and Memory are the directories of the process's own v1 pids
	// and memory cgroups (V1 only).
	Pids, Memory string
	// Unified is the directory of the process's own v2 cgroup (V2 only).
	Unified string
	// Reason says why Backend is None, or why v2 was passed over.
	Reason string
}

// Dirs returns the process's own cgroup directories that a Manager
// writes in while it starts (creating its own directories there, removing
// stale ones, and in v2 the pool's leaf and cgroup.subtree_control); a
// started Manager writes only beneath [Manager.WritableDirs].
func (l Layout) Dirs() []string {
	switch l.Backend {
	case V1:
		return []string{l.Pids, l.Memory}
	case V2:
		return []string{l.Unified}
	}
	return nil
}

var (
	probeOnce sync.Once
	probed    Layout
)

// Probe returns what the machine offers this process, found once and
// cached.
func Probe() Layout {
	probeOnce.Do(func() {
		self, err1 := os.ReadFile("/proc/self/cgroup")
		mounts, err2 := os.ReadFile("/proc/self/mountinfo")
		if err := errors.Join(err1, err2); err != nil {
			probed = Layout{Backend: None, Reason: err.Error()}
			return
		}
		probed = probe(self, mounts)
	})
	return probed
}

// mount is one cgroup file system from mountinfo.
type mount struct {
	root, point string
	v2          bool
	controllers map[string]bool // v1: the hierarchy's controllers
}

// probe decides the backend from the contents of /proc/self/cgroup and
// /proc/self/mountinfo, reading the cgroup files it names.
func probe(self, mountinfo []byte) Layout {
	paths := map[string]string{} // controller (v1) or "" (v2) -> path
	for _, line := range strings.Split(string(self), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			paths[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			paths[c] = parts[2]
		}
	}
	var mounts []mount
	for _, line := range strings.Split(string(mountinfo), "\n") {
		f := strings.Fields(line)
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+3 > len(f) {
			continue
		}
		m := mount{root: unescape(f[3]), point: unescape(f[4])}
		switch f[sep+1] {
		case "cgroup2":
			m.v2 = true
		case "cgroup":
			m.controllers = map[string]bool{}
			for _, o := range strings.Split(f[sep+3], ",") {
				m.controllers[o] = true
			}
		default:
			continue
		}
		mounts = append(mounts, m)
	}
	// dirOf maps the process's cgroup path onto a mount of the hierarchy.
	dirOf := func(path string, match func(mount) bool) (string, bool) {
		for _, m := range mounts {
			if !match(m) {
				continue
			}
			rel, err := filepath.Rel(m.root, path)
			if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				continue
			}
			dir := filepath.Join(m.point, rel)
			if st, err := os.Stat(dir); err == nil && st.IsDir() {
				return dir, true
			}
		}
		return "", false
	}
	var reasons []string
	if p, ok := paths[""]; ok {
		dir, found := dirOf(p, func(m mount) bool { return m.v2 })
		switch {
		case !found:
			reasons = append(reasons, "v2: the process's own cgroup "+p+" is not mounted")
		default:
			avail := fields(dir, "cgroup.controllers")
			if avail["pids"] && avail["memory"] {
				return Layout{Backend: V2, Unified: dir}
			}
			reasons = append(reasons, "v2: "+dir+"/cgroup.controllers lacks pids or memory (not delegated)")
		}
	}
	l := Layout{Backend: V1}
	for _, c := range []string{"pids", "memory"} {
		p, ok := paths[c]
		if !ok {
			reasons = append(reasons, "v1: no "+c+" hierarchy")
			continue
		}
		dir, found := dirOf(p, func(m mount) bool { return m.controllers[c] })
		if !found {
			reasons = append(reasons, "v1: the process's own "+c+" cgroup "+p+" is not mounted")
			continue
		}
		if c == "pids" {
			l.Pids = dir
		} else {
			l.Memory = dir
		}
	}
	if l.Pids != "" && l.Memory != "" {
		l.Reason = strings.Join(reasons, "; ")
		return l
	}
	return Layout{Backend: None, Reason: strings.Join(reasons, "; ")}
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// fields reads a space-separated cgroup file as a set.
func fields(dir, name string) map[string]bool {
	b, _ := os.ReadFile(filepath.Join(dir, name))
	set := map[string]bool{}
	for _, f := range strings.Fields(string(b)) {
		set[f] = true
	}
	return set
}

// Manager creates and removes one pool's job cgroups. A nil *Manager, and
// one whose backend is None, creates none. Its methods are safe for
// concurrent use.
type Manager struct {
	backend string
	tasks   int
	bases   []string // the pool's own directories: v1 pids and memory, or v2's one
	locks   []int    // a flock held on each base for the pool's life (see removeStale)
	// locksMu guards the use of locks as directory descriptors (see
	// Group.readValue) against their closing in unlock.
	locksMu sync.RWMutex
	seq     atomic.Int64

	mu      sync.Mutex
	closed  bool
	pending sync.WaitGroup // groups in use or being released
	free    []*Group       // empty groups ready for reuse
	leaked  []string       // directories that could not be removed
}

// NewManager prepares the cgroups of one pool. In mode Off it uses none;
// in Auto it uses what [Probe] found, or none when the pool cannot create
// its directories there; in Require it fails with the reason instead.
// tasks is each job's pids.max (zero means DefaultTasks).
func NewManager(mode string, tasks int) (*Manager, error) {
	if tasks == 0 {
		tasks = DefaultTasks
	}
	switch mode {
	case Off:
		return &Manager{backend: None}, nil
	case Auto, Require, "":
	default:
		return nil, fmt.Errorf("cgroups must be %q, %q or %q, got %q", Auto, Require, Off, mode)
	}
	if tasks < 1 {
		return nil, fmt.Errorf("the tasks limit must be positive, got %d", tasks)
	}
	l := Probe()
	m := &Manager{backend: l.Backend, tasks: tasks}
	var err error
	switch l.Backend {
	case V1:
		err = m.setupV1(l)
	case V2:
		err = m.setupV2(l)
	default:
		err = errors.New(l.Reason)
	}
	if err != nil {
		if mode == Require {
			return nil, fmt.Errorf("per-job cgroups are unavailable: %w", err)
		}
		return &Manager{backend: None}, nil
	}
	return m, nil
}

func (m *Manager) setupV1(l Layout) error {
	removeStale(l.Pids)
	removeStale(l.Memory)
	for try := 0; ; try++ {
		base, err := os.MkdirTemp(l.Pids, fmt.Sprintf("pynox-%d-", os.Getpid()))
		if err != nil {
			return fmt.Errorf("v1: create a cgroup beneath %s: %w", l.Pids, err)
		}
		mem := filepath.Join(l.Memory, filepath.Base(base))
		if err := os.Mkdir(mem, 0o700); err != nil {
			os.Remove(base)
			return fmt.Errorf("v1: create a cgroup beneath %s: %w", l.Memory, err)
		}
		m.bases = []string{base, mem}
		if err := m.lockBases(); err == nil || try == 2 {
			return err
		}
	}
}

// lockBases takes the flock that marks the pool's own directories as in
// use (see removeStale), and checks that they are still the directories
// it made: another pool's sweep may have removed them between their
// mkdir and the lock, in which case it removes what is left and fails.
func (m *Manager) lockBases() error {
	for _, b := range m.bases {
		fd, err := lockDir(b)
		if err != nil {
			m.unlock()
			for _, b := range m.bases {
				unix.Rmdir(b)
			}
			return fmt.Errorf("lock %s: %w", b, err)
		}
		m.locks = append(m.locks, fd)
	}
	return nil
}

// unlock lets go of the pool's locks.
func (m *Manager) unlock() {
	m.locksMu.Lock()
	defer m.locksMu.Unlock()
	for _, fd := range m.locks {
		unix.Close(fd)
	}
	m.locks = nil
}

// lockDir opens dir and takes an exclusive flock on it without waiting,
// then checks that dir still names the directory locked.
func lockDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		return -1, err
	}
	var held, now unix.Stat_t
	if err := unix.Fstat(fd, &held); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Stat(dir, &now); err != nil || now.Ino != held.Ino || now.Dev != held.Dev {
		unix.Close(fd)
		return -1, errors.New("removed while it was being locked")
	}
	return fd, nil
}

var (
	leafOnce sync.Once
	leafErr  error
)

func (m *Manager) setupV2(l Layout) error {
	removeStale(l.Unified)
	want := []string{"pids", "memory"}
	if err := enable(l.Unified, want); err != nil {
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("v2: enable pids and memory in %s: %w", l.Unified, err)
		}
		// The own cgroup holds processes: move the pool's own process
		// into a leaf, once, if it is alone there.
		leafOnce.Do(func() { leafErr = moveSelfToLeaf(l.Unified) })
		if leafErr != nil {
			return leafErr
		}
		if err := enable(l.Unified, want); err != nil {
			return fmt.Errorf("v2: enable pids and memory in %s: %w", l.Unified, err)
		}
	}
	for try := 0; ; try++ {
		base, err := os.MkdirTemp(l.Unified, fmt.Sprintf("pynox-%d-", os.Getpid()))
		if err != nil {
			return fmt.Errorf("v2: create a cgroup beneath %s: %w", l.Unified, err)
		}
		m.bases = []string{base}
		if err := m.lockBases(); err != nil {
			if try == 2 {
				return err
			}
			continue
		}
		if err := enable(base, want); err != nil {
			m.unlock()
			os.Remove(base)
			return fmt.Errorf("v2: enable pids and memory in %s: %w", base, err)
		}
		return nil
	}
}

// enable makes sure dir's children get the controllers.
func enable(dir string, ctrls []string) error {
	have := fields(dir, "cgroup.subtree_control")
	var add []string
	for _, c := range ctrls {
		if !have[c] {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	return write(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(add, " "))
}

// moveSelfToLeaf moves the calling process into own/pynox-<pid>-self when
// it is the only process in own.
func moveSelfToLeaf(own string) error {
	b, err := os.ReadFile(filepath.Join(own, "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("v2: %w", err)
	}
	me := strconv.Itoa(os.Getpid())
	for _, p := range strings.Fields(string(b)) {
		if p != me {
			return fmt.Errorf("v2: %s holds other processes than the pool (pid %s), so it cannot give controllers to children; delegate a cgroup to the pool alone", own, p)
		}
	}
	leaf := filepath.Join(own, fmt.Sprintf("pynox-%d-self", os.Getpid()))
	if err := os.Mkdir(leaf, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("v2: %w", err)
	}
	if err := write(filepath.Join(leaf, "cgroup.procs"), me); err != nil {
		os.Remove(leaf)
		return fmt.Errorf("v2: move the pool into %s: %w", leaf, err)
	}
	return nil
}

// removeStale removes what a pool that is gone left in dir: directories
// named pynox-<pid>-… (and their empty children) on which no live pool
// holds its flock. Whether the pool is alive is learnt from the lock, not
// from its pid, which may name another process (or none) in this
// process's PID namespace. Only rmdir is used, which the kernel refuses
// for a cgroup that still holds a task or a child.
func removeStale(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if _, ok := stalePid(e.Name()); !ok || !e.IsDir() {
			continue
		}
		d := filepath.Join(dir, e.Name())
		fd, err := lockDir(d)
		if err != nil {
			continue // its pool still runs (or it is gone already)
		}
		if kids, err := os.ReadDir(d); err == nil {
			for _, k := range kids {
				if k.IsDir() {
					unix.Rmdir(filepath.Join(d, k.Name()))
				}
			}
		}
		unix.Rmdir(d)
		unix.Close(fd)
	}
}

// stalePid parses "pynox-<pid>-…".
func stalePid(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "pynox-")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(num)
	return pid, err == nil && pid > 0
}

// Backend returns V1, V2 or None.
func (m *Manager) Backend() string {
	if m == nil {
		return None
	}
	return m.backend
}

// Tasks returns each job cgroup's pids.max (zero without cgroups).
func (m *Manager) Tasks() int {
	if m.Backend() == None {
		return 0
	}
	return m.tasks
}

// WritableDirs returns the directories the pool writes in: its own
// directory in each hierarchy (the job cgroups lie beneath them). A pool
// that confines itself must keep write access to them.
func (m *Manager) WritableDirs() []string {
	if m == nil {
		return nil
	}
	return append([]string(nil), m.bases...)
}

// Group is one job's cgroup (a directory in each hierarchy). It serves
// one process at a time.
type Group struct {
	m       *Manager
	dirs    []string // v1: pids, memory; v2: the one
	name    string   // the directories' name beneath the bases (j<n>)
	memDir  string
	memory  int64 // the memory limit written last
	oomBase int   // the OOM-kill count when the current process joined
	once    sync.Once
	// swap is whether v1 memory.memsw.limit_in_bytes exists (1) or not
	// (-1), once a SetMemory has looked (0: not yet).
	swap int8
	// files are the group's control files held open (held.go), shared by
	// the Groups that reuse its directories; nil holds none.
	files *heldFiles
}

// ErrClosed is returned by NewGroup after Close.
var ErrClosed = errors.New("cgroup manager closed")

// NewGroup returns a job cgroup with the tasks limit and the memory limit
// given (bytes): an empty one that an earlier process left clean (see
// Release), or a new one. It returns nil and no error when the manager
// uses no cgroups.
//
// Groups are reused because a removed memory cgroup that still has page
// cache charged to it lingers in the kernel ("dying") until the pages are
// reclaimed, and the kernel allows only 65,535 memory cgroups, dying ones
// included: one new cgroup per job would run out on a busy pool.
func (m *Manager) NewGroup(memory int64) (*Group, error) {
	if m.Backend() == None {
		return nil, nil
	}
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return nil, ErrClosed
		}
		m.pending.Add(1)
		var g *Group
		if n := len(m.free); n > 0 {
			// Prefer the most recently freed group that has the limit
			// already, which spares the writes of SetMemory: each
			// template asks for its own limit (its spares' margin differs),
			// and the workers share the free list.
			i := n - 1
			for j := n - 1; j >= 0; j-- {
				if m.free[j].memory == memory {
					i = j
					break
				}
			}
			g = m.free[i]
			m.free = append(m.free[:i], m.free[i+1:]...)
		}
		m.mu.Unlock()
		if g == nil {
			return m.create(memory)
		}
		// A fresh Group for the same directories: the old one's Release
		// may still be inside its sync.Once, which must not be reset
		// under it.
		g = &Group{m: g.m, dirs: g.dirs, name: g.name, memDir: g.memDir, memory: g.memory, swap: g.swap, files: g.files}
		g.oomBase = g.OOMKills()
		if err := g.SetMemory(memory); err != nil {
			// What the last process left does not fit the new limit:
			// retire the group and try the next.
			g.retire()
			continue
		}
		return g, nil
	}
}

// create makes a new group; m.pending counts it already.
func (m *Manager) create(memory int64) (*Group, error) {
	name := "j" + strconv.FormatInt(m.seq.Add(1), 10)
	g := &Group{m: m, name: name}
	fail := func(err error) (*Group, error) {
		g.retire()
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	for _, b := range m.bases {
		d := filepath.Join(b, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			return fail(err)
		}
		g.dirs = append(g.dirs, d)
	}
	g.memDir = g.dirs[len(g.dirs)-1]
	g.files = g.openHeld()
	if err := write(filepath.Join(g.dirs[0], "pids.max"), strconv.Itoa(m.tasks)); err != nil {
		return fail(fmt.Errorf("pids.max: %w", err))
	}
	if m.backend == V2 {
		// The job's memory is not swapped out beyond its limit, and an OOM
		// kill takes the whole job.
		if _, err := os.Stat(filepath.Join(g.memDir, "memory.swap.max")); err == nil {
			if err := write(filepath.Join(g.memDir, "memory.swap.max"), "0"); err != nil {
				return fail(fmt.Errorf("memory.swap.max: %w", err))
			}
		}
		_ = write(filepath.Join(g.memDir, "memory.oom.group"), "1")
	}
	if err := g.SetMemory(memory); err != nil {
		g.retire()
		return nil, err
	}
	return g, nil
}

// Dirs returns the group's directories.
func (g *Group) Dirs() []string { return append([]string(nil), g.dirs...) }

// SetMemory sets the group's memory limit in bytes (v1
// memory.limit_in_bytes, and memory.memsw.limit_in_bytes to the same
// value where swap is accounted; v2 memory.max). Writing the value it
// already has is skipped.
func (g *Group) SetMemory(n int64) error {
	if n == g.memory {
		return nil
	}
	v := strconv.FormatInt(n, 10)
	// The files are written through the group's held descriptors
	// (held.go), or opened beneath the Manager's base when not held.
	mi := len(g.dirs) - 1
	var err error
	if g.m.backend == V2 {
		err = g.writeFile(mi, "memory.max", v)
	} else {
		// memsw must stay at or above the memory limit at every step.
		const memsw = "memory.memsw.limit_in_bytes"
		if g.swap == 0 {
			g.swap = -1
			if _, err := os.Stat(filepath.Join(g.memDir, memsw)); err == nil {
				g.swap = 1
			}
		}
		hasSw := g.swap > 0
		if hasSw && n > g.memory && g.memory != 0 {
			err = g.writeFile(mi, memsw, v)
		}
		if err == nil {
			err = g.writeFile(mi, "memory.limit_in_bytes", v)
		}
		if err == nil && hasSw && (n < g.memory || g.memory == 0) {
			err = g.writeFile(mi, memsw, v)
		}
	}
	if err != nil {
		return fmt.Errorf("cgroup: memory limit: %w", err)
	}
	g.memory = n
	return nil
}

// Memory returns the memory limit written last.
func (g *Group) Memory() int64 { return g.memory }

// Add moves the process that the pidfd fd refers to into the group. The
// pid is read from the pidfd (see pidfd.Pid), so it is the pid in this
// process's namespace even when the process was forked in another.
func (g *Group) Add(fd int) error {
	pid, err := pidfd.Pid(fd)
	if err != nil {
		return err
	}
	for i, d := range g.dirs {
		if err := g.writeFile(i, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("cgroup: move pid %d into %s: %w", pid, d, err)
		}
	}
	// The pid was read before the move: had the process been reaped and
	// its pid reused in between, the pidfd would say so now.
	if again, err := pidfd.Pid(fd); err != nil || again != pid {
		return fmt.Errorf("cgroup: process %d exited while being moved: %w", pid, unix.ESRCH)
	}
	return nil
}

// OOMKilled reports whether the kernel's OOM killer killed a task of the
// group since its current process joined.
func (g *Group) OOMKilled() bool { return g.OOMKills() > g.oomBase }

// OOMKills returns how many of the group's tasks the kernel's OOM killer
// killed in the group's life (v1 memory.oom_control, v2 memory.events
// "oom_kill").
func (g *Group) OOMKills() int {
	file := "memory.oom_control"
	if g.m.backend == V2 {
		file = "memory.events"
	}
	n, _, _ := g.readValue(len(g.dirs)-1, file, "oom_kill")
	return int(n)
}

// releaseBackoff is how long Release keeps waiting for a group's tasks to
// be gone (its process is dying), in total.
const releaseBackoff = 30 * time.Second

// Release gives the group back once its process has exited: at once when
// it holds no task, else from a goroutine that retries with a growing
// pause. An empty group that holds no tmpfs or memfd pages (which would
// count against the next process) is kept for reuse; any other is
// removed, and so is one with more than a little memory still charged
// to it after reclaim (see reclaimed). It is safe to call more than once. [Manager.Close] waits for
// every release.
func (g *Group) Release() {
	g.once.Do(func() {
		if g.tryRelease() {
			return
		}
		go func() {
			pause := time.Millisecond
			for waited := time.Duration(0); waited < releaseBackoff; waited += pause {
				time.Sleep(pause)
				if g.tryRelease() {
					return
				}
				pause = min(2*pause, time.Second)
			}
			g.files.close()
			g.m.mu.Lock()
			g.m.leaked = append(g.m.leaked, g.dirs...)
			g.m.mu.Unlock()
			g.m.pending.Done()
		}()
	})
}

// tryRelease releases the group if it holds no task, reporting whether it
// did.
func (g *Group) tryRelease() bool {
	if !g.empty() {
		return false
	}
	m := g.m
	if g.shmem() == 0 && g.reclaimed() {
		m.mu.Lock()
		if !m.closed {
			m.free = append(m.free, g)
			m.mu.Unlock()
			m.pending.Done()
			return true
		}
		m.mu.Unlock()
	}
	g.retire()
	return true
}

// empty reports whether no task is in the group, exited ones included:
// a task counts in pids.current until it is reaped, and every task of
// the group is in its pids cgroup.
func (g *Group) empty() bool {
	n, ok, _ := g.readValue(0, "pids.current", "")
	return ok && n == 0
}

// reuseSlack is the most memory a released group may still have charged
// to it and be reused: a process that did nothing unusual leaves a few
// hundred KiB.
const reuseSlack = 4 << 20

// reclaimed makes the kernel reclaim what it can of the memory charged to
// a group that holds no task (v1 memory.force_empty, v2 memory.reclaim)
// and reports whether what is left is at most reuseSlack. What is left
// would count against the next process: the inodes and dentries of files
// and directories a job left on a tmpfs in its write grant are kernel
// memory charged to its group (100,000 empty directories hold about
// 170 MiB) that no reclaim frees while they exist, and memory.stat's
// shmem does not show them.
// The common case, a process that left little, costs one read: the
// kernel is asked to reclaim only when more is charged.
func (g *Group) reclaimed() bool {
	usage, reclaim, arg := "memory.usage_in_bytes", "memory.force_empty", "0"
	if g.m.backend == V2 {
		usage, reclaim, arg = "memory.current", "memory.reclaim", strconv.FormatInt(1<<40, 10)
	}
	charged := func() int64 {
		n, ok, _ := g.readValue(len(g.dirs)-1, usage, "")
		if !ok {
			return -1
		}
		return n
	}
	if n := charged(); n >= 0 && n <= reuseSlack {
		return true
	}
	_ = write(filepath.Join(g.memDir, reclaim), arg) // v2 answers EAGAIN when less was reclaimable
	n := charged()
	return n >= 0 && n <= reuseSlack
}

// shmem returns the tmpfs and memfd bytes charged to the group (its
// memory.stat "shmem"), or -1 when unknown.
func (g *Group) shmem() int64 {
	n, ok, _ := g.readValue(len(g.dirs)-1, "memory.stat", "shmem")
	if !ok {
		return -1
	}
	return n
}

// retire removes a group that holds no task (retrying while the kernel
// still refuses) and ends its count in m.pending.
func (g *Group) retire() {
	defer g.m.pending.Done()
	for i := 0; i < 100; i++ {
		if g.tryRemove() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	g.files.close()
	g.m.mu.Lock()
	g.m.leaked = append(g.m.leaked, g.dirs...)
	g.m.mu.Unlock()
}

// tryRemove removes what it can of the group's directories and reports
// whether none is left.
func (g *Group) tryRemove() bool {
	g.files.close() // kernfs would refuse them once the directory is gone
	ok := true
	for i := len(g.dirs) - 1; i >= 0; i-- {
		if err := unix.Rmdir(g.dirs[i]); err != nil && err != unix.ENOENT {
			ok = false
		}
	}
	return ok
}

// Close waits until every group is released (at most a little longer
// than a release may take), then removes every group and the pool's own
// directories. It reports what it could not remove.
func (m *Manager) Close() error {
	if m.Backend() == None {
		return nil
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	waited := make(chan struct{})
	go func() {
		m.pending.Wait()
		close(waited)
	}()
	select {
	case <-waited:
	case <-time.After(releaseBackoff + 5*time.Second):
		// A group still in use (a process that did not die) is left; the
		// next pool removes it once it is empty (see removeStale).
		m.unlock()
		return fmt.Errorf("cgroup: groups beneath %v still in use after %s; left in place", m.bases, releaseBackoff+5*time.Second)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for _, g := range m.free {
		if !g.tryRemove() {
			errs = append(errs, fmt.Errorf("cgroup %v: not removed", g.dirs))
		}
	}
	m.free = nil
	for _, d := range m.leaked {
		if err := unix.Rmdir(d); err != nil && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("cgroup %s: %w", d, err))
		}
	}
	for _, b := range m.bases {
		if err := unix.Rmdir(b); err != nil && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("cgroup %s: %w", b, err))
		}
	}
	m.unlock()
	return errors.Join(errs...)
}

// write writes s to a cgroup file in one write (with no os.File: a
// control file need not be registered with Go's poller).
func write(path, s string) error {
	return writeAt(unix.AT_FDCWD, path, s)
}
