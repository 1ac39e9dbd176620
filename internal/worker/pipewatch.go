package worker

// A finished turn's output pipes, read through the template's bell
// poller (bell.go) rather than through os.Files of their own.
//
// A job's pipes are usually at end of file when it reports (drainNow
// reads them whole at once). When they are not — the process has
// reported but not yet exited, as often happens with think time between
// jobs — the rest used to be read by two goroutines through os.Files:
// each file's registration with Go's poller (fcntl F_GETFL, epoll_ctl
// ADD), three goroutines, and at the end the files' closes (epoll_ctl
// DEL, and a close through syscall.Syscall, which when the pool's one P
// had been idle woke the runtime's monitor thread on another CPU; see
// rawsys.go). Now the pipes still open are added to the template's epoll
// instance, whose one goroutine reads them as they become ready and
// removes and closes them with raw system calls at end of file. What the
// turn sees is unchanged: output.closed is closed once both pipes are
// done, and cutOff ends the reading early.

import "golang.org/x/sys/unix"

// pipeWatch is one output pipe read through a bellPoller.
type pipeWatch struct {
	fd int
	id uint64
	k  *sink
	g  *pipeGroup
}

// pipeGroup is a turn's pipes read through a bellPoller: closed is closed
// once none is left.
type pipeGroup struct {
	bp      *bellPoller
	watches []*pipeWatch // guarded by bp.mu; nil entries are done
	left    int
	closed  chan struct{}
}

// watchPipes reads the pipes fds (those not nil in ks) into their sinks
// through the instance, and returns the group, or nil, having taken
// none, when the instance cannot (it is closed, or an epoll_ctl failed).
func (bp *bellPoller) watchPipes(fds []int, ks []*sink, closed chan struct{}) *pipeGroup {
	if bp == nil {
		return nil
	}
	bp.mu.Lock()
	defer bp.mu.Unlock()
	if bp.closed {
		return nil
	}
	g := &pipeGroup{bp: bp, closed: closed}
	for i, fd := range fds {
		bp.seq++
		w := &pipeWatch{fd: fd, id: bp.seq, k: ks[i], g: g}
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(uint32(w.id)), Pad: int32(uint32(w.id >> 32))}
		if rawEpollCtl(bp.epfd, unix.EPOLL_CTL_ADD, fd, &ev) != nil {
			for _, o := range g.watches {
				delete(bp.pipes, o.id)
				rawEpollCtl(bp.epfd, unix.EPOLL_CTL_DEL, o.fd, nil)
			}
			return nil
		}
		bp.pipes[w.id] = w
		g.watches = append(g.watches, w)
		g.left++
	}
	return g
}

// pipeReadsPerEvent bounds the reads of one pipe per event: a writer
// that keeps it full must not hold the poller's lock (every bell and
// pipe of the template, and cutOff) for as long as it writes. The
// instance is level-triggered, so what is left is reported again.
// Thirty-two reads of a pooled 32 KiB buffer hold what a pipe can (1 MiB,
// the default pipe-max-size).
const pipeReadsPerEvent = 32

// readPipeLocked reads what the pipe holds now, up to pipeReadsPerEvent
// reads; at end of file, or on a failed read, the pipe is done.
func (bp *bellPoller) readPipeLocked(w *pipeWatch, buf []byte) {
	for reads := 0; ; {
		n, err := rawRead(w.fd, buf)
		if n > 0 {
			w.k.add(buf[:n])
			if reads++; reads == pipeReadsPerEvent {
				return
			}
			continue
		}
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return
		}
		bp.donePipeLocked(w) // 0 bytes without error: end of file
		return
	}
}

// donePipeLocked removes the pipe from the instance and closes it; the
// group's last closes the group.
func (bp *bellPoller) donePipeLocked(w *pipeWatch) {
	if bp.pipes[w.id] != w {
		return
	}
	delete(bp.pipes, w.id)
	if !bp.closed {
		rawEpollCtl(bp.epfd, unix.EPOLL_CTL_DEL, w.fd, nil)
	}
	rawClose(w.fd)
	w.g.left--
	if w.g.left == 0 {
		close(w.g.closed)
	}
}

// cutOff ends the group's reading, keeping what was read, and closes its
// pipes.
func (g *pipeGroup) cutOff() {
	g.bp.mu.Lock()
	defer g.bp.mu.Unlock()
	for _, w := range g.watches {
		g.bp.donePipeLocked(w)
	}
}

// shutdownPipes ends every group's reading (the instance is gone): what
// the pipes hold now is read, then they are closed.
func (bp *bellPoller) shutdownPipes() {
	bp.mu.Lock()
	defer bp.mu.Unlock()
	b := bufPool.Get().(*[]byte)
	defer bufPool.Put(b)
	for _, w := range bp.pipes {
		bp.readPipeLocked(w, *b)
		bp.donePipeLocked(w)
	}
}
