package worker

// Work a one-shot job's turn would otherwise do between the request and
// the hand-over of its frame, done when the spare is delivered instead
// (after its cgroup placement, while the worker waits for its next job).

// prepareUsage resolves the spare's pid in the pool's namespace (a
// PIDFD_GET_INFO ioctl with a PID namespace) and opens its /proc stat and
// status, the files jobBase reads the job's base counters from and the
// report's usage comes from (see procFiles): three system calls fewer on
// the job's path. Nothing is read here: the spare is still preparing (its
// warm-up runs after its delivery), so the base stays the job's own read.
// A spare that is gone or whose files cannot be opened is left as it was;
// jobBase then opens them itself, as before.
func (c *Child) prepareUsage() {
	pid := c.Pid()
	f, err := openProcFiles(pid)
	if err != nil {
		return
	}
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	if isClosed(c.closed) || c.pidfd < 0 || c.prepared.held() {
		// Closed meanwhile (Close closes c.closed before it takes
		// prepared): Close no longer looks at prepared.
		f.close()
		return
	}
	c.prepared = f
}

// takePrepared hands the files prepareUsage opened to the caller, which
// closes them; zero when there are none. After it, Close leaves them be.
func (c *Child) takePrepared() procFiles {
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	f := c.prepared
	c.prepared = procFiles{}
	return f
}

// HoldClose makes Run, once its job is over, only kill the child and
// leave the rest of Close (its descriptors, the release of its cgroup,
// the request for its replacement unless held) to the caller, who must
// call Close: the pool calls it once the job's answer is written, so that
// those system calls do not hold the answer back. Call it before Run.
func (c *Child) HoldClose() { c.holdClose.Store(true) }

// endRun is what Run does with a child whose job is over: Close, or with
// HoldClose the kill alone (Close kills it again; until then the process
// cannot run on).
func (c *Child) endRun() {
	if c.holdClose.Load() {
		c.Kill()
		return
	}
	c.Close()
}
