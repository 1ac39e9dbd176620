package pynox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// outputEvent is one OnOutput call a test saw.
type outputEvent struct {
	stream Stream
	text   string
}

// outputLog records OnOutput calls, and the calls that came after the
// test said the turn's result was back.
type outputLog struct {
	mu       sync.Mutex
	events   []outputEvent
	returned atomic.Bool
	late     atomic.Int64
	invalid  atomic.Int64 // calls whose text was not valid UTF-8, or empty
	// ack, when set, is a directory where a file named after each call's
	// text (trimmed) is created once the call has it: the job waits for
	// it, which orders the job's next write after this call.
	ack   string
	delay time.Duration
}

func (l *outputLog) fn(stream Stream, text string) {
	if l.returned.Load() {
		l.late.Add(1)
	}
	if !utf8.ValidString(text) || text == "" {
		l.invalid.Add(1)
	}
	l.mu.Lock()
	l.events = append(l.events, outputEvent{stream, text})
	l.mu.Unlock()
	if l.ack != "" {
		os.WriteFile(filepath.Join(l.ack, "ack-"+strings.TrimSpace(text)), nil, 0o644)
	}
	if l.delay > 0 {
		time.Sleep(l.delay)
	}
}

// text is what the calls passed on for stream.
func (l *outputLog) text(stream Stream) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, e := range l.events {
		if e.stream == stream {
			b.WriteString(e.text)
		}
	}
	return b.String()
}

// waitAck is Python that waits for the host's OnOutput to have seen the
// text name (see outputLog.ack).
const waitAck = `
import os, sys, time
def wait_ack(name):
    path = os.path.join(os.environ["ACK_DIR"], "ack-" + name)
    while not os.path.exists(path):
        time.sleep(0.005)
`

// The loop reaches OnOutput in order, each line before the job
// ends: the job prints its next line only once the host's callback has
// seen the last one, so a pool that passed output on only at the end
// would time the job out.
func TestStreamOutputBeforeResult(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	dir := p.Config().Dir
	log := &outputLog{ack: dir}
	res := run(t, p, Job{Code: waitAck + `
for i in range(3):
    print(i, flush=True)
    wait_ack(str(i))
    time.sleep(0.3)
`, AllowRead: []string{dir}, Env: map[string]string{"ACK_DIR": dir}, Timeout: 20 * time.Second, OnOutput: log.fn})
	log.returned.Store(true)
	requireOK(t, res)
	require.Equal(t, "0\n1\n2\n", res.Stdout)
	require.Equal(t, "0\n1\n2\n", log.text(Stdout))
	require.Equal(t, []outputEvent{{Stdout, "0\n"}, {Stdout, "1\n"}, {Stdout, "2\n"}}, log.events)
	require.Zero(t, log.invalid.Load())
	require.Zero(t, log.late.Load())

	// Without OnOutput nothing changes.
	res = run(t, p, Job{Code: "import time\nfor i in range(3): print(i, flush=True); time.sleep(0.05)"})
	requireOK(t, res)
	require.Equal(t, "0\n1\n2\n", res.Stdout)
}

// Stdout and stderr are told apart, and (when the job waits for each
// write to be seen) come in the order written.
func TestStreamStderrInterleaved(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	dir := p.Config().Dir
	log := &outputLog{ack: dir}
	res := run(t, p, Job{Code: waitAck + `
for i in range(2):
    print(f"out{i}", flush=True)
    wait_ack(f"out{i}")
    print(f"err{i}", file=sys.stderr, flush=True)
    wait_ack(f"err{i}")
raise ValueError("boom")
`, AllowRead: []string{dir}, Env: map[string]string{"ACK_DIR": dir}, Timeout: 20 * time.Second, OnOutput: log.fn})
	log.returned.Store(true)
	requireErrorType(t, res, "ValueError")
	require.Equal(t, []outputEvent{{Stdout, "out0\n"}, {Stderr, "err0\n"}, {Stdout, "out1\n"}, {Stderr, "err1\n"}}, log.events[:4])
	// The traceback follows on stderr, like the Result's.
	require.Equal(t, res.Stderr, log.text(Stderr))
	require.Contains(t, log.text(Stderr), "ValueError: boom")
	require.Equal(t, "out0\nout1\n", log.text(Stdout))
	require.Zero(t, log.late.Load())
	require.Equal(t, "stdout", Stdout.String())
	require.Equal(t, "stderr", Stderr.String())
}

// A character written in two pieces is passed on whole; bytes that are
// not UTF-8 become U+FFFD, and every call's text is valid UTF-8.
func TestStreamUTF8AcrossChunks(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	dir := p.Config().Dir
	log := &outputLog{ack: dir}
	res := run(t, p, Job{Code: waitAck + `
out = sys.stdout.buffer
out.write(b"A\xe2\x82"); out.flush()   # the euro sign's first two bytes
wait_ack("A")
out.write(b"\xac\n"); out.flush()
wait_ack("\u20ac")
out.write(b"B\xff\xfeC\xf0\x9f"); out.flush()   # invalid bytes, then half an emoji
wait_ack("B\ufffd\ufffdC")
out.write(b"\x98\x80\xe2\x82")   # the emoji's rest, then a cut-off character at the end
`, AllowRead: []string{dir}, Env: map[string]string{"ACK_DIR": dir}, Timeout: 20 * time.Second, OnOutput: log.fn})
	log.returned.Store(true)
	requireOK(t, res)
	require.Zero(t, log.invalid.Load())
	require.Equal(t, "A\xe2\x82\xac\nB\xff\xfeC\U0001F600\xe2\x82", res.Stdout)
	require.Equal(t, []outputEvent{{Stdout, "A"}, {Stdout, "€\n"}, {Stdout, "B\uFFFD\uFFFDC"}, {Stdout, "\U0001F600"}, {Stdout, "\uFFFD\uFFFD"}}, log.events)
}

// A slow callback slows the job instead of growing the pool's memory:
// 50 MB written while each call sleeps leave the heap within a bound,
// and the stream carries all of it, beyond what the Result keeps.
func TestStreamSlowCallbackBoundedMemory(t *testing.T) {
	testenv.Slow(t)
	// Sequential: it measures the test process's heap.
	p := newTestPool(t, Config{Workers: 1})
	const total = 50 << 20
	var got atomic.Int64
	var calls atomic.Int64
	onOut := func(s Stream, text string) {
		got.Add(int64(len(text)))
		calls.Add(1)
		time.Sleep(time.Millisecond)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tk := time.NewTicker(2 * time.Millisecond)
		defer tk.Stop()
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				runtime.ReadMemStats(&m)
				if m.HeapInuse > peak.Load() {
					peak.Store(m.HeapInuse)
				}
			}
		}
	}()
	res := run(t, p, Job{Code: fmt.Sprintf(`
import sys
chunk = "x" * (1 << 20)
for _ in range(%d):
    sys.stdout.write(chunk)
`, total>>20), MaxOutput: 64 << 10, Timeout: 30 * time.Second, OnOutput: onOut})
	close(stop)
	<-sampled
	requireOK(t, res)
	grew := int64(peak.Load()) - int64(base)
	t.Logf("50 MB streamed in %d calls through a 1 ms callback: heap in use %d KiB at start, peak %d KiB (+%d KiB)",
		calls.Load(), base>>10, peak.Load()>>10, grew>>10)
	// The pool holds a 32 KiB chunk per stream; the rest is the garbage
	// of the texts passed on, which the collector's pacing bounds.
	require.Less(t, grew, int64(16<<20), "the heap grew with the output")
	require.EqualValues(t, total, got.Load(), "the stream carries all the output")
	require.Len(t, res.Stdout, 64<<10)
	require.True(t, res.StdoutTruncated)
}

// No call comes after the result is returned: not from a thread that
// writes on after the job's end, nor from a job killed at its timeout
// while the callback is slow.
func TestStreamNoCallbackAfterResult(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	writer := `
import sys, threading, time
def w():
    while True:
        sys.stdout.write("x" * 1000 + "\n")
threading.Thread(target=w, daemon=True).start()
`
	log := &outputLog{delay: 2 * time.Millisecond}
	res := run(t, p, Job{Code: writer + "time.sleep(0.2)\n", OnOutput: log.fn})
	log.returned.Store(true)
	requireOK(t, res)
	require.NotEmpty(t, log.text(Stdout))

	log2 := &outputLog{delay: 2 * time.Millisecond}
	res = run(t, p, Job{Code: writer + "time.sleep(60)\n", Timeout: time.Second, OnOutput: log2.fn})
	log2.returned.Store(true)
	requireErrorType(t, res, "TimeoutError")

	// A session step whose thread writes on after the step's report.
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(ctx)
	log3 := &outputLog{delay: 2 * time.Millisecond}
	ev, err := co.Feed(ctx, Step{Code: writer + "time.sleep(0.2)\n", OnOutput: log3.fn})
	log3.returned.Store(true)
	require.NoError(t, err)
	requireOK(t, ev.Result)
	n3 := len(log3.events)
	require.NotZero(t, n3)

	// A ctx that ends while the step runs: Feed's error comes after the
	// last call too.
	log4 := &outputLog{delay: 2 * time.Millisecond}
	cctx, cancel := context.WithCancel(ctx)
	ev, err = co.Feed(cctx, Step{Code: "import sys\nprint('started', flush=True)\nwhile True: sys.stdout.write('y' * 1000 + '\\n')", OnOutput: func(s Stream, text string) {
		log4.fn(s, text)
		cancel()
	}})
	log4.returned.Store(true)
	require.ErrorIs(t, err, context.Canceled)

	time.Sleep(300 * time.Millisecond)
	for i, l := range []*outputLog{log, log2, log3, log4} {
		require.Zero(t, l.late.Load(), "log %d: a call after the result", i+1)
	}
	require.Equal(t, n3, len(log3.events))
}

// A session step's output goes to the step's OnOutput, or else to the
// session job's.
func TestStreamSessionSteps(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	def := &outputLog{}
	co, err := p.Checkout(ctx, Job{OnOutput: def.fn})
	require.NoError(t, err)
	defer co.Finish(ctx)
	own := &outputLog{}
	ev, err := co.Feed(ctx, Step{Code: "x = 1\nprint('one')", OnOutput: own.fn})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	ev, err = co.Feed(ctx, Step{Code: "import sys\nprint('two', x)\nprint('warn', file=sys.stderr)"})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "one\n", own.text(Stdout))
	require.Equal(t, "two 1\n", def.text(Stdout))
	require.Equal(t, "warn\n", def.text(Stderr))
}

// A panicking callback stops that job's calls; the job runs to its end
// and the pool serves on.
func TestStreamCallbackPanic(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	var calls atomic.Int64
	res := run(t, p, Job{Code: "import time\nfor i in range(3): print(i, flush=True); time.sleep(0.05)", OnOutput: func(Stream, string) {
		calls.Add(1)
		panic("callback bug")
	}})
	requireOK(t, res)
	require.Equal(t, "0\n1\n2\n", res.Stdout)
	require.EqualValues(t, 1, calls.Load())
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
}

// A job printing many short lines makes a call per batch, not per line
// (the count depends on timing, so it is logged, not asserted); the text
// is whole and in order all the same.
func TestStreamCoalescesSmallWrites(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	log := &outputLog{}
	res := run(t, p, Job{Code: "for i in range(10000): print(i, flush=True)", OnOutput: log.fn})
	log.returned.Store(true)
	requireOK(t, res)
	var want strings.Builder
	for i := range 10000 {
		fmt.Fprintf(&want, "%d\n", i)
	}
	require.Equal(t, want.String(), log.text(Stdout))
	require.Equal(t, want.String(), res.Stdout)
	t.Logf("10000 lines, each flushed: %d calls", len(log.events))
}
