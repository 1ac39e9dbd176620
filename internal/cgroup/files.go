package cgroup

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// readFile returns the contents of the control file at path (at most
// 64 KiB), read with plain system calls: os.ReadFile makes an os.File,
// tries to register it with Go's poller and stats it, which for the few
// bytes of a cgroup control file costs about as much as the read itself
// (v1 on a 2-vCPU VM, CPU per read: pids.current 14-17 µs with
// os.ReadFile, 7-8 µs here; memory.stat 21-28 against 15-17). The pool
// reads four of these for every job, through readValue. (Keeping the
// files open and re-reading them with pread costs 1-7 µs, but leaves four
// descriptors open per cgroup.)
func readFile(path string) ([]byte, error) {
	return preadFile(path, make([]byte, 4096))
}

// readValue reads the control file at path and returns its number: the
// whole file's (key empty: pids.current, memory.usage_in_bytes), or that
// of its line "key <n>" (memory.stat, memory.oom_control,
// memory.events); found is false when no such line is there. The file is
// read into a buffer lent by valueBufs, and a longer one than it holds
// into a heap buffer: the pool reads four such files for every job, and
// the 4 KiB buffer readFile makes for each was a fifth of the bytes the
// host allocated per job. (A buffer on the stack would make the fresh
// goroutines that release groups grow their stacks.)
func readValue(path, key string) (n int64, found bool, err error) {
	return readValueAt(unix.AT_FDCWD, path, key)
}

// parseValue reads the control file open at fd (named path in errors) into
// a buffer lent by valueBufs and parses it as readValue says.
func parseValue(fd int, path, key string) (n int64, found bool, err error) {
	bp := valueBufs.Get().(*[4096]byte)
	defer valueBufs.Put(bp)
	b, err := preadFd(fd, path, bp[:])
	if err != nil {
		return 0, false, err
	}
	if key == "" {
		n, err = strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
		return n, err == nil, err
	}
	// Not bytes.Lines: its iterator would make the buffer escape.
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		v, ok := bytes.CutPrefix(line, []byte(key))
		if !ok || len(v) == 0 || v[0] != ' ' {
			continue
		}
		n, err = strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		return n, err == nil, err
	}
	return 0, false, nil
}

// valueBufs lends readValue its buffers.
var valueBufs = sync.Pool{New: func() any { return new([4096]byte) }}

// preadFile reads the whole control file at path into buf, or into a
// larger heap buffer when buf cannot hold it (at most 64 KiB).
func preadFile(path string, buf []byte) ([]byte, error) {
	fd, err := rawOpenat(unix.AT_FDCWD, path, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer rawClose(fd)
	return preadFd(fd, path, buf)
}

// preadFd reads the whole control file open at fd (named path in errors)
// into buf, or into a larger heap buffer when buf cannot hold it (at most
// 64 KiB).
func preadFd(fd int, path string, buf []byte) ([]byte, error) {
	for {
		n, err := rawPread(fd, buf, 0)
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n < len(buf) || len(buf) >= 64<<10 {
			return buf[:n], nil
		}
		buf = make([]byte, 2*max(len(buf), 2048)) // read it again, whole, into a bigger buffer
	}
}

// readValue is the package's readValue of the group's control file in its i-th
// directory (see Group.dirs). The file is opened relative to the
// Manager's descriptor of that hierarchy's base (its lock, open for the
// pool's life): "j<n>/<file>" is two path components to walk where the
// absolute path is up to nine (/sys/fs/cgroup/memory/…/pynox-…/j<n>/…),
// and the walk was the larger part of an open's cost in a profile of the
// pool (link_path_walk: two fifths of openat's time). It falls back to
// the absolute path once the Manager has let go of its bases.
func (g *Group) readValue(i int, file, key string) (int64, bool, error) {
	var n int64
	var ok bool
	var err error
	if g.files.use(i, file, func(fd int) { n, ok, err = parseValue(fd, file, key) }) {
		return n, ok, g.pathError(err, i, file)
	}
	m := g.m
	m.locksMu.RLock()
	if i < len(m.locks) && g.name != "" {
		n, ok, err := readValueAt(m.locks[i], g.name+"/"+file, key)
		m.locksMu.RUnlock()
		return n, ok, g.pathError(err, i, file)
	}
	m.locksMu.RUnlock()
	return readValue(filepath.Join(g.dirs[i], file), key)
}

// writeFile writes s to the group's control file in its i-th directory,
// opened as readValue opens it.
func (g *Group) writeFile(i int, file, s string) error {
	var err error
	if g.files.use(i, file, func(fd int) { err = writeFd(fd, file, s) }) {
		return g.pathError(err, i, file)
	}
	m := g.m
	m.locksMu.RLock()
	if i < len(m.locks) && g.name != "" {
		err := writeAt(m.locks[i], g.name+"/"+file, s)
		m.locksMu.RUnlock()
		return g.pathError(err, i, file)
	}
	m.locksMu.RUnlock()
	return write(filepath.Join(g.dirs[i], file), s)
}

// pathError names the group's file by its whole path in err, an
// *os.PathError that named it relative to its base.
func (g *Group) pathError(err error, i int, file string) error {
	if pe, ok := err.(*os.PathError); ok {
		pe.Path = filepath.Join(g.dirs[i], file)
	}
	return err
}

// readValueAt is readValue of the file at rel beneath the directory dirfd.
func readValueAt(dirfd int, rel, key string) (int64, bool, error) {
	fd, err := rawOpenat(dirfd, rel, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return 0, false, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	defer rawClose(fd)
	return parseValue(fd, rel, key)
}

// writeAt is write of the file at rel beneath the directory dirfd.
func writeAt(dirfd int, rel, s string) error {
	fd, err := rawOpenat(dirfd, rel, unix.O_WRONLY|unix.O_CLOEXEC)
	if err != nil {
		return &os.PathError{Op: "open", Path: rel, Err: err}
	}
	err = writeFd(fd, rel, s)
	if cerr := rawClose(fd); err == nil && cerr != nil {
		err = &os.PathError{Op: "close", Path: rel, Err: cerr}
	}
	return err
}

// writeFd writes s to the control file open at fd (named path in errors)
// in one write: a control file takes one value per write.
func writeFd(fd int, path, s string) error {
	if _, err := rawWrite(fd, []byte(s)); err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}
