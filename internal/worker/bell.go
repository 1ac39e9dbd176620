package worker

// The bells of a template's children, waited for through one epoll
// instance of the template's own.
//
// A child's bell is a pipe it writes a byte to for each frame. Read
// through an os.File (registered with Go's poller), each child cost a
// goroutine for its life and, at its end, the file's close: os.File
// closes through syscall.Syscall, which, when the pool's one P had been
// idle, woke the runtime's monitor thread on another CPU (see
// rawsys.go). With 2 ms of think time that close was the last such
// wake-up left on a job's way, once per job. Now the template holds an
// epoll instance, registered with Go's poller as one file for the
// template's life; a child's bell is added to it when its first turn
// starts, read by the one goroutine that waits on the instance, and
// removed and closed with raw system calls. What the turn sees is
// unchanged: a ring (Child.rings) for each read that found bytes (each
// byte counted in Child.rung), and Child.bellClosed at the bell's end of
// file or when the child is closed. Should the instance fail, every bell
// it held reads as closed, and the turns fall back to polling the
// control socket (ctlPollInterval).

import (
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// bellPoller waits for the bells of one template's children.
type bellPoller struct {
	f  *os.File // the epoll instance, registered with Go's poller
	rc syscall.RawConn

	mu     sync.Mutex // guards what follows, and the bells' reads and removal
	epfd   int
	closed bool
	seq    uint64
	bells  map[uint64]*Child     // by the id their epoll events carry
	pipes  map[uint64]*pipeWatch // output pipes (pipewatch.go), by id too
}

// newBellPoller makes a template's epoll instance and starts the
// goroutine that reads the bells it reports.
func newBellPoller() (*bellPoller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, err
	}
	f := os.NewFile(uintptr(epfd), "bells")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	bp := &bellPoller{f: f, rc: rc, epfd: epfd, bells: map[uint64]*Child{}, pipes: map[uint64]*pipeWatch{}}
	go bp.run()
	return bp, nil
}

// watch adds c's bell to the instance and reports whether it did.
func (bp *bellPoller) watch(c *Child) bool {
	if bp == nil {
		return false
	}
	bp.mu.Lock()
	defer bp.mu.Unlock()
	if bp.closed {
		return false
	}
	bp.seq++
	id := bp.seq
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(uint32(id)), Pad: int32(uint32(id >> 32))}
	if rawEpollCtl(bp.epfd, unix.EPOLL_CTL_ADD, c.bellFd, &ev) != nil {
		return false
	}
	c.bellID = id
	bp.bells[id] = c
	return true
}

// unwatch removes c's bell from the instance, if it is there; the caller
// then closes it.
func (bp *bellPoller) unwatch(c *Child) {
	if bp == nil {
		return
	}
	bp.mu.Lock()
	defer bp.mu.Unlock()
	bp.removeLocked(c)
}

func (bp *bellPoller) removeLocked(c *Child) {
	if c.bellID == 0 || bp.bells[c.bellID] != c {
		return
	}
	delete(bp.bells, c.bellID)
	if !bp.closed {
		rawEpollCtl(bp.epfd, unix.EPOLL_CTL_DEL, c.bellFd, nil)
	}
}

// close ends the instance (the template is gone): every bell it held
// reads as closed.
func (bp *bellPoller) close() {
	if bp != nil {
		// Marked closed before the descriptor is: once it is, its number
		// may name another descriptor (another template's instance), and
		// watch, watchPipes and the removals must not epoll_ctl on it.
		bp.mu.Lock()
		bp.closed = true
		bp.mu.Unlock()
		bp.f.Close() // run's wait fails, and it shuts the instance
	}
}

// run reads the bells the instance reports ready, for the template's
// life. The instance is level-triggered: a bell that still holds bytes
// is reported again.
func (bp *bellPoller) run() {
	var events [16]unix.EpollEvent
	bp2 := bellBufs.Get().(*[bellRead]byte)
	defer bellBufs.Put(bp2)
	buf := bp2[:]
	var pbuf *[]byte // lent by bufPool once a pipe is read
	defer func() {
		if pbuf != nil {
			bufPool.Put(pbuf)
		}
	}()
	for {
		var n int
		var werr error
		err := bp.rc.Read(func(fd uintptr) bool {
			for {
				n, werr = rawEpollWaitNow(int(fd), events[:])
				if werr != unix.EINTR {
					return werr != nil || n > 0
				}
			}
		})
		if err == nil && werr != nil {
			err = werr
		}
		if err != nil {
			bp.shutdown()
			return
		}
		bp.mu.Lock()
		for _, ev := range events[:n] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			c := bp.bells[id]
			if c == nil {
				if w := bp.pipes[id]; w != nil {
					bp.readPipeLocked(w, pipeBuf(&pbuf))
				}
				continue // else removed since
			}
			k, rerr := rawRead(c.bellFd, buf)
			for rerr == unix.EINTR {
				k, rerr = rawRead(c.bellFd, buf)
			}
			if rerr == unix.EAGAIN {
				continue
			}
			c.rung.Add(int64(k))
			if rerr != nil || k == 0 {
				// End of file (the child closed it or ended), or failed.
				bp.removeLocked(c)
				c.closeBellChan()
				continue
			}
			select {
			case c.rings <- struct{}{}:
			default: // a ring is pending already
			}
		}
		bp.mu.Unlock()
	}
}

// shutdown marks the instance closed and every bell it held closed.
func (bp *bellPoller) shutdown() {
	bp.mu.Lock()
	bp.closed = true
	bells := bp.bells
	bp.bells = map[uint64]*Child{}
	bp.mu.Unlock()
	for _, c := range bells {
		c.closeBellChan()
	}
	bp.shutdownPipes()
	bp.f.Close()
}

// watchBell starts reading the child's bell, once: through its template's
// instance, or, when that is not to be had, through an os.File of its own
// (readBell).
func (c *Child) watchBell() {
	var bp *bellPoller
	if c.tpl != nil {
		bp = c.tpl.bells
	}
	c.bellMu.Lock()
	defer c.bellMu.Unlock()
	if c.bellFd < 0 {
		c.closeBellChan()
		return
	}
	if bp.watch(c) {
		return
	}
	c.bell = os.NewFile(uintptr(c.bellFd), "job-bell")
	go c.readBell()
}

// closeBell closes the child's bell: removed from the instance and closed
// with raw system calls, or its os.File closed (which ends readBell).
func (c *Child) closeBell() {
	c.bellMu.Lock()
	defer c.bellMu.Unlock()
	if c.bell != nil {
		c.bell.Close()
		return
	}
	if c.bellFd < 0 {
		return
	}
	if c.tpl != nil {
		c.tpl.bells.unwatch(c)
	}
	rawClose(c.bellFd)
	c.bellFd = -1
	c.closeBellChan()
}

// closeBellChan closes bellClosed once.
func (c *Child) closeBellChan() {
	c.bellEnd.Do(func() { close(c.bellClosed) })
}

// rawEpollCtl is epoll_ctl(2).
func rawEpollCtl(epfd, op, fd int, ev *unix.EpollEvent) error {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	return errnoErr(e)
}

// rawEpollWaitNow is epoll_pwait(2) with a zero timeout: the events ready
// now.
func rawEpollWaitNow(epfd int, events []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// pipeBuf returns the buffer *pb holds, borrowing one from bufPool first
// when it holds none.
func pipeBuf(pb **[]byte) []byte {
	if *pb == nil {
		*pb = bufPool.Get().(*[]byte)
	}
	return **pb
}
