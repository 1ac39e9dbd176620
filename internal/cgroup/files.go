package cgroup

import (
	"bytes"
	"os"
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
	bp := valueBufs.Get().(*[4096]byte)
	defer valueBufs.Put(bp)
	b, err := preadFile(path, bp[:])
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
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Pread(fd, buf, 0)
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n < len(buf) || len(buf) >= 64<<10 {
			return buf[:n], nil
		}
		buf = make([]byte, 2*max(len(buf), 2048)) // read it again, whole, into a bigger buffer
	}
}
