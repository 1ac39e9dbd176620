package worker

// The goroutines that run a turn's host calls.

// runCall runs a host call's handler on a goroutine of the turn's, one
// left idle by an earlier call when there is one, or else a new one; a
// turn's goroutines end with it. A goroutine per call started each on a
// fresh stack, which the handler's path (the host function, the JSON of
// its answer and, in `pynox pool`, the call event's encoding and write)
// grew two or three times, copying it each time: runtime.newstack and
// copystack were ~9% of `pynox pool`'s CPU in a host-call loop (issue
// 12). Handing a call to an idle goroutine readies it just as starting
// one does, so the hand-over costs no more.
func (t *turn) runCall(f func()) {
	if t.callWork == nil {
		t.callWork = make(chan func())
		t.callQuit = make(chan struct{})
	}
	select {
	case t.callWork <- f: // an idle one takes it (the channel is unbuffered)
	default:
		go callLoop(f, t.callWork, t.callQuit)
	}
}

// callLoop runs f, then each call handed to it, until quit is closed.
func callLoop(f func(), work <-chan func(), quit <-chan struct{}) {
	for {
		f()
		select {
		case f = <-work:
		case <-quit:
			return
		}
	}
}
