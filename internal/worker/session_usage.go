package worker

import (
	"strconv"

	"golang.org/x/sys/unix"
)

// sessionProc holds a session process's /proc files for its life: its
// stat and status, read with pread before and after every step, and its
// clear_refs, written before every step. Reopening them per step cost
// three opens and closes, and the path walks of /proc, each step: about a
// tenth of the host's CPU per step through `pynox pool` (issue 12). Like
// procFiles, they name the process itself: once it is reaped a read fails
// (ESRCH), never reaching a process that took its pid. Guarded by
// Child.pidMu, as Close closes them.
type sessionProc struct {
	files procFiles
	// clearRefs is the open clear_refs, 0 before the first try, and -1
	// when it cannot be opened (a pool confined by Landlock may not write
	// it): then it is not tried again, and a step's peak RSS is the
	// process's since its start.
	clearRefs int
}

// sessionUsage reads the counters of the session's live process through
// its held files, opening them at the first call.
func (c *Child) sessionUsage(peak bool) (Usage, error) {
	pid := c.Pid()
	if pid <= 0 {
		return Usage{}, unix.ESRCH
	}
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	if c.pidfd < 0 {
		return Usage{}, unix.ESRCH // closed
	}
	sp := &c.sproc
	if !sp.files.held() {
		// The files opened when the process was delivered (prepareUsage),
		// else new ones.
		f := c.prepared
		c.prepared = procFiles{}
		if !f.held() {
			var err error
			if f, err = openProcFiles(pid); err != nil {
				return Usage{}, err
			}
		}
		// Held only when they were opened while the process was alive
		// (it is alive now, so it was then), so that they name it and
		// not a process that took its pid.
		fds := []unix.PollFd{{Fd: int32(c.pidfd), Events: unix.POLLIN}}
		if n, err := rawPollNow(fds); err != nil || n > 0 {
			f.close()
			return Usage{}, unix.ESRCH
		}
		sp.files = f
	}
	return sp.files.read(pid, peak)
}

// resetPeak resets the session process's peak RSS to its present RSS
// (clear_refs "5") through the held clear_refs.
func (c *Child) resetPeak(pid int) {
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	sp := &c.sproc
	if c.pidfd < 0 || sp.clearRefs < 0 {
		return
	}
	if sp.clearRefs == 0 {
		fd, err := rawOpen("/proc/"+strconv.Itoa(pid)+"/clear_refs", unix.O_WRONLY|unix.O_CLOEXEC)
		if err != nil {
			sp.clearRefs = -1
			return
		}
		// Held only when opened while the process was alive (as
		// sessionUsage's files): a process that took a reaped one's pid
		// must never have its peak reset by this session's steps.
		fds := []unix.PollFd{{Fd: int32(c.pidfd), Events: unix.POLLIN}}
		if n, err := rawPollNow(fds); err != nil || n > 0 {
			rawClose(fd)
			return
		}
		sp.clearRefs = fd
	}
	rawWrite(sp.clearRefs, []byte("5"))
}

// closeSessionProc closes the held files; c.pidMu is held.
func (c *Child) closeSessionProc() {
	sp := &c.sproc
	sp.files.close()
	sp.files = procFiles{}
	if sp.clearRefs > 0 {
		rawClose(sp.clearRefs)
	}
	sp.clearRefs = -1
}
