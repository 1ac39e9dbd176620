package pynox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/rawsys"
)

// scratchDepth is how deep the scratch remover descends, holding one
// descriptor per level, before it moves a deeper directory up to the
// scratch root and removes it from there: a job may nest directories
// without bound, and the pool's descriptors must stay bounded.
const scratchDepth = 32

// defaultScratchTmpfs is where a pool makes its scratch directory by
// default when it is a tmpfs: what a job writes there is memory, charged
// to the job's memory cgroup (so bounded by its allowance where the pool
// has cgroups) and gone with the machine, and making and removing
// directories costs no journal commit.
const defaultScratchTmpfs = "/dev/shm"

// scratchRoot is the directory a pool makes its jobs' scratch directories
// in (see Config.ScratchDir): one private directory per job or session,
// created when the request is planned, granted to that job alone (read and
// write through its Landlock rule), and removed when the plan is closed,
// after the job's process is gone.
//
// The pool acts only through descriptors it opened itself: every
// operation is relative to the root's descriptor or to a directory opened
// beneath it with O_NOFOLLOW|O_DIRECTORY, so a symlink a job planted is
// removed, never followed, and a directory swapped for one is not
// entered.
type scratchRoot struct {
	path string // absolute and symlink-free
	fd   int    // O_PATH descriptor of path (of the tmpfs's root when mounted)
	lock int    // a descriptor of path holding an flock while the pool lives
	// mounted says path holds a tmpfs of the pool's own (mountOwn), whose
	// root mountLock (a descriptor holding an flock too) is.
	mounted   bool
	mountLock int
	n         atomic.Uint64

	// mu is held for reading by every use of fd, and for writing by
	// close, so that no use of fd can meet a closed (or reused) number.
	mu     sync.RWMutex
	closed bool

	// free holds the names of empty scratch directories, ready for the
	// next job: a directory a job leaves empty (the common case) is
	// reused rather than removed and made again, which costs a journal
	// commit each on a file system such as ext4 (about a millisecond).
	freeMu sync.Mutex
	free   []string

	// watcher watches the sessions' outputs directories (outputs_watch.go).
	watcher outputsWatcher
}

// errScratchClosed is what create answers once the pool has closed.
var errScratchClosed = errors.New("the pool's scratch directory is gone (the pool is closed)")

// newScratchRoot makes a fresh private directory (mode 0700) beneath
// parent; when parent is empty, beneath /dev/shm if that is a tmpfs the
// pool can use, else beneath os.TempDir().
func newScratchRoot(parent string) (*scratchRoot, error) {
	if parent == "" {
		var st unix.Statfs_t
		if unix.Statfs(defaultScratchTmpfs, &st) == nil && st.Type == unix.TMPFS_MAGIC {
			if s, err := newScratchRoot(defaultScratchTmpfs); err == nil {
				return s, nil
			}
		}
		parent = os.TempDir()
	}
	real, err := filepath.EvalSymlinks(parent)
	if err != nil {
		return nil, err
	}
	sweepScratch(real)
	// The directory is made and locked under a name the sweep of another
	// pool starting at the same time ignores, and only then renamed.
	tmp, err := os.MkdirTemp(real, "."+scratchPrefix)
	if err != nil {
		return nil, err
	}
	lock, err := unix.Open(tmp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		os.Remove(tmp)
		return nil, err
	}
	// The lock says the directory is in use: a later pool removes it only
	// once the lock is gone, with the process that held it.
	if err := unix.Flock(lock, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(lock)
		os.Remove(tmp)
		return nil, fmt.Errorf("locking %s: %w", tmp, err)
	}
	dir := filepath.Join(real, strings.TrimPrefix(filepath.Base(tmp), "."))
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE); err != nil {
		unix.Close(lock)
		os.Remove(tmp)
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(lock)
		os.Remove(dir)
		return nil, err
	}
	if !sameFile(fd, lock) {
		unix.Close(fd)
		unix.Close(lock)
		return nil, fmt.Errorf("%s changed while the pool opened it", dir)
	}
	return &scratchRoot{path: dir, fd: fd, lock: lock, mountLock: -1}, nil
}

// mountOwn mounts a tmpfs of the pool's own on the scratch directory
// when that lies in a tmpfs (/dev/shm by default), the pool may mount (it
// runs as root) and the kernel charges inodes to memory cgroups (no
// cgroup.memory=nokmem): the size of the file system it lies in, no limit
// on inodes, mode 0700, nosuid and nodev. The pool calls it only when its
// jobs have memory cgroups, which are then charged for their files'
// inodes as for their pages: a job's files cost its own allowance, and no
// job can take the inodes every other job's scratch directory needs, as
// one session could in a shared /dev/shm (one inode per 4 KiB of half the
// machine's memory; review 22, TestReview22ScratchInodes). Where the
// mount fails (no privilege, no new mount API), the scratch directory
// stays a directory of that file system, as before; nothing of the job's
// confinement depends on it. A pool that confines itself hands the tmpfs
// to its mounter, which unmounts it when the pool goes (the pool's
// Landlock domain refuses its own unmount: review 25), or, when the
// mounter could not take it, unmounts it before it confines itself
// (unmountOwn).
//
// The tmpfs is attached through the directory's descriptor (no path is
// resolved), and its root is locked as the directory is, so that another
// pool's sweep (sweepScratch) sees it in use.
func (s *scratchRoot) mountOwn() {
	var st unix.Statfs_t
	if os.Geteuid() != 0 || unix.Statfs(filepath.Dir(s.path), &st) != nil || st.Type != unix.TMPFS_MAGIC || noKmem() {
		return
	}
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return
	}
	defer unix.Close(fsfd)
	size := strconv.FormatUint(st.Blocks*uint64(st.Bsize), 10)
	for _, kv := range [][2]string{{"size", size}, {"nr_inodes", "0"}, {"mode", "0700"}} {
		if unix.FsconfigSetString(fsfd, kv[0], kv[1]) != nil {
			return
		}
	}
	if unix.FsconfigCreate(fsfd) != nil {
		return
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return
	}
	defer unix.Close(mfd)
	if unix.MoveMount(mfd, "", s.fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH) != nil {
		return
	}
	root, err := unix.Openat(mfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == nil && unix.Flock(root, unix.LOCK_EX|unix.LOCK_NB) != nil {
		unix.Close(root)
		root, err = -1, errors.New("lock")
	}
	fd := -1
	if err == nil {
		fd, err = unix.Openat(mfd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	// The path must show the new root: the jobs' TMPDIR and the pool's
	// own Landlock rule name it.
	var a, b unix.Stat_t
	if err == nil && (unix.Stat(s.path, &a) != nil || unix.Fstat(fd, &b) != nil || a.Dev != b.Dev || a.Ino != b.Ino) {
		err = errors.New("the scratch directory's path does not show its tmpfs")
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		if root >= 0 {
			unix.Close(root)
		}
		_ = unix.Unmount(s.path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		return
	}
	unix.Close(s.fd)
	s.fd, s.mountLock, s.mounted = fd, root, true
}

// scratchPrefix begins the name of every pool's scratch directory.
const scratchPrefix = "pynox-scratch-"

// sweepScratch removes the scratch directories that pools which did not
// close (killed ones) left in parent: those owned by this process's
// user and locked by nobody (a pool holds the lock on its own for its
// whole life, and the kernel drops it when the process dies, in whatever
// PID namespace it ran). Removal follows no symlink (see scratchRoot).
func sweepScratch(parent string) {
	pfd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(pfd)
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, scratchPrefix) {
			continue
		}
		lock, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(lock, &st) != nil || int(st.Uid) != os.Geteuid() || unix.Flock(lock, unix.LOCK_EX|unix.LOCK_NB) != nil {
			unix.Close(lock)
			continue // someone else's, or in use
		}
		if lock, err = unmountStale(pfd, parent, name, lock); err != nil {
			continue
		}
		fd, err := unix.Openat(pfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			stale := &scratchRoot{path: filepath.Join(parent, name), fd: fd, lock: lock}
			stale.close()
		} else {
			unix.Close(lock)
		}
	}
}

// unmountOwn undoes mountOwn: the scratch directory is a directory of
// its parent's file system again (nothing was made in the tmpfs yet).
func (s *scratchRoot) unmountOwn() {
	if !s.mounted {
		return
	}
	// A mounter that stopped unmounted it already: what matters is that
	// the path shows the locked directory now (checked below).
	_ = unix.Unmount(s.path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	fd, err := unix.Open(s.path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil || !sameFile(fd, s.lock) {
		// Not the directory it locked: the scratch root has no usable
		// descriptor, and every create fails (as after close).
		if err == nil {
			unix.Close(fd)
		}
		unix.Close(s.fd)
		unix.Close(s.mountLock)
		unix.Close(s.lock)
		s.mounted, s.mountLock, s.closed = false, -1, true
		return
	}
	unix.Close(s.fd)
	unix.Close(s.mountLock)
	s.fd, s.mountLock, s.mounted = fd, -1, false
}

// sameFile reports whether descriptors a and b name the same file.
func sameFile(a, b int) bool {
	var x, y unix.Stat_t
	return unix.Fstat(a, &x) == nil && unix.Fstat(b, &y) == nil && x.Dev == y.Dev && x.Ino == y.Ino
}

// noKmem reports whether the kernel was booted with cgroup.memory=nokmem
// (or its command line cannot be read): its memory cgroups then charge no
// inode to the job that made it, and a tmpfs without an inode limit would
// bound a job's files by nothing.
func noKmem() bool {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return true
	}
	for _, arg := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(arg, "cgroup.memory="); ok && slices.Contains(strings.Split(v, ","), "nokmem") {
			return true
		}
	}
	return false
}

// unmountStale unmounts the tmpfs of a killed pool's own (mountOwn)
// from parent's entry name, whose root lock holds, locked, when the
// entry is a mountpoint (its device is not parent's), and returns a
// locked descriptor of the directory beneath, which the sweep then
// removes; otherwise it returns lock. On an error it closes lock.
func unmountStale(pfd int, parent, name string, lock int) (int, error) {
	var pst, st unix.Stat_t
	if unix.Fstat(pfd, &pst) != nil || unix.Fstat(lock, &st) != nil {
		unix.Close(lock)
		return -1, errors.New("stat")
	}
	if st.Dev == pst.Dev {
		return lock, nil
	}
	var sf unix.Statfs_t
	if unix.Fstatfs(lock, &sf) != nil || sf.Type != unix.TMPFS_MAGIC {
		unix.Close(lock)
		return -1, errors.New("not a pool's tmpfs") // something else is mounted there: left alone
	}
	err := unix.Unmount(filepath.Join(parent, name), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	unix.Close(lock)
	if err != nil {
		return -1, err
	}
	under, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if unix.Fstat(under, &st) != nil || st.Dev != pst.Dev || int(st.Uid) != os.Geteuid() || unix.Flock(under, unix.LOCK_EX|unix.LOCK_NB) != nil {
		unix.Close(under)
		return -1, errors.New("in use")
	}
	return under, nil
}

// create makes a new private directory for one job and returns its name
// in the root and an O_PATH descriptor of it (for the job's Landlock
// rule).
func (s *scratchRoot) create() (name string, fd int, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return "", -1, errScratchClosed
	}
	s.freeMu.Lock()
	if k := len(s.free); k > 0 {
		name = s.free[k-1]
		s.free = s.free[:k-1]
	}
	s.freeMu.Unlock()
	if name == "" {
		name = "j" + strconv.FormatUint(s.n.Add(1), 10)
		if err := rawsys.Mkdirat(s.fd, name, 0o700); err != nil {
			return "", -1, err
		}
	}
	fd, err = rawsys.Openat(s.fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		s.removeLocked(name)
		return "", -1, err
	}
	return name, fd, nil
}

// open returns an O_PATH descriptor of the scratch directory name,
// following no symlink.
func (s *scratchRoot) open(name string) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return -1, errScratchClosed
	}
	return rawsys.Openat(s.fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// release empties the scratch directory name, following no symlink, and
// keeps it for the next job; a directory it cannot empty is removed (as
// far as it can be).
func (s *scratchRoot) release(name string) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil // removed with the root
	}
	// The job's outputs directory, when it is empty (the usual case), goes
	// first, in one call: the listing below then finds the directory
	// empty at once rather than removing it and listing again. The path
	// is safe to resolve: name is the pool's own directory in the root,
	// which the job cannot rename or replace, and unlinkat follows no
	// symlink in its last component. Anything else (files in it, a
	// symlink or file in its place) is left to the listing.
	rawsys.Unlinkat(s.fd, name+"/"+OutputsDir, unix.AT_REMOVEDIR)
	fd, err := openDirNoFollow(s.fd, name)
	if err == nil {
		var moved []string
		moved, err = s.empty(fd, 0)
		var st unix.Stat_t
		if err == nil {
			err = rawsys.Fstat(fd, &st)
		}
		if err == nil && st.Mode&0o7777 != 0o700 {
			err = rawsys.Fchmod(fd, 0o700) // as the next job must find it
		}
		rawsys.Close(fd)
		for _, m := range moved {
			if merr := s.removeLocked(m); merr != nil && err == nil {
				err = merr
			}
		}
	}
	if err != nil {
		s.removeLocked(name)
		return err
	}
	s.freeMu.Lock()
	s.free = append(s.free, name)
	s.freeMu.Unlock()
	return nil
}

// reset empties the scratch directory name in place, following no
// symlink, and, with outputs, makes its outputs directory again: a
// session's next process finds it as its first found it. (A namespace
// attached ahead keeps its scratch directory without one until a job
// takes it: see Pool.recycleAhead.)
func (s *scratchRoot) reset(name string, outputs bool) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return errScratchClosed
	}
	fd, err := openDirNoFollow(s.fd, name)
	if err != nil {
		return err
	}
	moved, err := s.empty(fd, 0)
	var st unix.Stat_t
	if err == nil {
		err = unix.Fstat(fd, &st)
	}
	if err == nil && st.Mode&0o7777 != 0o700 {
		err = unix.Fchmod(fd, 0o700)
	}
	if err == nil && outputs {
		_, err = makeOutputs(fd, s.dir(name))
	}
	unix.Close(fd)
	for _, m := range moved {
		if merr := s.removeLocked(m); merr != nil && err == nil {
			err = merr
		}
	}
	return err
}

// dir is the path of the scratch directory name.
func (s *scratchRoot) dir(name string) string { return filepath.Join(s.path, name) }

// remove removes the entry name of the root and everything beneath it,
// following no symlink. It returns the first error met; what it could
// not remove stays (and goes with the root when the pool closes).
func (s *scratchRoot) remove(name string) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil // removed with the root
	}
	return s.removeLocked(name)
}

// removeLocked is remove, with mu held.
func (s *scratchRoot) removeLocked(name string) error {
	var first error
	queue := []string{name}
	for len(queue) > 0 {
		n := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		moved, err := s.removeAt(s.fd, n, 0)
		queue = append(queue, moved...)
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// removeAt removes the entry name of the directory dirfd: unlinks it if it
// is not a directory (a symlink is unlinked itself), else empties it and
// removes it. A directory deeper than scratchDepth is moved to the root
// and returned, for remove to take it from there.
func (s *scratchRoot) removeAt(dirfd int, name string, depth int) (moved []string, err error) {
	err = unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return nil, err
	}
	// An empty directory (a job's outputs directory, most often) goes in
	// one call; any failure (not empty, a mount point, permissions the
	// job took away) takes the long way below, which fixes them.
	if unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR) == nil {
		return nil, nil
	}
	if depth >= scratchDepth {
		up := "d" + strconv.FormatUint(s.n.Add(1), 10)
		if err := unix.Renameat(dirfd, name, s.fd, up); err != nil {
			return nil, err
		}
		return []string{up}, nil
	}
	fd, err := openDirNoFollow(dirfd, name)
	if err != nil {
		return nil, err
	}
	moved, err = s.empty(fd, depth)
	unix.Close(fd)
	if err != nil {
		return moved, err
	}
	return moved, unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// empty removes everything in the directory open at fd (for reading), at
// depth depth; see removeAt for what it returns. Entries are read in
// batches and removed, and the listing is read again from the start
// until it is empty: removing entries while reading a directory may skip
// some.
func (s *scratchRoot) empty(fd int, depth int) (moved []string, err error) {
	bp := direntBufs.Get().(*[8192]byte)
	defer direntBufs.Put(bp)
	buf := bp[:]
	for {
		n, err := rawsys.Getdents(fd, buf)
		if err != nil {
			return moved, err
		}
		if n <= 0 {
			return moved, nil
		}
		_, _, names := unix.ParseDirent(buf[:n], -1, nil)
		if len(names) == 0 {
			continue // only "." and ".."
		}
		for _, n := range names {
			m, err := s.removeAt(fd, n, depth+1)
			moved = append(moved, m...)
			if err != nil {
				return moved, err
			}
		}
		if _, err := rawsys.Seek(fd, 0, io.SeekStart); err != nil {
			return moved, err
		}
	}
}

// direntBufs lends empty its listing buffers. One made in empty stayed on
// the stack, and empty runs for every job on a fresh goroutine (the
// scratch directory's release once the child is gone): its 8 KiB made
// that goroutine grow its stack, a copy of it, once per job; in a profile
// of `pynox pool` at throughput stack growth was 6% of the host's CPU
// (issue 12).
var direntBufs = sync.Pool{New: func() any { return new([8192]byte) }}

// openDirNoFollow opens the directory name of dirfd for reading without
// following a symlink, and makes sure its owner may read, search and
// change it: a job may have taken those permissions away (which stops a
// pool that does not run as root). The mode is changed through a
// descriptor of that very directory, never through a path.
func openDirNoFollow(dirfd int, name string) (int, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := rawsys.Openat(dirfd, name, flags, 0)
	if errors.Is(err, unix.EACCES) {
		pfd, perr := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if perr != nil {
			return -1, perr
		}
		// chmod through /proc/self/fd names the inode pfd holds.
		cerr := unix.Chmod("/proc/self/fd/"+strconv.Itoa(pfd), 0o700)
		unix.Close(pfd)
		if cerr != nil {
			return -1, cerr
		}
		fd, err = unix.Openat(dirfd, name, flags, 0)
	}
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := rawsys.Fstat(fd, &st); err != nil {
		rawsys.Close(fd)
		return -1, err
	}
	if st.Mode&0o700 != 0o700 {
		if err := unix.Fchmod(fd, st.Mode&0o7777|0o700); err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

// close removes every scratch directory left and the root itself.
func (s *scratchRoot) close() error {
	// The watcher first, outside s.mu: a check of a session's outputs
	// takes the watcher's lock and then s.mu (outputs_watch.go), so
	// taking them here the other way round could deadlock (it cannot
	// today: Pool.Close waits for every session's last check). Closing
	// it twice does nothing.
	s.watcher.close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.mounted {
		// The tmpfs goes whole, with whatever the jobs left in it: no
		// walk through what they made.
		var root unix.Stat_t
		_ = unix.Fstat(s.fd, &root)
		unix.Close(s.fd)
		unix.Close(s.mountLock)
		first := unix.Unmount(s.path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if first != nil {
			// A pool that confines itself cannot (EPERM): its mounter
			// unmounted it when it stopped, before this (Pool.Close).
			var now unix.Stat_t
			if unix.Stat(s.path, &now) == nil && now.Dev != root.Dev {
				first = nil
			}
		}
		if err := unix.Rmdir(s.path); err != nil && first == nil {
			first = err
		}
		unix.Close(s.lock)
		return first
	}
	var first error
	fd, err := openDirNoFollow(s.fd, ".")
	if err == nil {
		f := os.NewFile(uintptr(fd), s.path)
		names, _ := f.Readdirnames(-1)
		f.Close()
		for _, n := range names {
			if err := s.removeLocked(n); err != nil && first == nil {
				first = err
			}
		}
	} else {
		first = err
	}
	unix.Close(s.fd)
	if err := unix.Rmdir(s.path); err != nil && first == nil {
		first = err
	}
	unix.Close(s.lock)
	return first
}
