package worker

// Replies to a job's host calls: written in order, and never by a write
// that makes the turn wait.

import (
	"fmt"

	"github.com/pynox/pynox/internal/frame"
	"golang.org/x/sys/unix"
)

// maxQueuedReplies bounds the replies waiting to be written to a child
// that does not read them. An honest runner has at most MaxInFlight calls
// in flight, so at most that many replies outstanding; a job that forges
// calls and never reads is killed before the pool holds more.
const maxQueuedReplies = 2 * MaxInFlight

// replyQueue holds the replies of a turn that the control socket did not
// take at once, for the goroutine that writes them in order.
type replyQueue struct {
	frames  [][]byte // whole frames, or the rest of one partly written
	writing bool     // the writer goroutine runs
}

// sendReply writes a reply frame to the child without making the turn
// wait: what the socket takes at once is written now, the rest (and any
// later reply, so that frames never interleave) by a goroutine that waits
// for the child to read. A child that lets more than maxQueuedReplies
// pile up breaks the protocol.
func (t *turn) sendReply(payload []byte) {
	buf := frame.Append(make([]byte, 0, len(payload)+frame.HeaderSize), payload)
	c := t.c
	c.replyMu.Lock()
	q := &c.replies
	if !q.writing {
		n, err := c.sendNow(buf)
		if err != nil {
			c.replyMu.Unlock()
			t.kill()
			return
		}
		if n == len(buf) {
			c.replyMu.Unlock()
			return
		}
		buf = buf[n:]
	}
	if len(q.frames) >= maxQueuedReplies {
		c.replyMu.Unlock()
		t.violation(fmt.Sprintf("it left more than %d replies to its host calls unread", maxQueuedReplies))
		return
	}
	q.frames = append(q.frames, buf)
	start := !q.writing
	q.writing = true
	c.replyMu.Unlock()
	if start {
		go c.writeReplies()
	}
}

// writeReplies writes the queued replies in order, waiting for the child
// to read, until none is left or the socket fails (the child is gone or
// being killed: the rest is dropped).
func (c *Child) writeReplies() {
	for {
		c.replyMu.Lock()
		q := &c.replies
		if len(q.frames) == 0 {
			q.writing = false
			c.replyMu.Unlock()
			return
		}
		buf := q.frames[0]
		c.replyMu.Unlock()
		err := c.sendAll(buf)
		c.replyMu.Lock()
		if err != nil {
			q.frames = nil
			q.writing = false
			c.replyMu.Unlock()
			c.Kill()
			return
		}
		q.frames = q.frames[1:]
		c.replyMu.Unlock()
	}
}

// sendNow writes as much of buf as the control socket takes without
// waiting.
func (c *Child) sendNow(buf []byte) (int, error) {
	c.ctlMu.RLock()
	defer c.ctlMu.RUnlock()
	if c.ctlFd < 0 {
		return 0, unix.EBADF
	}
	n, err := rawSendmsg(c.ctlFd, buf, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
	if err == unix.EAGAIN || err == unix.EINTR {
		return max(n, 0), nil
	}
	return n, err
}

// sendAll writes all of buf, however long the child takes to read it: a
// write that times out (SO_SNDTIMEO) is retried. It fails once the socket
// does (closed, or the child gone).
func (c *Child) sendAll(buf []byte) error {
	for len(buf) > 0 {
		c.ctlMu.RLock()
		if c.ctlFd < 0 {
			c.ctlMu.RUnlock()
			return unix.EBADF
		}
		n, err := unix.SendmsgN(c.ctlFd, buf, nil, nil, unix.MSG_NOSIGNAL)
		c.ctlMu.RUnlock()
		if n > 0 {
			buf = buf[n:]
		}
		if err != nil && err != unix.EAGAIN && err != unix.EINTR {
			return err
		}
	}
	return nil
}
