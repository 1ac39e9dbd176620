package pynox

import (
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The empty-outputs check of a session's steps, through inotify.
//
// Each session step checks whether its outputs directory ($PYNOX_OUTPUTS)
// holds anything before it scans it (collect_fast.go: outputsEmpty): an
// openat2 beneath the scratch root, two getdents64 and a close, some 15 µs
// of the host's work between a step's report and its result in a profile
// of back-to-back steps (issue 12), most of it the open (its path walk and
// the pool's own Landlock checks) and the close. A session's plan now
// keeps an inotify watch on the directory the last full check read; while
// that check found it empty and the watch has reported nothing since, the
// directory is still empty and still the one at its path, and the step's
// check is one read of the pool's inotify instance (EAGAIN). Any event at
// all for the watch (an entry made or moved in, the directory moved,
// removed, replaced or its attributes changed, the watch dropped) and an
// overflow of the instance's queue make the next check a full one, as
// before; so does any failure to make the instance or the watch, which
// then leaves every check as it was.
//
// Why it holds: the watch is armed on the very directory the full check
// then reads (through /proc/self/fd of the descriptor the check opened,
// beneath the scratch root, no symlink followed), the events queued
// before that read are drained first, and the watch counts as quiet only
// if the path, looked up again after the arming, still names that
// directory (a rename of it away between the open and the arming queues
// nothing on a watch not armed yet). A directory that another session's
// watch is on (moved here through a writable grant both jobs share) gets
// that watch's descriptor from the kernel: this plan takes it over, and
// the other plan's watch counts as gone (review 19). Every way a new entry can appear in
// that directory (creat, mkdir, mknod, link, symlink, rename into it)
// queues IN_CREATE or IN_MOVED_TO on it, synchronously, in the system
// call that made it; every way the path can come to name another
// directory (rename away or over, rmdir, an exchange) queues IN_MOVE_SELF,
// IN_ATTRIB (its link count) or IN_DELETE_SELF on it. The job cannot move
// the session's scratch directory itself (it has no right on the scratch
// root), nor mount anything. The pool has one inotify instance (made at
// the first session step), not one per session: instances are few per
// user (fs.inotify.max_user_instances, 128 by default), watches many.

// outputsMask is what a watch on an outputs directory reports; the
// kernel adds IN_IGNORED, IN_UNMOUNT and IN_Q_OVERFLOW.
const outputsMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// outputsCheckHook, when set (by tests only), runs in a full check before
// the open of the outputs directory (opened false) and between the open
// and the arming of its watch (opened true): where a job's thread still
// running as its step's SIGSTOP is delivered, or another session's job,
// could move a directory.
var outputsCheckHook func(pl *plan, opened bool)

// outputsWatcher is a scratch root's inotify instance, and the watches
// on its sessions' outputs directories.
type outputsWatcher struct {
	once    sync.Once
	mu      sync.Mutex
	fd      int // the instance; -1 when it could not be made, or is closed
	watches map[int32]*outputsWatch
}

// outputsWatch is one session plan's watch.
type outputsWatch struct {
	wd int32 // the watch descriptor; -1 when there is none
	// empty: the last full check found the directory empty, and no event
	// came for the watch since the events queued before it were drained.
	empty bool
}

// newOutputsWatch returns a session plan's watch, not armed yet.
func newOutputsWatch() *outputsWatch { return &outputsWatch{wd: -1} }

// outputsWatcher returns the scratch root's instance, made at the first
// call.
func (s *scratchRoot) outputsWatcher() *outputsWatcher {
	w := &s.watcher
	w.once.Do(func() {
		w.watches = map[int32]*outputsWatch{}
		fd, _, e := unix.RawSyscall(unix.SYS_INOTIFY_INIT1, unix.IN_NONBLOCK|unix.IN_CLOEXEC, 0, 0)
		w.fd = -1
		if e == 0 {
			w.fd = int(fd)
		}
	})
	return w
}

// outputsEmptyWatched is outputsEmpty for a session step: through the
// plan's watch when it has one (see above).
func (pl *plan) outputsEmptyWatched() bool {
	s := pl.scratchRoot
	if pl.outWatch == nil || s == nil || pl.scratch == "" {
		return pl.outputsEmpty()
	}
	ow := s.outputsWatcher()
	ow.mu.Lock()
	defer ow.mu.Unlock()
	if ow.fd < 0 {
		return pl.outputsEmpty()
	}
	ow.drainLocked()
	w := pl.outWatch
	if w.wd >= 0 && w.empty {
		return true
	}
	return ow.checkLocked(pl, w)
}

// checkLocked is the full check: it opens the outputs directory as
// outputsEmpty does, arms w on it (unless w is armed and saw no event
// that could mean another directory is at the path now: then it is that
// one), and reads it.
func (ow *outputsWatcher) checkLocked(pl *plan, w *outputsWatch) bool {
	w.empty = false
	s := pl.scratchRoot
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return false
	}
	if outputsCheckHook != nil {
		outputsCheckHook(pl, false)
	}
	ofd, err := rawOpenat2(s.fd, pl.scratch+"/"+OutputsDir, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolveBeneath})
	if err != nil {
		return false
	}
	defer unix.RawSyscall(unix.SYS_CLOSE, uintptr(ofd), 0, 0)
	if outputsCheckHook != nil {
		outputsCheckHook(pl, true)
	}
	// Armed anew each time: an armed watch may name a directory moved
	// away since (its event says so, but w does not keep which).
	ow.unwatchLocked(w)
	if wd, err := rawInotifyAddWatch(ow.fd, "/proc/self/fd/"+strconv.Itoa(ofd), outputsMask); err == nil {
		if o := ow.watches[wd]; o != nil && o != w {
			// Another plan's watch is on this directory (moved here
			// from its path): the kernel gave its descriptor, whose
			// events now come here. That plan is not known to be empty,
			// and re-arms at its next check (review 19).
			o.wd, o.empty = -1, false
		}
		w.wd = wd
		ow.watches[wd] = w
	}
	empty := dirEmptyFd(ofd)
	// Known empty from here on only if the path still names the directory
	// the watch is on, looked up after the arming: a rename of it away
	// between the open and the arming queued nothing on the watch
	// (review 19). Its later moves queue events; it cannot come back
	// without one. (The session's scratch directory is the pool's: only
	// the last component is the job's, and a symbolic link there is not
	// followed.)
	w.empty = empty && w.wd >= 0 && sameDir(ofd, s.fd, pl.scratch+"/"+OutputsDir)
	return empty
}

// sameDir reports whether path, looked up beneath dirfd without following
// a symbolic link at its end, is the file open at fd.
func sameDir(fd, dirfd int, path string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(fd, &a) != nil || unix.Fstatat(dirfd, path, &b, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// drainLocked reads every queued event, and marks the watches they name
// not known to be empty (all of them on an overflow or a failed read).
func (ow *outputsWatcher) drainLocked() {
	var buf [4096]byte
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(ow.fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
		if e == unix.EINTR {
			continue
		}
		if e == unix.EAGAIN {
			return
		}
		if e != 0 || n == 0 {
			ow.dirtyAllLocked()
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= int(n); {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				ow.dirtyAllLocked()
				continue
			}
			w := ow.watches[ev.Wd]
			if w == nil {
				continue // a watch removed since
			}
			w.empty = false
			if ev.Mask&unix.IN_IGNORED != 0 {
				// The kernel dropped the watch (its directory is gone).
				delete(ow.watches, ev.Wd)
				w.wd = -1
			}
		}
	}
}

func (ow *outputsWatcher) dirtyAllLocked() {
	for _, w := range ow.watches {
		w.empty = false
	}
}

// unwatchLocked removes w's watch, if it has one.
func (ow *outputsWatcher) unwatchLocked(w *outputsWatch) {
	if w.wd < 0 {
		return
	}
	if ow.watches[w.wd] == w {
		delete(ow.watches, w.wd)
		unix.RawSyscall(unix.SYS_INOTIFY_RM_WATCH, uintptr(ow.fd), uintptr(w.wd), 0)
	}
	w.wd = -1
	w.empty = false
}

// closeOutputsWatch removes the plan's watch (its session is over).
func (pl *plan) closeOutputsWatch() {
	w, s := pl.outWatch, pl.scratchRoot
	if w == nil || s == nil {
		return
	}
	ow := s.outputsWatcher()
	ow.mu.Lock()
	defer ow.mu.Unlock()
	if ow.fd >= 0 {
		ow.unwatchLocked(w)
	}
}

// close closes the instance (the scratch root is closing).
func (ow *outputsWatcher) close() {
	ow.once.Do(func() { ow.fd = -1 }) // never made: nothing to close
	ow.mu.Lock()
	defer ow.mu.Unlock()
	if ow.fd >= 0 {
		unix.RawSyscall(unix.SYS_CLOSE, uintptr(ow.fd), 0, 0)
		ow.fd = -1
	}
	for _, w := range ow.watches {
		w.wd, w.empty = -1, false
	}
	ow.watches = map[int32]*outputsWatch{}
}

// dirEmptyFd reports whether the directory open at fd holds no entry but
// "." and "..", reading it from its start; a failure says false.
func dirEmptyFd(fd int) bool {
	var buf [512]byte
	for {
		n, _, e := unix.RawSyscall(unix.SYS_GETDENTS64, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
		if e != 0 {
			return false
		}
		if n == 0 {
			return true
		}
		if _, count, _ := unix.ParseDirent(buf[:n], -1, nil); count > 0 {
			return false // ParseDirent leaves out "." and ".."
		}
	}
}

// rawInotifyAddWatch is inotify_add_watch(2) as a raw system call.
func rawInotifyAddWatch(fd int, path string, mask uint32) (int32, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	wd, _, e := unix.RawSyscall(unix.SYS_INOTIFY_ADD_WATCH, uintptr(fd), uintptr(unsafe.Pointer(p)), uintptr(mask))
	if e != 0 {
		return -1, e
	}
	return int32(wd), nil
}
