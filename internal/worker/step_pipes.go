package worker

// stepPipes are a session's next step's output pipes, made while the
// current step runs: betweenSteps then hands them out instead of making
// them on the next step's way in. Each step still gets pipes of its own
// that nothing else ever held: they are made after the last step's pipes
// were handed out, and only the pool holds them until the next step's
// frame carries their write ends to the process. Making them (two pipe2
// and two fcntl calls) took about a tenth of the pool's work between a
// step's request and the process resuming (issue 12); made after the
// frame is sent, they overlap the process's run instead. A live session
// holds their four descriptors between steps. Guarded by Child.pidMu, as
// Close closes them.
type stepPipes struct {
	out, errp [2]int
	held      bool
	// spent are the read ends of the last step's pipes, both at end of
	// file, left open by its turn (see closeLater) until the next step's
	// frame is sent; 0 when there are none.
	spent [2]int
}

// prepareStepPipes makes the next step's output pipes, unless they are
// made already or the child is closed. A failure is left for the next
// step, which makes its pipes then (and fails as before when it cannot).
func (c *Child) prepareStepPipes() {
	c.pidMu.Lock()
	c.closeSpent()
	held := c.nextPipes.held || c.pidfd < 0
	c.pidMu.Unlock()
	if held {
		return
	}
	out, errp, err := outputPipes()
	if err != nil {
		return
	}
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	if c.nextPipes.held || c.pidfd < 0 {
		closeAll([]int{out[0], out[1], errp[0], errp[1]})
		return
	}
	c.nextPipes = stepPipes{out: out, errp: errp, held: true}
}

// takeStepPipes returns the prepared pipes, if any, which are the
// caller's from then on.
func (c *Child) takeStepPipes() (out, errp [2]int, ok bool) {
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	p := c.nextPipes
	c.nextPipes = stepPipes{spent: p.spent}
	return p.out, p.errp, p.held
}

// closeStepPipes closes the prepared pipes; c.pidMu is held.
func (c *Child) closeStepPipes() {
	c.closeSpent()
	if p := c.nextPipes; p.held {
		closeAll([]int{p.out[0], p.out[1], p.errp[0], p.errp[1]})
	}
	c.nextPipes = stepPipes{}
}

// closeLater keeps the read ends of a live session step's output pipes,
// both at end of file, open until the next step's frame is sent
// (prepareStepPipes) or the child is closed, instead of closing them
// between the step's report and its result: the close of a pipe's last
// descriptor frees the pipe, some 4 µs each, which the result waited for
// (issue 12). Nothing is read from them again; the pipes are the finished
// step's alone (each step gets new ones), so holding them changes nothing
// the process or the next step can see. When the child is closed already
// they are closed at once.
func (c *Child) closeLater(outFd, errFd int) {
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	if c.pidfd < 0 || c.nextPipes.spent[0] > 0 {
		rawClose(outFd)
		rawClose(errFd)
		return
	}
	c.nextPipes.spent = [2]int{outFd, errFd}
}

// closeSpent closes the pipes closeLater kept; c.pidMu is held.
func (c *Child) closeSpent() {
	if sp := c.nextPipes.spent; sp[0] > 0 {
		rawClose(sp[0])
		rawClose(sp[1])
		c.nextPipes.spent = [2]int{}
	}
}
