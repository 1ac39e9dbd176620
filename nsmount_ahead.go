package pynox

import (
	"cmp"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/mountns"
	"github.com/pynox/pynox/internal/rawsys"
	"github.com/pynox/pynox/internal/worker"
)

// Namespaces attached ahead.
//
// A mount job's namespace needs the mounter to attach the job's part
// (its mounts, its grants and its scratch directory) to a prepared
// namespace: a round trip to the mounter and three process wake-ups on
// the job's path (about 1 ms on our 2-vCPU machines, most of a trivial
// job's time again), and, per job, the mounter's build of the next
// prepared namespace and the kernel's teardown of the last (some 2.5 ms
// of CPU). A pool whose mount jobs keep asking for the same mounts (an
// agent backend whose jobs all see a tenant's /data, say) pays it for
// nothing. Once two mount jobs in a row (one-shot jobs or sessions)
// asked for the same part, the pool attaches that part ahead, off any
// job's path, to one namespace, and, once a third job in a row asked
// for it, to up to one namespace per worker and one more; the
// templates' ready ns spares enter such a namespace before their job
// (as they enter a leased one otherwise: Pool.nsLease), and a job that
// asks for exactly that part runs in it as it is: no attach, no wait.
//
// "Exactly that part" is checked against the objects, not the names:
// each mount and grant source the job's request resolved (its own O_PATH
// descriptors, opened when it was accepted) must be the very directory
// or file the namespace shows there (the same type, device and inode, on
// the same mount by the kernel's never-reused mount id), at the same
// path, with the same mode, flags and overlay size, and with the same
// Landlock rules on the namespace's own mounts; and no mount may have
// been made or removed in the pool's mount namespace since the namespace
// ahead was attached (the kernel's change mark on /proc/self/mountinfo,
// POLLPRI), so that a file system mounted or unmounted under a source
// since shows as a fresh attach would show it. The job's scratch
// directory is never shared: each namespace ahead holds one of its own,
// empty, which the job takes over as its scratch directory (TMPDIR, HOME
// and PYNOX_OUTPUTS follow it). Overlays ahead are empty, as a fresh
// one is.
//
// A job whose part differs (or a namespace ahead made stale by a mount
// change) in a spare that entered a namespace ahead gets its own part
// through the mounter's reattach (mountns.Mounter.Reattach): the part
// held is detached and its mountpoints removed (no name of it stays),
// then the job's is attached, the root made read-only last, as an attach
// to a leased namespace does; the spare waits for it before anything
// else. The pool then stops attaching ahead until a part repeats again.
//
// A one-shot job's namespace that holds no overlay comes back once the
// job's process has exited and been reaped (nothing of the job can act
// any more: jobs cannot fork), its scratch directory emptied in place
// (as the pool empties one before another job gets it), and serves a
// later job asking for the same part: no new namespace is built and none
// is torn down. Nothing a job could change stays in it: its mounts and
// root are beyond the job's reach (no capability, seccomp, a read-only
// root), its binds are the host's own directories (a read-write one is
// the host's directory for every job given it), and the scratch
// directory is emptied first.
//
// What the pool keeps meanwhile: copies of the last part's source
// descriptors and the namespaces ahead, which hold clones of the
// sources' mounts: the host's unmount of a source's file system is not
// busy for them, but the file system lives on (as after a lazy unmount)
// until they go: nsAheadIdle after the last mount job, when the pool
// drops those it holds and replaces the ready ns spares that entered one
// (review 28: TestHostileReview28IdleSourcePinned). A job with
// /proc in its grants sees, in a ready ns spare's mountinfo, the part
// the pool's jobs keep asking for, as it sees a running job's mounts.

// nsAheadIdle is how long a pool keeps attaching ahead after its last
// mount job.
const nsAheadIdle = 30 * time.Second

// nsIdent identifies a file: its type, device and inode, and the mount
// it was reached on.
type nsIdent struct {
	mode     uint16
	dev, ino uint64
	mnt      uint64
}

// identOf returns fd's identity; false when the kernel cannot give a
// mount id that is never reused.
func identOf(fd int) (nsIdent, bool) {
	var st unix.Statx_t
	err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW,
		unix.STATX_TYPE|unix.STATX_INO|unix.STATX_MNT_ID_UNIQUE, &st)
	if err != nil || st.Mask&unix.STATX_MNT_ID_UNIQUE == 0 || st.Mask&unix.STATX_INO == 0 {
		return nsIdent{}, false
	}
	return nsIdent{mode: st.Mode & unix.S_IFMT, dev: unix.Mkdev(st.Dev_major, st.Dev_minor), ino: st.Ino, mnt: st.Mnt_id}, true
}

// nsKeyEntry is one bind or overlay of a job's part.
type nsKeyEntry struct {
	ident     nsIdent // zero for the scratch directory
	path      string  // zero for the scratch directory
	ro, nodev bool
	overlay   bool
	limit     int64
	scratch   bool
}

// nsKey is what a job's part of its namespace shows: its binds and
// overlays in order, and the Landlock rules on the namespace's own
// mounts.
type nsKey struct {
	entries []nsKeyEntry
	rules   []worker.NSRule
}

func (k *nsKey) equal(o *nsKey) bool {
	return slices.Equal(k.entries, o.entries) && slices.Equal(k.rules, o.rules)
}

// nsKeyOf returns the key of a job's part (a prepared mounter's plan),
// whose scratch directory's descriptor is scratchFd; false when the
// part cannot be attached ahead (no scratch directory, a source without
// a unique mount id, a path at or around the pool's scratch directory).
func nsKeyOf(plan mountns.Plan, rules []worker.NSRule, scratchFd int, scratchPath string) (*nsKey, bool) {
	if scratchFd < 0 || len(plan.Links) > 0 || len(plan.Dirs) > 0 || plan.RootSet {
		return nil, false
	}
	k := &nsKey{rules: slices.Clone(rules)}
	// source identifies a mount's source shown at path, which must lie
	// neither at nor around the pool's scratch directory.
	source := func(fd int, path string) (nsIdent, bool) {
		if beneath(path, scratchPath) || beneath(scratchPath, path) {
			return nsIdent{}, false
		}
		return identOf(fd)
	}
	scratch := 0
	for _, b := range plan.Binds {
		if b.Source == scratchFd {
			scratch++
			k.entries = append(k.entries, nsKeyEntry{scratch: true, ro: b.ReadOnly, nodev: b.NoDev})
			continue
		}
		id, ok := source(b.Source, b.Path)
		if !ok {
			return nil, false
		}
		k.entries = append(k.entries, nsKeyEntry{ident: id, path: b.Path, ro: b.ReadOnly, nodev: b.NoDev})
	}
	for _, o := range plan.Overlays {
		id, ok := source(o.Lower, o.Path)
		if !ok {
			return nil, false
		}
		k.entries = append(k.entries, nsKeyEntry{ident: id, path: o.Path, overlay: true, limit: o.Limit})
	}
	if scratch != 1 {
		return nil, false
	}
	return k, true
}

// nsSource is the plan namespaces ahead are attached from: a job's part
// with copies of its sources' descriptors (the scratch bind's is
// replaced per namespace). refs counts the attaches using it; its
// descriptors close once it is dropped and none does.
type nsSource struct {
	key     *nsKey
	plan    mountns.Plan
	fds     []int
	refs    int
	dropped bool
	// made counts the namespaces attached ahead from it: until a third
	// job in a row asks for the part, only one is (a prediction that
	// another part breaks at once, A A B A A B..., then costs the mounter
	// one attach, not aheadTarget and the spares' of them; review 31).
	made int
}

// newNSSource copies plan's source descriptors but the scratch
// directory's.
func newNSSource(key *nsKey, plan mountns.Plan, scratchFd int) (*nsSource, bool) {
	s := &nsSource{key: key, plan: mountns.Plan{Binds: slices.Clone(plan.Binds), Overlays: slices.Clone(plan.Overlays)}}
	dup := func(fd int) (int, bool) {
		n, err := dupFD(fd)
		if err != nil {
			return -1, false
		}
		s.fds = append(s.fds, n)
		return n, true
	}
	for i := range s.plan.Binds {
		b := &s.plan.Binds[i]
		if b.Source == scratchFd {
			b.Source, b.Path = -1, ""
			continue
		}
		var ok bool
		if b.Source, ok = dup(b.Source); !ok {
			s.close()
			return nil, false
		}
	}
	for i := range s.plan.Overlays {
		o := &s.plan.Overlays[i]
		var ok bool
		if o.Lower, ok = dup(o.Lower); !ok {
			s.close()
			return nil, false
		}
	}
	return s, true
}

func (s *nsSource) close() {
	for _, fd := range s.fds {
		rawsys.Close(fd)
	}
	s.fds = nil
}

// with returns the plan with the scratch bind naming fd at path.
func (s *nsSource) with(fd int, path string) mountns.Plan {
	p := mountns.Plan{Binds: slices.Clone(s.plan.Binds), Overlays: s.plan.Overlays}
	for i := range p.Binds {
		if p.Binds[i].Source == -1 {
			p.Binds[i].Source, p.Binds[i].Path = fd, path
		}
	}
	return p
}

// nsAhead is a namespace attached ahead, with its scratch directory.
type nsAhead struct {
	ns      *mountns.Namespace
	key     *nsKey   // the part it holds
	paths   []string // the paths of that part's binds and overlays
	gen     uint64   // the mount change count before its attach began
	scratch string   // its scratch directory's name in the pool's scratch root
	fd      int      // that directory's O_PATH descriptor
	// lent says a ready ns spare holds it (leaseAhead) and no job took
	// that spare yet: nsAheads.lent counts these.
	lent atomic.Bool
}

// nsAheads is a pool's namespaces attached ahead and what predicts them.
type nsAheads struct {
	mu       sync.Mutex
	watch    int // /proc/self/mountinfo, polled for mount changes, when watching
	watching bool
	gen      uint64 // mount changes seen
	last     *nsKey // the last mount job's part
	streak   int    // how many mount jobs in a row asked for last
	src      *nsSource
	ready    []*nsAhead
	filling  bool
	closed   bool
	used     time.Time
	idle     *time.Timer
	// off turns attaching ahead off (tests of the leased path set it
	// before the pool's first mount job); idleAfter, when set, replaces
	// nsAheadIdle. took counts the namespaces ahead jobs took.
	off       bool
	idleAfter time.Duration
	took      int
	tookOffer int
	// recycling counts the namespaces ahead that one-shot jobs took and
	// that come back once their processes are gone (recycleAhead).
	recycling int
	recycled  int    // how many came back
	failed    *nsKey // a part whose attach ahead failed: not attached ahead again while it repeats
	failures  int    // attaches ahead that failed
	attached  int    // attaches ahead that succeeded
	// reattached counts the namespaces ahead whose job asked for other
	// mounts (the mounter replaced the part they held).
	reattached int
	// lent counts the namespaces ahead that ready ns spares hold
	// (nsAhead.lent): aheadIdle retires them until none is left.
	lent int
	// leased, when set (tests), is called after a namespace ahead is
	// taken for a spare's lease, before the spare is sent it.
	leased func()
}

// popReadyLocked takes the first namespace ahead attached since the
// mount change count gen (none made stale since), returning those it
// passed on the way for the caller to discard outside the lock.
func (a *nsAheads) popReadyLocked(gen uint64) (got *nsAhead, stale []*nsAhead) {
	for len(a.ready) > 0 && got == nil {
		n := a.ready[0]
		a.ready = a.ready[1:]
		if n.gen == gen {
			got = n
		} else {
			stale = append(stale, n)
		}
	}
	return got, stale
}

// dupFD returns a close-on-exec copy of fd.
func dupFD(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// count adds one to a counter of a's, under its lock.
func (a *nsAheads) count(n *int) {
	a.mu.Lock()
	*n++
	a.mu.Unlock()
}

// idleLocked says whether no mount job came for idleFor.
func (a *nsAheads) idleLocked() bool { return time.Since(a.used) >= a.idleFor() }

// idleFor is how long the pool attaches ahead after its last mount job.
func (a *nsAheads) idleFor() time.Duration { return cmp.Or(a.idleAfter, nsAheadIdle) }

// open starts watching the pool's mount namespace for changes; without
// the watch nothing is attached ahead. Called before the pool confines
// itself.
//
// The descriptor is a raw one, never the runtime poller's: an epoll
// instance watching it would take the change mark itself (the kernel
// clears it for whichever poll sees it first), and this poll would miss
// the change.
func (a *nsAheads) open() {
	fd, err := unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.watching || a.closed {
		rawsys.Close(fd)
		return
	}
	a.watch, a.watching = fd, true
}

// genLocked returns the count of mount changes in the pool's mount
// namespace seen so far: the kernel marks the mountinfo file POLLPRI
// once the namespace changed since it was last polled.
func (a *nsAheads) genLocked() uint64 {
	if !a.watching {
		a.gen++ // no watch (closed): as a change, nothing ahead is taken
		return a.gen
	}
	fds := []unix.PollFd{{Fd: int32(a.watch), Events: unix.POLLPRI}}
	n, err := unix.Poll(fds, 0)
	if err != nil || (n > 0 && fds[0].Revents&(unix.POLLPRI|unix.POLLERR|unix.POLLNVAL) != 0) {
		a.gen++ // an error counts as a change: nothing ahead is taken
	}
	return a.gen
}

// dropLocked stops attaching ahead and returns the namespaces ahead, for
// the caller to discard outside the lock.
func (a *nsAheads) dropLocked() []*nsAhead {
	if s := a.src; s != nil {
		s.dropped = true
		if s.refs == 0 {
			s.close()
		}
		a.src = nil
	}
	r := a.ready
	a.ready = nil
	return r
}

// discard releases namespaces ahead no job took.
func (p *Pool) discardAhead(r []*nsAhead) {
	for _, n := range r {
		n.ns.Close()
		rawsys.Close(n.fd)
		p.scratch.remove(n.scratch)
	}
}

// close drops everything ahead; nothing is attached ahead afterwards.
func (p *Pool) closeAhead() {
	a := &p.ns.ahead
	a.mu.Lock()
	a.closed = true
	r := a.dropLocked()
	if a.idle != nil {
		a.idle.Stop()
	}
	if a.watching {
		rawsys.Close(a.watch)
		a.watching = false
	}
	a.mu.Unlock()
	p.discardAhead(r)
}

// takeAhead notes the job's part of pl's namespace for the prediction
// and, with take, when a namespace attached ahead shows exactly that
// part, gives it to pl (its scratch directory becomes pl's): true then.
// offer is the namespace attached ahead that the job's process entered
// already, if any: only it may be taken then. fill says a
// namespace ahead should be attached once the job is answered
// (Pool.fillAhead).
func (p *Pool) takeAhead(pl *plan, plan mountns.Plan, rules []worker.NSRule, offer *nsAhead, take bool) (took, fill bool) {
	a := &p.ns.ahead
	if pl.scratchRoot == nil || p.scratch == nil {
		return false, false
	}
	key, ok := nsKeyOf(plan, rules, pl.scratchFd, p.scratch.path)
	a.mu.Lock()
	if !a.watching || a.closed || a.off {
		a.mu.Unlock()
		return false, false
	}
	var stale []*nsAhead
	defer func() { p.discardAhead(stale) }()
	defer a.mu.Unlock()
	a.used = time.Now()
	if a.idle == nil {
		a.idle = time.AfterFunc(a.idleFor(), p.aheadIdle)
	} else {
		a.idle.Reset(a.idleFor())
	}
	if !ok {
		a.last, a.streak = nil, 0
		stale = a.dropLocked()
		return false, false
	}
	if a.last != nil && a.last.equal(key) {
		a.streak++
	} else {
		a.last, a.streak, a.failed = key, 1, nil
		stale = a.dropLocked()
	}
	if a.streak < 2 || (a.failed != nil && a.failed.equal(key)) {
		return false, false
	}
	if a.src == nil {
		if a.src, ok = newNSSource(key, plan, pl.scratchFd); !ok {
			return false, false
		}
	}
	fill = p.wantLocked()
	if !take {
		return false, fill
	}
	gen := a.genLocked()
	var got *nsAhead
	if offer != nil {
		if offer.key.equal(key) && offer.gen == gen {
			got = offer
		}
	}
	if offer == nil {
		got, stale = a.popReadyLocked(gen)
	}
	if got == nil {
		return false, p.wantLocked()
	}
	if err := pl.swapScratch(got.scratch, got.fd); err != nil {
		if got != offer {
			stale = append(stale, got)
		}
		return false, p.wantLocked()
	}
	if got == offer {
		a.tookOffer++
		pl.job.Namespace = &worker.Namespace{Entered: true, Rules: rules}
	} else {
		pl.job.Namespace = &worker.Namespace{User: int(got.ns.User.Fd()), Mount: int(got.ns.Mount.Fd()), Rules: rules}
	}
	a.took++
	if !pl.job.Session && !slices.ContainsFunc(key.entries, func(e nsKeyEntry) bool { return e.overlay }) {
		// A one-shot job's namespace without overlays comes back once
		// its process is gone (recycleAhead).
		pl.aheadNS = &nsAhead{ns: got.ns, key: got.key, paths: got.paths, gen: got.gen, fd: -1}
		pl.recycle = p.recycleAhead
		a.recycling++
	} else if got == offer {
		// Its process entered it: the pool's descriptors go.
		got.ns.Close()
	} else {
		pl.ns = got.ns
	}
	return true, p.wantLocked()
}

// leaseAhead hands a ready ns spare a namespace attached ahead to enter
// before its job (Pool.nsLease): nil when none is ready; busy says one
// is being attached (the spare asks again a little later).
func (p *Pool) leaseAhead() (l *worker.NSLease, busy bool) {
	a := &p.ns.ahead
	a.mu.Lock()
	if a.src == nil || a.closed || a.off {
		a.mu.Unlock()
		return nil, false
	}
	got, stale := a.popReadyLocked(a.genLocked())
	leased := a.leased
	if got != nil {
		got.lent.Store(true)
		a.lent++
	}
	// None ready: one being attached is waited for; else one is started
	// when the pool holds fewer than it keeps (the jobs' namespaces that
	// come back count: a long job's does not come back before it ends,
	// so a spare does not wait for it).
	fill := !a.filling && p.wantLocked()
	busy = a.filling || (got == nil && fill)
	a.mu.Unlock()
	p.discardAhead(stale)
	if got == nil {
		if fill {
			go p.fillAhead()
		}
		return nil, busy
	}
	if leased != nil {
		leased()
	}
	release := func() {
		p.unlend(got)
		p.discardAhead([]*nsAhead{got})
	}
	user, err := dupFD(int(got.ns.User.Fd()))
	if err != nil {
		release()
		return nil, false
	}
	mount, err := dupFD(int(got.ns.Mount.Fd()))
	if err != nil {
		rawsys.Close(user)
		release()
		return nil, false
	}
	return &worker.NSLease{User: user, Mount: mount, Data: got, Release: release}, false
}

// unlend notes that n, a namespace ahead leased to a ready ns spare, is
// no longer a spare's (its job took the spare, or the lease ended).
func (p *Pool) unlend(n *nsAhead) {
	if n.lent.CompareAndSwap(true, false) {
		a := &p.ns.ahead
		a.mu.Lock()
		a.lent--
		a.mu.Unlock()
	}
}

// recycleAhead takes back n, a namespace attached ahead that a one-shot
// job took (it holds no overlay), once the job's process has exited
// (exited; reaped: nothing of the job can act any more): with scratch,
// the job's scratch directory, emptied in place, it goes back among the
// namespaces ready for the next job asking for the same part, which
// then costs no attach, no new namespace and no teardown. Nothing the
// job could change remains: the namespace's mounts and root were beyond
// its reach (no capability, seccomp, a read-only root), its binds are
// the host's (a read-write one is the host's directory for every job
// given it), and its scratch directory is emptied first, as when the
// pool gives a scratch directory to another job. Otherwise (the process
// did not exit, the part is no longer the one attached ahead, the
// directory cannot be emptied, scratch is "") it is dropped, and the
// scratch directory too (unless "", whose owner keeps it).
func (p *Pool) recycleAhead(n *nsAhead, scratch string, exited bool) {
	a := &p.ns.ahead
	fd := -1
	kept := exited && scratch != "" && p.scratch.reset(scratch, false) == nil
	if kept {
		var err error
		if fd, err = p.scratch.open(scratch); err != nil {
			kept = false
		}
	}
	a.mu.Lock()
	a.recycling--
	if kept && !a.closed && !a.off && a.src != nil && a.src.key.equal(n.key) && len(a.ready) < p.aheadTarget() {
		n.scratch, n.fd = scratch, fd
		a.ready = append(a.ready, n)
		a.recycled++
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	n.ns.Close()
	if fd >= 0 {
		rawsys.Close(fd)
	}
	switch {
	case scratch == "":
	case kept:
		p.scratch.release(scratch)
	default:
		p.scratch.remove(scratch)
	}
}

// aheadIdle stops attaching ahead once no mount job came for nsAheadIdle.
func (p *Pool) aheadIdle() {
	a := &p.ns.ahead
	a.mu.Lock()
	var r []*nsAhead
	idle := a.idleLocked()
	if idle {
		a.last, a.streak = nil, 0
		r = a.dropLocked()
	}
	a.mu.Unlock()
	p.discardAhead(r)
	if !idle {
		return
	}
	p.retireAheadSpares(0)
}

// retireAheadSpares has the templates' ready ns spares that sit in
// namespaces ahead give them back (their replacements lease plain
// ones): else each kept the sources' file systems alive until its next
// job, however long the pool then idled (review 28). A spare that was
// leasing one as the pool went idle is not yet where RetireNSSpares
// looks (the template's channel, or its lease): while spares still hold
// namespaces ahead, it looks again a little later (try counts the
// rounds; a few seconds at most), until a job comes.
func (p *Pool) retireAheadSpares(try int) {
	a := &p.ns.ahead
	// still says the pool is still idle (no mount job came: its spares
	// may hold its part) and, with lent, that spares hold namespaces ahead.
	still := func(lent bool) bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.src == nil && !a.closed && a.idleLocked() && (!lent || a.lent > 0)
	}
	if try > 0 && !still(false) {
		return
	}
	for _, w := range p.workers {
		if tpl := w.live.Load(); tpl != nil {
			tpl.RetireNSSpares(func(l *worker.NSLease) bool {
				n, ahead := l.Data.(*nsAhead)
				if !ahead {
					return false
				}
				// Not one holding the part of a streak begun since.
				a.mu.Lock()
				defer a.mu.Unlock()
				return a.src == nil || !a.src.key.equal(n.key)
			})
		}
	}
	if try < aheadRetireTries && still(true) {
		time.AfterFunc(aheadRetireEvery, func() { p.retireAheadSpares(try + 1) })
	}
}

// aheadRetireEvery and aheadRetireTries pace retireAheadSpares' rounds.
const (
	aheadRetireEvery = 10 * time.Millisecond
	aheadRetireTries = 500
)

// wantLocked says whether one more namespace should be attached ahead:
// the pool holds fewer than aheadTarget; while only two jobs in a row
// asked for the part, one at most is attached (nsSource.made).
func (p *Pool) wantLocked() bool {
	a := &p.ns.ahead
	if a.src == nil {
		return false
	}
	if a.streak < 3 {
		return a.src.made < 1 && len(a.ready)+a.recycling < 1
	}
	return len(a.ready)+a.recycling < p.aheadTarget()
}

// aheadTarget is how many namespaces a pool keeps attached ahead: one
// per worker and one more, for the next job while a finished job's
// comes back (recycleAhead).
func (p *Pool) aheadTarget() int { return max(p.cfg.Workers, 1) + 1 }

// fillAhead attaches namespaces ahead until the pool holds aheadTarget
// of them, while it predicts a part (one filler at a time).
func (p *Pool) fillAhead() {
	a := &p.ns.ahead
	a.mu.Lock()
	if a.filling {
		a.mu.Unlock()
		return
	}
	a.filling = true
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.filling = false
		a.mu.Unlock()
	}()
	for {
		a.mu.Lock()
		src := a.src
		if a.closed || src == nil || !p.wantLocked() {
			a.mu.Unlock()
			return
		}
		src.refs++
		gen := a.genLocked()
		a.mu.Unlock()
		n, ok := p.attachAhead(src)
		a.mu.Lock()
		src.refs--
		var stale []*nsAhead
		if !ok && a.src == src {
			// A part that cannot be attached (a mount path under one of
			// the host's top-level links, say, which every attach
			// refuses) is not tried again while jobs keep asking for it:
			// spares take plain leases, and each job's attach fails
			// alone, as before.
			a.failed = src.key
			a.failures++
			stale = a.dropLocked()
		}
		if src.dropped && src.refs == 0 {
			src.close()
		}
		if ok {
			a.attached++
			src.made++
		}
		keep := ok && !a.closed && a.src == src
		if keep {
			n.gen = gen
			a.ready = append(a.ready, n)
		}
		a.mu.Unlock()
		if !ok {
			p.discardAhead(stale)
			return
		}
		if !keep {
			p.discardAhead([]*nsAhead{n})
			return
		}
	}
}

// attachAhead attaches src's part, with a fresh scratch directory, to a
// prepared namespace.
func (p *Pool) attachAhead(src *nsSource) (*nsAhead, bool) {
	m, err := p.ns.get()
	if err != nil || !m.Prepared() {
		return nil, false
	}
	name, fd, err := p.scratch.create()
	if err != nil {
		return nil, false
	}
	dir := p.scratch.dir(name)
	fail := func() (*nsAhead, bool) {
		rawsys.Close(fd)
		p.scratch.remove(name)
		return nil, false
	}
	// The bind's path is what the job's own would be: the directory
	// as its descriptor names it (see nsPlan).
	real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil || real != dir {
		return fail()
	}
	ns, err := m.Build(src.with(fd, real))
	if err != nil {
		return fail()
	}
	var paths []string
	for _, b := range src.plan.Binds {
		paths = append(paths, b.Path)
	}
	for _, o := range src.plan.Overlays {
		paths = append(paths, o.Path)
	}
	paths[slices.IndexFunc(src.plan.Binds, func(b mountns.Bind) bool { return b.Source == -1 })] = real
	return &nsAhead{ns: ns, key: src.key, paths: paths, scratch: name, fd: fd}, true
}
