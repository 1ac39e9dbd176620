package worker

// Resource usage of a turn, as the kernel counted it. Nothing here comes
// from the job's own reports: a one-shot job's figures are its process's
// rusage, which its template reads with wait4 when it reaps it, less the
// counters the host read from /proc/<pid> at the hand-over; a session
// step's are read by the host from /proc/<pid> before and after the step
// (the process is stopped or blocked then), the pid taken from the pidfd.

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Usage is the resource usage of a turn as the kernel counted it.
type Usage struct {
	CPU         time.Duration // user and system time, all threads
	MaxRSS      int64         // peak resident set size in bytes
	MinorFaults int64         // page faults served without I/O
}

// usageWait bounds the wait for the template's report of a process's exit,
// which carries its rusage: the process has reported or been killed then,
// so the report follows at once unless the template is gone.
const usageWait = 2 * time.Second

// procUsage reads the counters of the live process pid from /proc: its
// CPU clock, its minor faults (/proc/<pid>/stat) and its peak RSS
// (VmHWM of /proc/<pid>/status).
func procUsage(pid int) (Usage, error) { return readUsage(pid, true) }

// readUsage is procUsage, the peak RSS only when peak is set.
func readUsage(pid int, peak bool) (Usage, error) {
	var u Usage
	if pid <= 0 {
		return u, unix.ESRCH
	}
	var ts unix.Timespec
	if err := rawClockGettime(processCPUClock(pid), &ts); err != nil {
		return u, err
	}
	u.CPU = time.Duration(ts.Nano())
	p := "/proc/" + strconv.Itoa(pid)
	bp := procBufs.Get().(*[procBufSize]byte)
	defer procBufs.Put(bp)
	buf := bp[:]
	stat, err := readProcFile(p+"/stat", buf)
	if err != nil {
		return u, err
	}
	if u.MinorFaults, err = parseMinorFaults(stat); err != nil {
		return u, err
	}
	if !peak {
		return u, nil
	}
	status, err := readProcFile(p+"/status", buf)
	if err != nil {
		return u, err
	}
	if u.MaxRSS, err = parsePeakRSS(status); err != nil {
		return u, err
	}
	return u, nil
}

// procBufSize holds /proc/<pid>/stat and /proc/<pid>/status whole (about
// 300 and 1,500 bytes); readProcFile reads a longer file in more calls.
const procBufSize = 4096

// procBufs lends the buffers /proc files are read into. Neither a buffer
// per read (4 KiB allocated, twice per job) nor one on the stack (the
// job's goroutine is new for each job, and a 4 KiB frame made it grow
// its stack, copying it) is free.
var procBufs = sync.Pool{New: func() any { return new([procBufSize]byte) }}

// readProcFile reads the /proc file at path into buf, growing it when the
// file is longer. It uses plain system calls: through os.ReadFile a
// /proc file costs ten (the poller's registration attempt and the
// descriptor's flags, twice each, and an fstat), and a session step reads
// two of them before and after it runs.
func readProcFile(path string, buf []byte) ([]byte, error) {
	fd, err := rawOpen(path, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer rawClose(fd)
	n := 0
	for {
		if n == len(buf) {
			grown := make([]byte, 2*len(buf))
			copy(grown, buf)
			buf = grown
		}
		m, err := rawRead(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			return buf[:n], nil
		}
		n += m
	}
}

// stepBase readies a session turn's usage: it resets the process's peak
// RSS to its present RSS (clear_refs "5"), so that the peak read after
// the step is the step's own, and reads the counters the step's figures
// are taken from. The process is stopped or waiting for its code. A nil
// result (the process is gone) leaves the turn without figures.
func (c *Child) stepBase() *Usage {
	pid := c.Pid()
	if pid <= 0 {
		return nil
	}
	c.resetPeak(pid)
	// The counters read after the last step, when the process was stopped
	// (see noteUsage), are this step's base: it has not run since but for
	// the runner's few lines between its report and the stop, which count
	// in this step. Otherwise (the session's first step, a step after a
	// dump) they are read, but for the peak, which is read after the step
	// from the reset above.
	if prev := c.lastUsage; prev != nil {
		c.lastUsage = nil
		return prev
	}
	u, err := c.sessionUsage(false)
	if err != nil || c.Gone() {
		return nil
	}
	return &u
}

// jobBase reads a one-shot job's CPU time and minor faults before its
// code is handed over (the spare waits for it, blocked), so that its
// figures leave out the spare's own preparation after its fork. Its peak
// RSS is the process's whole life's. Nil when they cannot be read: the
// job's figures are then its process's totals.
func (c *Child) jobBase() *Usage {
	pid := c.Pid()
	f := c.takePrepared()
	if !f.held() {
		var err error
		if f, err = openProcFiles(pid); err != nil {
			return nil
		}
	}
	u, err := f.read(pid, false)
	if err != nil || c.Gone() {
		f.close()
		return nil
	}
	c.procFiles = f
	return &u
}

// procFiles are a process's /proc/<pid>/stat and /proc/<pid>/status,
// opened once, while the process is known to be alive, and read with
// pread: a one-shot job's counters are read twice (before the hand-over
// and at its report), and reopening them would cost an open and a close
// each time. A read through them after the process was reaped fails
// (ESRCH): it never reads another process that took its pid. A zero
// procFiles (stat 0) holds nothing.
type procFiles struct{ stat, status int }

// openProcFiles opens the /proc files of the live process pid.
func openProcFiles(pid int) (procFiles, error) {
	if pid <= 0 {
		return procFiles{}, unix.ESRCH
	}
	p := "/proc/" + strconv.Itoa(pid)
	stat, err := rawOpen(p+"/stat", unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return procFiles{}, err
	}
	status, err := rawOpen(p+"/status", unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		rawClose(stat)
		return procFiles{}, err
	}
	return procFiles{stat: stat, status: status}, nil
}

func (f procFiles) held() bool { return f.stat > 0 }

func (f procFiles) close() {
	if f.held() {
		rawClose(f.stat)
		rawClose(f.status)
	}
}

// read is readUsage through the files (of the process pid, whose CPU
// clock is read).
func (f procFiles) read(pid int, peak bool) (Usage, error) {
	var u Usage
	var ts unix.Timespec
	if err := rawClockGettime(processCPUClock(pid), &ts); err != nil {
		return u, err
	}
	u.CPU = time.Duration(ts.Nano())
	bp := procBufs.Get().(*[procBufSize]byte)
	defer procBufs.Put(bp)
	buf := bp[:]
	stat, err := preadProcFile(f.stat, buf)
	if err != nil {
		return u, err
	}
	if u.MinorFaults, err = parseMinorFaults(stat); err != nil {
		return u, err
	}
	if !peak {
		return u, nil
	}
	status, err := preadProcFile(f.status, buf)
	if err != nil {
		return u, err
	}
	if u.MaxRSS, err = parsePeakRSS(status); err != nil {
		return u, err
	}
	return u, nil
}

// preadProcFile reads the whole /proc file open at fd from its start into
// buf, growing it when the file is longer.
func preadProcFile(fd int, buf []byte) ([]byte, error) {
	n := 0
	for {
		if n == len(buf) {
			grown := make([]byte, 2*len(buf))
			copy(grown, buf)
			buf = grown
		}
		m, err := rawPread(fd, buf[n:], int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if m == 0 {
			return buf[:n], nil
		}
		n += m
		if n < len(buf) {
			// stat and status are written whole by one show: a read that
			// did not fill the buffer took all of it.
			return buf[:n], nil
		}
	}
}

// parseMinorFaults takes the minor faults from a /proc/<pid>/stat.
func parseMinorFaults(stat []byte) (int64, error) {
	// The command name (field 2) is the job's to choose and may hold
	// spaces and parentheses: the fields are counted from its last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc/<pid>/stat")
	}
	// The eighth field after it (state is field 3, minflt field 10),
	// found without bytes.Fields, whose slice of fields is allocated.
	rest := stat[i+1:]
	for k := 0; ; k++ {
		rest = bytes.TrimLeft(rest, " ")
		end := bytes.IndexByte(rest, ' ')
		if end < 0 {
			end = len(rest)
		}
		if end == 0 {
			return 0, errors.New("malformed /proc/<pid>/stat")
		}
		if k == 7 {
			return strconv.ParseInt(string(bytes.TrimRight(rest[:end], "\n")), 10, 64)
		}
		rest = rest[end:]
	}
}

// parsePeakRSS takes VmHWM, in bytes, from a /proc/<pid>/status.
func parsePeakRSS(status []byte) (int64, error) {
	var rss int64
	// Not bytes.Lines: its iterator would move the caller's stack buffer
	// to the heap.
	for len(status) > 0 {
		line := status
		if i := bytes.IndexByte(status, '\n'); i >= 0 {
			line, status = status[:i], status[i+1:]
		} else {
			status = nil
		}
		if v, ok := bytes.CutPrefix(line, []byte("VmHWM:")); ok {
			kb, err := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			if err != nil {
				return 0, err
			}
			rss = kb << 10
		}
	}
	if rss == 0 {
		// A zombie has no memory left to count: its figures are its
		// template's to report.
		return 0, errors.New("/proc/<pid>/status has no VmHWM: the process has exited")
	}
	return rss, nil
}

// doneUsage reads a one-shot job's counters at its report: through the
// files jobBase opened when it could, from /proc/<pid> otherwise.
func (c *Child) doneUsage() (Usage, error) {
	if c.procFiles.held() {
		return c.procFiles.read(c.Pid(), true)
	}
	return procUsage(c.Pid())
}

// noteUsage sets o.Usage once the turn has ended: for a process that
// lives on (stopped until its next step) from /proc, less base; for one
// that reported its end, from /proc too when its template has not reaped
// it yet (so the result does not wait for the reap; the figures then
// leave out the process's own exit); otherwise from the rusage its
// template reported when it reaped it (less base). A pid read after the process's end
// could name another process, so figures read from /proc count only when
// the pidfd says the process was still there after the read.
func (c *Child) noteUsage(o *Outcome, base *Usage, session bool) {
	if session && base == nil {
		return
	}
	var u Usage
	c.lastUsage = nil
	if !session {
		defer func() {
			c.procFiles.close()
			c.procFiles = procFiles{}
		}()
	}
	if o.Alive {
		var err error
		if u, err = c.sessionUsage(true); err != nil || c.Gone() {
			return
		}
		last := u
		c.lastUsage = &last
	} else {
		read := false
		if o.doneUsage != nil {
			u, read = *o.doneUsage, true
		} else if !isClosed(c.reaped) && o.Done {
			// The job reported and is on its way out: its counters are
			// read now rather than after its template's report of the
			// reap, which would hold the result back (the process, alive
			// or a zombie, keeps its pid until that report: the template
			// reaps and reports before it forks again).
			if r, err := c.doneUsage(); err == nil && !isClosed(c.reaped) {
				u, read = r, true
			}
		}
		if !read {
			select {
			case <-c.reaped:
			case <-time.After(usageWait):
				return
			}
			if c.exitUsage == nil {
				return
			}
			u = *c.exitUsage
		}
	}
	if base != nil {
		u.CPU = max(u.CPU-base.CPU, 0)
		u.MinorFaults = max(u.MinorFaults-base.MinorFaults, 0)
	}
	o.Usage = &u
}
