package pynox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/mountns"
	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/worker"
)

// DefaultOverlayLimit is what an Overlay mount without a WriteBytesLimit
// may hold: the size of the tmpfs its writes go to.
const DefaultOverlayLimit = 64 << 20

// nsPython is the interpreter the mounter runs on: the system's, started
// with -I -S, as the mounter imports nothing but the standard library's
// core modules and must not read a user's site-packages.
const nsPython = "/usr/bin/python3"

// nsMounter starts the pool's mounter (internal/mountns) the first time a
// job needs a mount namespace (or, in a pool that confines itself, before
// it does), and proves once, with a namespace of its own, that it can
// build one (a tmpfs, a bind and an overlay).
type nsMounter struct {
	once sync.Once
	m    *mountns.Mounter
	err  error
	// base, in a pool that confines itself, is a detached tmpfs mount
	// made before the pool's Landlock domain, whose slot directories
	// (nSlots) each hold a rule of that domain; every job namespace's
	// root is a clone of a slot no other live namespace uses.
	base    int
	hasBase bool
	// inodes is the base tmpfs's size in inodes (nsRootInodes); zero
	// means nsRootMinInodes.
	inodes int
	// nSlots is how many slot directories the base tmpfs holds (nsSlots),
	// one per namespace that can be live at once; slotRules are their
	// paths for the pool's Landlock domain.
	nSlots    int
	slotRules []string
	// links are the host's top-level symbolic links, read before the
	// pool confines itself (its Landlock domain may deny listing "/");
	// nil means read them when needed.
	links [][2]string
	// scratchPath and scratchRoot, when set before startEarly, are the
	// pool's own scratch tmpfs and a descriptor of its root: the
	// mounter's first request hands them over (mountns.Mounter.Scratch),
	// and scratchTaken says it took them.
	scratchPath  string
	scratchRoot  int
	scratchTaken bool

	mu       sync.Mutex
	done     bool  // closed: no more namespaces
	startErr error // err, for failed (guarded by mu)

	// The namespaces' base, handed to the mounter at the first job that
	// needs a namespace (Pool.prepared): none before, so that a pool
	// whose jobs never use mounts keeps no prepared namespaces.
	prepOnce sync.Once
	prepBase *nsBase
	prepErr  error

	// mach is what on the machine stands in the way of namespaces
	// (machineObstacles), probed once.
	machOnce sync.Once
	mach     []string

	// ahead holds the namespaces attached ahead (nsmount_ahead.go).
	ahead nsAheads

	// slots bounds the namespaces one-shot jobs hold (see jobSlots).
	slotsOnce sync.Once
	slots     chan struct{}
}

// jobSlots returns the channel whose n places bound the mount namespaces
// that one-shot jobs hold at once, queued ones included: a job takes a
// place before its namespace is built (while it waits for a worker) and
// gives it back when it drops the namespace. Without it every queued
// job held a built namespace (as many as clients could queue: a host's
// namespace count for root, and in a pool that confines itself, inodes of
// the shared root for as many times nsMaxEntries).
func (n *nsMounter) jobSlots(size int) chan struct{} {
	n.slotsOnce.Do(func() { n.slots = make(chan struct{}, size) })
	return n.slots
}

// nsJobSlots is how many namespaces one-shot jobs hold at once: one per
// worker for the job running there and one for the job next in line.
func (p *Pool) nsJobSlots() int { return 2 * p.cfg.Workers }

// startEarly, in a pool about to confine itself, makes the base tmpfs
// and starts and probes the mounter, which must run outside the pool's
// Landlock domain. On failure, jobs that need a namespace are refused,
// naming it.
func (n *nsMounter) startEarly() {
	n.once.Do(func() {
		n.links = mountns.HostLinks()
		base, err := newBaseTmpfs(max(n.inodes, nsRootMinInodes))
		if err != nil {
			n.err = fmt.Errorf("making the namespaces' root tmpfs: %w", err)
			n.setStartErr()
			return
		}
		n.nSlots = max(n.nSlots, 1)
		if n.slotRules, err = mountns.MakeSlots(base, n.nSlots); err != nil {
			unix.Close(base)
			n.err = fmt.Errorf("making the namespaces' root tmpfs: %w", err)
			n.setStartErr()
			return
		}
		n.base, n.hasBase = base, true
		n.start()
		if n.err != nil {
			unix.Close(n.base)
			n.hasBase = false
		}
		n.setStartErr()
	})
}

// nsMaxEntries is the most entries (directories, and files for file
// mounts) the paths of one job's mounts and grants may make in its
// namespace's root: the distinct paths of all of them and of their
// parent directories. In a pool that confines itself every namespace's
// root is a clone of one tmpfs, where the mountpoints of every live
// namespace are made; without a bound, two live sessions with mount
// paths of 16000 components filled its inodes and every other tenant's
// mount job needing a new mountpoint failed with ENOSPC while they lived
// (TestHostileReview10NSEntriesBounded).
const nsMaxEntries = 512

// nsRootMinInodes is the least inodes of the namespaces' shared root.
const nsRootMinInodes = 65536

// nsSlots is how many namespaces of a pool of workers workers and
// sessions sessions at most can be live at once, in a pool that confines
// itself: the one-shot jobs' jobSlots (two per worker) and one per worker
// whose process is still exiting, the namespaces the templates' ready ns
// spares entered ahead of their jobs (worker.NSLease: two per worker, one
// per kind), those attached ahead (one per worker and one more:
// nsmount_ahead.go), a session's each, the mounter's stock, and the
// mounter's probe. Each has a slot directory of its own in the
// shared root (mountns.Plan.Slots): while one job holds a file mount at
// /x, another tenant's directory mount at /x is made in another
// directory (TestHostileReview10NSSharedRootTypeConflict).
func nsSlots(workers, sessions int) int {
	return 6*workers + sessions + mountns.MaxStock + 2
}

// nsRootInodes is the size in inodes of the namespaces' shared root for
// a pool of workers workers and sessions sessions at most: room for the
// entries of every namespace that can be live at once (the one-shot
// jobs' jobSlots, two per worker, and one per worker whose process is
// still exiting; the ready ns spares' two per worker; a session's each;
// those attached ahead, one per worker and one more; the mounter's
// stock), as many again that are gone but not collected yet (the
// mounter removes a gone namespace's entries at its next request), and
// the base's.
func nsRootInodes(workers, sessions int) int {
	return max(nsRootMinInodes, 2*(6*workers+sessions+mountns.MaxStock+1)*nsMaxEntries+4096)
}

// nsEntries counts the entries paths make in a namespace's root (each
// path and each of its parent directories but "/", counted once),
// stopping once the count is over limit.
func nsEntries(paths []string, limit int) int {
	seen := map[string]bool{}
	for _, p := range paths {
		for i := 1; i <= len(p) && len(seen) <= limit; i++ {
			if i == len(p) || p[i] == '/' {
				seen[p[:i]] = true
			}
		}
	}
	return len(seen)
}

// newBaseTmpfs makes a detached tmpfs mount of inodes inodes for the
// namespaces' root.
func newBaseTmpfs(inodes int) (int, error) {
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fsfd)
	for _, kv := range [][2]string{{"size", "8m"}, {"nr_inodes", strconv.Itoa(inodes)}, {"mode", "0755"}} {
		if err := unix.FsconfigSetString(fsfd, kv[0], kv[1]); err != nil {
			return -1, err
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, err
	}
	return unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
}

func (n *nsMounter) setStartErr() {
	n.mu.Lock()
	n.startErr = n.err
	n.mu.Unlock()
}

// rootRules are the paths of the base tmpfs's slot directories for the
// pool's Landlock domain, or none without a base.
func (n *nsMounter) rootRules() []string {
	if !n.hasBase {
		return nil
	}
	return n.slotRules
}

// get returns the running mounter, starting and probing it on first use.
func (n *nsMounter) get() (*mountns.Mounter, error) {
	n.once.Do(func() {
		n.start()
		n.setStartErr()
	})
	return n.m, n.err
}

// start starts the mounter and builds a probe namespace.
func (n *nsMounter) start() {
	m, err := mountns.Start(nsPython)
	if err != nil {
		n.err = err
		return
	}
	if n.scratchPath != "" {
		n.scratchTaken = m.Scratch(n.scratchPath, n.scratchRoot) == nil
	}
	// A mounter that stops here unmounts the scratch tmpfs it took: the
	// pool must know (it keeps the shared file system then).
	defer func() {
		if n.m == nil {
			n.scratchTaken = false
		}
	}()
	root, err := os.OpenFile("/", unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		m.Close()
		n.err = err
		return
	}
	defer root.Close()
	probe, err := m.Build(mountns.Plan{
		Binds:    []mountns.Bind{{Source: int(root.Fd()), Path: "/probe/bind", ReadOnly: true}},
		Overlays: []mountns.Overlay{{Lower: int(root.Fd()), Path: "/probe/overlay", Limit: 1 << 20}},
		Root:     n.base, RootSet: n.hasBase, Slots: n.nSlots,
	})
	if err != nil {
		m.Close()
		n.err = fmt.Errorf("probing the mounter: %w", err)
		return
	}
	probe.Close()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done {
		m.Close()
		n.err = errors.New("the pool is closed")
		return
	}
	n.m = m
	n.ahead.open()
}

// failed returns why the mounter could not start or build its probe
// namespace, once the first job that needed it tried; nil before that.
func (n *nsMounter) failed() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.startErr
}

// close stops the mounter, if it runs, and releases the base tmpfs.
func (n *nsMounter) close() {
	n.mu.Lock()
	n.done = true
	m := n.m
	n.mu.Unlock()
	if m != nil {
		m.Close()
	}
	n.prepOnce.Do(func() {}) // no base from now on
	if n.prepBase != nil {
		n.prepBase.close()
	}
	if n.hasBase {
		unix.Close(n.base) // hasBase stays: it is read without the lock
	}
}

// nsObstacles names what, on this machine and in this pool, stands in the
// way of per-job mount namespaces; none means the pool builds them.
func (p *Pool) nsObstacles() []string {
	why := slices.Clone(p.ns.machineObstacles())
	if err := p.ns.failed(); err != nil {
		why = append(why, "the pool's mounter failed: "+err.Error())
	} else if p.self.Landlock > 0 && len(p.ns.rootRules()) == 0 {
		why = append(why, "the pool confines itself (confine_self) and its Landlock domain holds no rule on a root for "+
			"its jobs' namespaces (the mounter did not start before the pool confined itself)")
	}
	return why
}

// machineObstacles is nsMachineObstacles, probed once per pool (at its
// start, or at its first job with a mount) and kept: a mount job's
// request reads no /proc file for it.
func (n *nsMounter) machineObstacles() []string {
	n.machOnce.Do(func() { n.mach = nsMachineObstacles() })
	return n.mach
}

// nsMachineObstacles names what on this machine stands in the way of
// per-job mount namespaces.
func nsMachineObstacles() []string {
	var why []string
	if os.Geteuid() != 0 {
		why = append(why, "the pool does not run as root (the mounter needs CAP_SYS_ADMIN in the initial user namespace)")
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		why = append(why, "user namespaces are disabled (user.max_user_namespaces = 0)")
	}
	if b, err := os.ReadFile("/proc/filesystems"); err != nil || !strings.Contains(string(b), "\toverlay\n") {
		why = append(why, "the kernel offers no overlay file system")
	}
	if _, err := os.Stat(nsPython); err != nil {
		why = append(why, nsPython+" (the mounter's interpreter) is missing")
	}
	return why
}

// nsMount is a mount a job sees in its own mount namespace.
type nsMount struct {
	fd      int    // the host directory or file (O_PATH)
	path    string // where the job sees it
	ro      bool
	overlay bool
	limit   int64 // an overlay's size
}

// needsNS reports whether the plan needs a mount namespace.
func (pl *plan) needsNS() bool { return len(pl.nsMounts) > 0 }

// closeNS releases the namespace's descriptors and the overlays' lower
// directories.
func (pl *plan) closeNS() {
	pl.dropNS()
	if pl.nsSlot != nil {
		<-pl.nsSlot
		pl.nsSlot = nil
	}
	for _, m := range pl.nsMounts {
		if m.overlay {
			unix.Close(m.fd)
		}
	}
	pl.nsMounts = nil
}

// dropNS releases the namespace's descriptors (a process that entered it
// keeps it).
func (pl *plan) dropNS() {
	if n := pl.aheadNS; n != nil {
		// A namespace taken ahead whose job is retried in another
		// process, or failed: it is not taken back.
		pl.aheadNS = nil
		pl.recycle(n, "", false)
		pl.recycle = nil
	}
	if h := pl.nsLease; h != nil {
		// A lease whose attach never ran (the job never reached its
		// spare: the spare died, and the job is retried in another, or
		// failed) ends here, else the mounter would keep its namespace.
		pl.nsLease = nil
		if h.used.CompareAndSwap(false, true) && h.l.Release != nil {
			go h.l.Release()
		}
	}
	if pl.ns != nil {
		pl.ns.Close()
		pl.ns = nil
	}
	pl.job.Namespace = nil
}

// hostBind is a host path the job sees at its own path in its namespace.
type hostBind struct {
	path  string
	fd    int
	ro    bool
	nodev bool // a base bind but the devices: no device node in it opens
}

// nsBase is the part of every job namespace of the pool that no request
// changes: binds of the interpreter's runtime paths, the system paths,
// the devices and /proc, the host's top-level symbolic links, and the
// pool's working directory. It is computed once, at the pool's first job
// with a namespace; its descriptors stay open until the pool closes.
type nsBase struct {
	binds []hostBind // sorted by path, none beneath another
	links [][2]string
	dirs  []string
	files []*os.File
}

// close releases the base's descriptors.
func (b *nsBase) close() {
	for _, f := range b.files {
		f.Close()
	}
}

// plan is the base as a mountns plan.
func (b *nsBase) plan(n *nsMounter) mountns.Plan {
	pl := mountns.Plan{Links: b.links, Dirs: b.dirs, Root: n.base, RootSet: n.hasBase, Slots: n.nSlots}
	for _, h := range b.binds {
		pl.Binds = append(pl.Binds, mountns.Bind{Source: h.fd, Path: h.path, ReadOnly: h.ro, NoDev: h.nodev})
	}
	return pl
}

// nsBaseOf computes the pool's namespace base (see nsBase).
func (p *Pool) nsBaseOf() *nsBase {
	b := &nsBase{links: p.ns.links}
	if b.links == nil {
		b.links = mountns.HostLinks()
	}
	var binds []hostBind
	addPath := func(path string, ro bool) {
		// Only the devices' own binds (not read-only) let a device node
		// open: one beneath a runtime or system path, or /proc, does not.
		nodev := ro
		fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return // a runtime or system path that does not exist grants nothing either
		}
		b.files = append(b.files, os.NewFile(uintptr(fd), path))
		real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
		if err != nil || !filepath.IsAbs(real) {
			return
		}
		binds = append(binds, hostBind{real, fd, ro, nodev})
		// A system file that is itself a link (/etc/localtime) is shown
		// at its own path too, when its directory is no link (a linked
		// directory, /lib, is one of the host's top-level links, which
		// the namespace has too).
		var st unix.Stat_t
		if real != path && unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if dir, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil && dir == filepath.Dir(path) {
				binds = append(binds, hostBind{path, fd, ro, nodev})
			}
		}
	}
	for _, path := range p.info.RuntimePaths {
		addPath(path, true)
	}
	for _, path := range worker.SystemPaths() {
		addPath(path, true)
	}
	for _, path := range []string{"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"} {
		addPath(path, false)
	}
	addPath("/proc", true)
	b.binds = dedupBinds(binds)
	// The pool's working directory (the job's), as an empty directory
	// unless a bind shows it, so that the job starts there and relative
	// paths to its grants resolve as on the host. (A job's grant or mount
	// that shows it is mounted over it.)
	if cwd := p.cfg.Dir; filepath.IsAbs(cwd) && cwd != "/" {
		shown := false
		for _, h := range b.binds {
			shown = shown || beneath(cwd, h.path)
		}
		if !shown {
			b.dirs = []string{cwd}
		}
	}
	return b
}

// dedupBinds sorts binds by path and drops each one beneath (or at)
// another's path: a host path inside another is seen through the outer
// bind (and its Landlock rule, being on the inode, still matches); binding
// it again would make its mountpoint inside a host directory. Of two
// binds at one path, a writable one makes the kept one writable (and,
// without nodev, as a grant is, the kept one without).
func dedupBinds(binds []hostBind) []hostBind {
	binds = slices.Clone(binds)
	slices.SortStableFunc(binds, func(a, b hostBind) int { return strings.Compare(a.path, b.path) })
	var kept []hostBind
	for _, b := range binds {
		if len(kept) > 0 && beneath(b.path, kept[len(kept)-1].path) {
			if b.path == kept[len(kept)-1].path && !b.ro {
				kept[len(kept)-1].ro = false
				// A writable grant at a read-only base bind's path is
				// the grant there (as a prepared namespace mounts it).
				kept[len(kept)-1].nodev = kept[len(kept)-1].nodev && b.nodev
			}
			continue
		}
		kept = append(kept, b)
	}
	return kept
}

// nsStock is how many prepared namespaces the pool's mounter keeps: one
// per worker, at least two.
func (p *Pool) nsStock() int {
	return min(max(p.cfg.Workers, 2), mountns.MaxStock)
}

// prepared returns the pool's namespace base, computing it and handing it
// to the mounter (mountns.Mounter.Prepare) at the first call, and whether
// the mounter took it: if not, every namespace is built whole. The base
// is nil once the pool has closed.
func (p *Pool) prepared(m *mountns.Mounter) (*nsBase, bool) {
	n := &p.ns
	n.prepOnce.Do(func() {
		n.prepBase = p.nsBaseOf()
		n.prepErr = m.Prepare(n.prepBase.plan(n), p.nsStock())
	})
	return n.prepBase, n.prepErr == nil
}

// buildNS builds the plan's mount namespace (a new one, when it had one):
// the pool's base (see nsBase: the interpreter's runtime paths, the
// system paths, the devices, /proc read-only, the host's top-level
// symbolic links, the working directory), the job's grants and scratch
// directory at their host paths, and the job's mounts at their paths.
// Nothing else of the host is in it. The mounter attaches the job's part
// to a namespace it prepared from the base beforehand.
func (p *Pool) buildNS(pl *plan) *Error {
	pl.dropNS()
	m, plan, rules, rerr := p.nsPlanOnce(pl)
	if rerr != nil {
		return rerr
	}
	if m.Prepared() {
		// A namespace attached ahead with exactly the job's part (see
		// nsmount_ahead.go) is taken as it is.
		took, fill := p.takeAhead(pl, plan, rules, nil, true)
		pl.aheadFill = pl.aheadFill || fill
		if took {
			return nil
		}
	}
	ns, err := m.Build(plan)
	if err != nil {
		return newError(KindSandboxSetup, "mounts: the job's mount namespace could not be built: %v; no code ran", err)
	}
	pl.ns = ns
	pl.job.Namespace = &worker.Namespace{User: int(ns.User.Fd()), Mount: int(ns.Mount.Fd()), Rules: rules}
	return nil
}

// nsLeaseHold is a lease taken for a job: used says its attach ran, or
// it was released; whichever comes first, the other does nothing.
type nsLeaseHold struct {
	l    *worker.NSLease
	used atomic.Bool
}

// nsFor gives pl's job the mount namespace it runs in with child: when
// child entered a leased namespace ahead of its job (worker.NSLease), the
// mounter attaches the job's part (the plan buildNS would send) to that
// namespace once the job is sent to child, which waits for it
// (worker.Namespace.Attach); otherwise buildNS builds one
// for the job, which child enters when the job arrives. On an error no
// code may run in child: the caller closes it.
func (p *Pool) nsFor(pl *plan, child *worker.Child) *Error {
	l := child.TakeNSLease()
	if l == nil {
		return p.buildNS(pl)
	}
	pl.dropNS()
	m, plan, rules, rerr := p.nsPlanOnce(pl)
	if rerr == nil && !m.Prepared() {
		rerr = newError(KindSandboxSetup, "mounts: the pool's mounter holds no prepared namespaces; no code ran")
	}
	if rerr != nil {
		l.Release()
		return rerr
	}
	if ahead, ok := l.Data.(*nsAhead); ok {
		p.unlend(ahead)
		// A namespace attached ahead (nsmount_ahead.go): the job runs in
		// it as it is when it holds exactly the job's part; else the
		// mounter replaces that part with the job's.
		took, fill := p.takeAhead(pl, plan, rules, ahead, true)
		pl.aheadFill = pl.aheadFill || fill
		if took {
			return nil
		}
		h := &nsLeaseHold{l: l}
		pl.nsLease = h
		attach := func() error {
			if !h.used.CompareAndSwap(false, true) {
				return errors.New("mounts: the job's leased namespace was released; no code ran")
			}
			err := m.Reattach(int(ahead.ns.Mount.Fd()), ahead.paths, plan)
			if err == nil {
				p.ns.ahead.count(&p.ns.ahead.reattached)
			}
			// The namespace ahead's descriptors and scratch directory (its
			// bind is detached, or the namespace goes with the process).
			go l.Release()
			if err != nil {
				return fmt.Errorf("mounts: the job's mount namespace could not be built: %v", err)
			}
			return nil
		}
		pl.job.Namespace = &worker.Namespace{Entered: true, Rules: rules, Attach: attach}
		return nil
	}
	// The job's part counts for what the pool attaches ahead.
	_, fill := p.takeAhead(pl, plan, rules, nil, false)
	pl.aheadFill = pl.aheadFill || fill
	// The attach runs once the job is sent, while the spare confines
	// itself; the spare waits for it before anything else (see
	// worker.Namespace.Attach).
	h := &nsLeaseHold{l: l}
	pl.nsLease = h
	attach := func() error {
		if !h.used.CompareAndSwap(false, true) {
			return errors.New("mounts: the job's leased namespace was released; no code ran")
		}
		if err := m.Attach(l.ID, plan); err != nil {
			return fmt.Errorf("mounts: the job's mount namespace could not be built: %v", err)
		}
		return nil
	}
	pl.job.Namespace = &worker.Namespace{Entered: true, Rules: rules, Attach: attach}
	return nil
}

// nsLease leases a prepared namespace for a template's ready ns spare
// (worker.Options.NSLease), making the pool's namespace base and handing
// it to the mounter first if no job did yet.
func (p *Pool) nsLease() (*worker.NSLease, error) {
	m, err := p.ns.get()
	if err != nil {
		return nil, err
	}
	// A namespace attached ahead, while the pool attaches them
	// (nsmount_ahead.go); while one is being attached, the spare asks
	// again a little later.
	if l, busy := p.leaseAhead(); l != nil {
		return l, nil
	} else if busy {
		return nil, worker.ErrNSLeaseBusy
	}
	if base, ok := p.prepared(m); base == nil || !ok {
		return nil, errors.New("the mounter holds no prepared namespaces")
	}
	id, user, mount, err := m.LeaseFDs()
	if errors.Is(err, mountns.ErrNoneReady) {
		return nil, worker.ErrNSLeaseBusy
	}
	if err != nil {
		return nil, err
	}
	return &worker.NSLease{User: user, Mount: mount, ID: id,
		Release: func() { _ = m.Release(id) }}, nil
}

// nsPlanned is a plan's namespace plan as nsCheck made it, before the
// job took a process: the first nsFor or buildNS after uses it.
type nsPlanned struct {
	m     *mountns.Mounter
	plan  mountns.Plan
	rules []worker.NSRule
}

// nsCheck makes pl's namespace plan (nsPlan) before its job or session
// takes a process, so that a request whose mounts cannot be (they
// overlap what the job sees from the host, or each other, or make too
// many directories) is refused without costing a ready ns spare and the
// namespace it entered.
func (p *Pool) nsCheck(pl *plan) *Error {
	m, plan, rules, err := p.nsPlan(pl)
	if err != nil {
		return err
	}
	pl.nsPlanned = &nsPlanned{m, plan, rules}
	return nil
}

// nsPlanOnce returns the plan nsCheck made for pl, once, or else makes
// one (a second process for the same job or session).
func (p *Pool) nsPlanOnce(pl *plan) (*mountns.Mounter, mountns.Plan, []worker.NSRule, *Error) {
	if c := pl.nsPlanned; c != nil {
		pl.nsPlanned = nil
		return c.m, c.plan, c.rules, nil
	}
	return p.nsPlan(pl)
}

// nsPlan checks pl's mounts against what the job sees from the host and
// returns the running mounter and what it is to build for pl's job: the
// job's part when the mounter holds prepared namespaces, else the whole
// namespace; and the Landlock rules on the namespace's own mounts.
func (p *Pool) nsPlan(pl *plan) (*mountns.Mounter, mountns.Plan, []worker.NSRule, *Error) {
	var plan mountns.Plan
	m, err := p.ns.get()
	if err != nil {
		return nil, plan, nil, newError(KindSandboxSetup, "mounts: the pool's mounter could not start: %v; no code ran", err)
	}
	base, prepared := p.prepared(m)
	if base == nil {
		return nil, plan, nil, newError(KindSandboxSetup, "mounts: the pool is closed; no code ran")
	}
	virtual := map[int]bool{}
	for _, mt := range pl.nsMounts {
		virtual[mt.fd] = true
	}
	writeBits := sandbox.WriteAccess(p.info.Landlock.ABI) &^ sandbox.ReadAccess(p.info.Landlock.ABI)
	var grants []hostBind
	for i, fd := range pl.fds {
		if virtual[fd] {
			continue
		}
		real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
		if err != nil || !filepath.IsAbs(real) {
			return nil, plan, nil, newError(KindSandboxSetup, "mounts: a grant's descriptor cannot be resolved; no code ran")
		}
		grants = append(grants, hostBind{path: real, fd: fd, ro: pl.accessOf[i]&writeBits == 0})
	}
	// kept is what the job sees from the host, base and grants together.
	kept := dedupBinds(append(slices.Clone(base.binds), grants...))
	var rules []worker.NSRule
	for _, mt := range pl.nsMounts {
		for _, b := range kept {
			if beneath(mt.path, b.path) || beneath(b.path, mt.path) {
				return nil, plan, nil, newError(KindSandboxSetup, "mounts: %s overlaps %s, which the job sees from the host; "+
					"choose a path outside it; no code ran", mt.path, b.path)
			}
		}
		if mt.overlay {
			plan.Overlays = append(plan.Overlays, mountns.Overlay{Lower: mt.fd, Path: mt.path, Limit: mt.limit})
			rules = append(rules, worker.NSRule{Path: mt.path, Access: sandbox.WriteAccess(p.info.Landlock.ABI)})
		} else {
			// A job's mount is nodev, as its overlay and the base binds
			// are: a device node in the host directory opens in no job.
			plan.Binds = append(plan.Binds, mountns.Bind{Source: mt.fd, Path: mt.path, ReadOnly: mt.ro, NoDev: true})
		}
	}
	for i, a := range pl.nsMounts {
		for _, b := range pl.nsMounts[i+1:] {
			if beneath(a.path, b.path) || beneath(b.path, a.path) {
				return nil, plan, nil, newError(KindSandboxSetup, "mounts: %s and %s overlap; no code ran", a.path, b.path)
			}
		}
	}
	var hostBinds []hostBind
	if prepared {
		// The job's part: its grants, less those the base shows as they
		// are (beneath a base bind, or at one as writable as they are).
		// A grant at a base bind's path that must be writable, or one over
		// base binds, is mounted over them: the job sees the grant there,
		// as a whole build would show it.
		for _, g := range dedupBinds(grants) {
			seen := false
			for _, b := range base.binds {
				if beneath(g.path, b.path) && (g.path != b.path || g.ro || !b.ro) {
					seen = true
				}
			}
			if !seen {
				hostBinds = append(hostBinds, g)
			}
		}
	} else {
		hostBinds = kept
		plan.Links = base.links
		plan.Root, plan.RootSet, plan.Slots = p.ns.base, p.ns.hasBase, p.ns.nSlots
		// The working directory, unless a grant or a mount shows it.
		for _, d := range base.dirs {
			shown := false
			for _, b := range kept {
				shown = shown || beneath(d, b.path)
			}
			for _, mt := range pl.nsMounts {
				shown = shown || beneath(d, mt.path)
			}
			if !shown {
				plan.Dirs = append(plan.Dirs, d)
			}
		}
	}
	hb := make([]mountns.Bind, 0, len(hostBinds)+len(plan.Binds))
	for _, b := range hostBinds {
		hb = append(hb, mountns.Bind{Source: b.fd, Path: b.path, ReadOnly: b.ro, NoDev: b.nodev})
	}
	plan.Binds = append(hb, plan.Binds...)
	var paths []string
	for _, b := range plan.Binds {
		paths = append(paths, b.Path)
	}
	for _, o := range plan.Overlays {
		paths = append(paths, o.Path)
	}
	if n := nsEntries(append(paths, plan.Dirs...), nsMaxEntries); n > nsMaxEntries {
		return nil, plan, nil, newError(KindSandboxSetup, "mounts: the paths of the job's mounts and grants make more than %d directories "+
			"in its mount namespace (each path and each directory above it counts once); choose shorter paths; no code ran", nsMaxEntries)
	}
	return m, plan, rules, nil
}

// takeNSSlot takes a place among the pool's jobSlots for pl's namespace,
// waiting for one; closeNS gives it back. It fails when ctx ends or the
// pool closes first. A one-shot job takes it before it waits for a
// worker, so that a job holding a worker never waits for a place.
func (p *Pool) takeNSSlot(ctx context.Context, pl *plan) error {
	slots := p.ns.jobSlots(p.nsJobSlots())
	select {
	case slots <- struct{}{}:
		pl.nsSlot = slots
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.life.Done():
		return errClosed()
	}
}

// takeFor takes the child a job's plan needs from tpl: the template's
// ready spare, or, for a job with a mount namespace, its ready ns spare
// (worker.Template.TakeNS), which the template keeps from its first job
// with a mount namespace on.
func (p *Pool) takeFor(tpl *worker.Template, pl *plan, cancel <-chan struct{}) (*worker.Child, error) {
	if pl.needsNS() {
		return tpl.TakeNS(pl.network, cancel)
	}
	return tpl.Take(pl.network, cancel)
}

// sessionNSChild returns a new process for a session whose mounts need a
// mount namespace: a namespace built for it (a replacement process gets
// a new one, its overlays empty, as its __main__ is) and a template's
// ready ns spare, or else a process forked for it alone (see
// worker.Template.TakeNSSession), which enters the namespace before its
// job layer. The replacement of a ready ns spare taken is asked for as
// sessionChild's is.
func (p *Pool) sessionNSChild(pl *plan, cancel <-chan struct{}) (*worker.Child, error) {
	if _, err := p.ns.get(); err != nil {
		return nil, newError(KindSandboxSetup, "mounts: the pool's mounter could not start: %v; no code ran", err)
	}
	// Checked before a process is taken (see nsCheck).
	if err := p.nsCheck(pl); err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		w, tpl := p.sessionNSTemplate(pl.network)
		if tpl == nil {
			var err error
			if tpl, err = w.template(); err != nil {
				return nil, err
			}
		}
		child, err := tpl.TakeNSSession(pl.network, cancel)
		if err == nil {
			// The namespace: the one the ready ns spare entered, with the
			// session's mounts attached now, or one built for it.
			if err := p.nsFor(pl, child); err != nil {
				child.Close()
				return nil, err
			}
			if pl.aheadFill {
				pl.aheadFill = false
				go p.fillAhead()
			}
			if p.waiting.Load() > 0 {
				// Jobs wait for a worker: the template's next ns spare
				// is needed now, not after the session's first step.
				child.RefillNow()
			}
			return child, nil
		}
		if isDone(cancel) {
			return nil, err
		}
		lastErr = err
	}
	return nil, lastErr
}

// sessionNSTemplate picks the template a session with a mount namespace
// takes its process from, as sessionTemplate does, preferring one that
// holds a ready ns spare (worker.Template.HasNSSpare).
func (p *Pool) sessionNSTemplate(network bool) (*poolWorker, *worker.Template) {
	return p.pickSessionTemplate(func(t *worker.Template) bool { return t.HasNSSpare(network) })
}
