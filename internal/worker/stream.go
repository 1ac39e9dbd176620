package worker

// Streamed output: a job's stdout and stderr passed on to a callback as
// they come, besides being kept (up to MaxOutput) for the outcome.

import (
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// The output streams an OutputFunc is told about.
const (
	Stdout = 1
	Stderr = 2
)

// OutputFunc receives a job's output while it runs: stream is Stdout or
// Stderr, text is valid UTF-8 (a character split between two reads is
// passed whole, in the later call; bytes that are not UTF-8 become
// U+FFFD, one per byte, as encoding/json writes them). Calls are made one
// at a time, in the order each stream was read, and all of them return
// before the turn's outcome does. A call that blocks holds up the
// stream's reader: the pipe fills and the job's writes wait (and its
// timeout still runs).
type OutputFunc func(stream int, text string)

// Coalescing: after a read of fewer than coalesceBelow bytes, a stream's
// reader waits coalesceWait before it reads again (unless the turn's
// outcome is known), so that a job writing many small lines makes a call
// per batch, not per line. A full pipe is read at once.
const (
	coalesceBelow = 4 << 10
	coalesceWait  = 5 * time.Millisecond
)

// MaxStreamChunk is the most bytes of output one OutputFunc call carries
// (before invalid bytes become U+FFFD, each three bytes long): one read of
// a pipe, into a buffer of bufPool.
const MaxStreamChunk = 32 << 10

// streamer passes a turn's output to its OutputFunc.
type streamer struct {
	mu sync.Mutex // one call at a time, across both streams
	fn OutputFunc
	// hurry is closed once the turn's outcome is known: the readers stop
	// waiting to coalesce, so that the end of the output is not delayed.
	hurry     chan struct{}
	hurryDone bool // the turn's goroutine only
}

// startStream starts a reader for each pipe; closed is closed when both
// reached end of file (or were cut off) and every call has returned.
func (out *output) startStream(outFd, errFd int) {
	closed := make(chan struct{})
	out.closed = closed
	stdout := os.NewFile(uintptr(outFd), "job-stdout")
	stderr := os.NewFile(uintptr(errFd), "job-stderr")
	out.files = []*os.File{stdout, stderr}
	var wg sync.WaitGroup
	wg.Add(2)
	go out.stream.read(stdout, &out.stdout, Stdout, &wg)
	go out.stream.read(stderr, &out.stderr, Stderr, &wg)
	go func() {
		wg.Wait()
		stdout.Close()
		stderr.Close()
		close(closed)
	}()
}

// known tells the readers that the turn's outcome is known; called on the
// turn's goroutine, any number of times.
func (out *output) known() {
	if s := out.stream; s != nil && !s.hurryDone {
		s.hurryDone = true
		close(s.hurry)
	}
}

// read reads f to end of file (or until it is closed), keeping what k
// keeps and passing everything to the callback.
func (s *streamer) read(f *os.File, k *sink, which int, wg *sync.WaitGroup) {
	defer wg.Done()
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := (*bp)[:MaxStreamChunk]
	var carry utf8Carry
	var wait *time.Timer
	defer func() {
		if wait != nil {
			wait.Stop()
		}
	}()
	for {
		n, err := f.Read(buf)
		if n > 0 {
			k.add(buf[:n])
			s.emit(which, carry.text(buf[:n], false))
		}
		if err != nil {
			// The end of the stream: a character left incomplete is
			// passed on as U+FFFD.
			s.emit(which, carry.text(nil, true))
			return
		}
		if n < coalesceBelow {
			if wait == nil {
				wait = time.NewTimer(coalesceWait)
			} else {
				wait.Reset(coalesceWait)
			}
			select {
			case <-wait.C:
			case <-s.hurry:
			}
		}
	}
}

// emit makes one call, unless text is empty.
func (s *streamer) emit(which int, text string) {
	if text == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fn(which, text)
}

// utf8Carry holds the bytes of a character cut off at the end of one
// read until the next.
type utf8Carry struct {
	b [utf8.UTFMax]byte
	n int
}

// text turns the next bytes of a stream into valid UTF-8: the bytes held
// from before come first, and, unless final, an incomplete character at
// the end is held for the next call.
func (c *utf8Carry) text(p []byte, final bool) string {
	b := p
	if c.n > 0 {
		// A fresh slice: c.b is overwritten below.
		b = append(append(make([]byte, 0, c.n+len(p)), c.b[:c.n]...), p...)
		c.n = 0
	}
	if !final {
		if keep := incompleteTail(b); keep > 0 {
			c.n = copy(c.b[:], b[len(b)-keep:])
			b = b[:len(b)-keep]
		}
	}
	return validString(b)
}

// incompleteTail returns how many bytes at the end of b start a UTF-8
// character that the next bytes could complete.
func incompleteTail(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return len(b) - i
			}
			return 0
		}
	}
	return 0
}

// validString converts b to a string, each byte that is not part of a
// valid UTF-8 character replaced by U+FFFD.
func validString(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b) + 16)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			sb.WriteString("\uFFFD")
		} else {
			sb.Write(b[:size])
		}
		b = b[size:]
	}
	return sb.String()
}
