package worker

// The control channel between the host and a child: a Unix socket of
// length-prefixed JSON frames, and the bell the child rings when it writes.

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pynox/pynox/internal/frame"
	"golang.org/x/sys/unix"
)

// ctlSendTimeout bounds a write to a child's control socket: a spare that
// does not take its job within it is treated as dead.
const ctlSendTimeout = 5 * time.Second

// ctlPollInterval is how often the host reads the control socket of a
// child whose code closed its bell.
const ctlPollInterval = 5 * time.Millisecond

// inlineFrame is a frame size that always fits a control socket's buffer
// (a Unix socket's is 200 KiB and more by default): a write of that much
// never waits for the reader. runner.py's INLINE_FRAME is the same.
const inlineFrame = 32 << 10

// maxCtlFrame bounds one frame from a child: a child is hostile once user
// code runs, so it gets no more room than an honest report or host call
// needs.
const maxCtlFrame = MaxCall + 64<<10

// sendFrame writes one JSON frame to the child, with descriptors.
func (c *Child) sendFrame(v any, fds []int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.sendRaw(b, fds)
}

// sendRaw writes one frame holding payload to the child. Reads and writes
// may overlap; only closing the socket excludes both.
func (c *Child) sendRaw(payload []byte, fds []int) error {
	buf := frame.Append(make([]byte, 0, len(payload)+frame.HeaderSize), payload)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	c.ctlMu.RLock()
	defer c.ctlMu.RUnlock()
	if c.ctlFd < 0 {
		return unix.EBADF
	}
	// What the socket takes at once goes without the scheduler's notice
	// (rawsys.go); a frame it cannot take waits in a blocking write,
	// bounded by SO_SNDTIMEO.
	n, err := rawSendmsg(c.ctlFd, buf, oob, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
	if err == unix.EAGAIN || err == unix.EINTR {
		n, err = unix.SendmsgN(c.ctlFd, buf, oob, nil, unix.MSG_NOSIGNAL)
	}
	for err == nil && n < len(buf) {
		var m int
		m, err = unix.SendmsgN(c.ctlFd, buf[n:], nil, nil, unix.MSG_NOSIGNAL)
		n += m
	}
	return err
}

// recvCtl reads what the control socket holds now, without blocking.
// A closed socket reads as end of file.
func (c *Child) recvCtl(buf []byte) (int, error) {
	c.ctlMu.RLock()
	defer c.ctlMu.RUnlock()
	if c.ctlFd < 0 {
		return 0, nil
	}
	return rawRecv(c.ctlFd, buf, unix.MSG_DONTWAIT)
}

// closeCtl closes the control socket once; any descriptors a job queued
// on it are freed with it.
func (c *Child) closeCtl() {
	c.ctlMu.Lock()
	defer c.ctlMu.Unlock()
	if c.ctlFd >= 0 {
		rawClose(c.ctlFd)
		c.ctlFd = -1
	}
}

// bellRead is how much readBell takes from the bell at once: a job that
// floods its bell is found out on the first read, not after thousands.
const bellRead = 4 << 10

// spareRings is how many more rings than twice its whole frames a child
// may make before it is killed for ringing without writing frames. The
// runner rings once per frame, and twice for a frame too large for the
// socket's buffer (after its header, and after the rest); a ring may also
// find its frame already read with the one before it. An honest child
// never comes near it; a flood of its bell passes it in one read.
const spareRings = 256

// readBell turns the bell's bytes into rings, for the child's whole
// life, and closes bellClosed at its end of file. It reads in bulk and
// counts each byte as a ring (Child.rung); the turn compares the count
// with the frames the rings brought.
func (c *Child) readBell() {
	defer c.closeBellChan()
	// The buffer is lent for the child's life (one job) from bellBufs.
	bp := bellBufs.Get().(*[bellRead]byte)
	defer bellBufs.Put(bp)
	buf := bp[:]
	// The poller waits for the bell; the read itself is a raw system call
	// (rawsys.go).
	rc, err := c.bell.SyscallConn()
	if err != nil {
		return
	}
	for {
		n := 0
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			for {
				n, rerr = rawRead(int(fd), buf)
				if rerr != unix.EINTR {
					return rerr != unix.EAGAIN
				}
			}
		})
		c.rung.Add(int64(n))
		if err != nil || rerr != nil || n == 0 {
			return // closed, failed, or end of file
		}
		select {
		case c.rings <- struct{}{}:
		default: // a ring is pending already
		}
	}
}

// bellBufs holds the buffers readBell reads rings into.
var bellBufs = sync.Pool{New: func() any { return new([bellRead]byte) }}

// ctlBufs holds the 32 KiB read buffers readFrames lends.
var ctlBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// readFrames reads what the control socket holds now and returns the whole
// frames in it. partial reports the start of a frame still arriving; end
// that the channel ended, with err saying why when it was not clean.
func (c *Child) readFrames() (msgs []childMsg, partial, end bool, err error) {
	// The read buffer is lent from ctlBufs for the call: a child lives for
	// one job, and a buffer of its own was the largest allocation the host
	// made per job (32 KiB to clear, and to collect).
	bp := ctlBufs.Get().(*[]byte)
	defer ctlBufs.Put(bp)
	tmp := *bp
	eof := false
	for {
		n, rerr := c.recvCtl(tmp)
		if rerr == unix.EINTR {
			continue
		}
		if rerr != nil || n == 0 {
			eof = rerr == nil || (rerr != unix.EAGAIN && rerr != unix.EWOULDBLOCK)
			break
		}
		c.pending = append(c.pending, tmp[:n]...)
		if len(c.pending) > maxCtlFrame+frame.HeaderSize {
			break
		}
		if n < len(tmp) {
			// The socket held less than the buffer: it was empty after
			// this read, and a read to see it say so (EAGAIN) cost a
			// system call per frame (a step's report, a host call).
			// What comes later, its end included, is read on the next
			// ring or poll, or between steps.
			break
		}
	}
	for {
		payload, rest, ok, ferr := frame.Split(c.pending, maxCtlFrame)
		if ferr != nil {
			return msgs, false, true, ferr
		}
		if !ok {
			break
		}
		var m childMsg
		if decodeDone(payload, &m) {
			// ctl_fast.go: a report in the runner's exact common format.
		} else if jerr := json.Unmarshal(payload, &m); jerr != nil {
			return msgs, false, true, fmt.Errorf("malformed control frame: %v", jerr)
		}
		c.pending = rest
		c.frames++
		msgs = append(msgs, m)
	}
	if eof {
		if len(c.pending) > 0 {
			return msgs, false, true, errors.New("control channel cut inside a frame")
		}
		return msgs, false, true, nil
	}
	return msgs, len(c.pending) > 0, false, nil
}
