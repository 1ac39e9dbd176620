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
}

// prepareStepPipes makes the next step's output pipes, unless they are
// made already or the child is closed. A failure is left for the next
// step, which makes its pipes then (and fails as before when it cannot).
func (c *Child) prepareStepPipes() {
	c.pidMu.Lock()
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
	c.nextPipes = stepPipes{}
	return p.out, p.errp, p.held
}

// closeStepPipes closes the prepared pipes; c.pidMu is held.
func (c *Child) closeStepPipes() {
	if p := c.nextPipes; p.held {
		closeAll([]int{p.out[0], p.out[1], p.errp[0], p.errp[1]})
	}
	c.nextPipes = stepPipes{}
}
