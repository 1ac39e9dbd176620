package jsonl

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
	"github.com/stretchr/testify/require"
)

// liveServe drives Serve interactively: a test writes lines and reads
// answers as they come, as a client answering host calls must.
type liveServe struct {
	t     *testing.T
	in    *io.PipeWriter
	lines chan map[string]any
	done  chan error
	held  []map[string]any // read while looking for another line (test goroutine only)
}

func startLive(t *testing.T, p *pynox.Pool) *liveServe {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ls := &liveServe{t: t, in: inW, lines: make(chan map[string]any, 1024), done: make(chan error, 1)}
	go func() {
		err := Serve(context.Background(), p, inR, outW)
		outW.Close()
		ls.done <- err
	}()
	go func() {
		sc := bufio.NewScanner(outR)
		sc.Buffer(make([]byte, 1<<20), 8<<20)
		for sc.Scan() {
			m, err := decodeLine(sc.Bytes())
			if err != nil {
				m = map[string]any{"undecodable": sc.Text()}
			}
			ls.lines <- m
		}
		close(ls.lines)
	}()
	ready := ls.next()
	require.Equal(t, "ready", ready["event"])
	t.Cleanup(func() { ls.in.Close() })
	return ls
}

func (ls *liveServe) send(line string) {
	ls.t.Helper()
	_, err := io.WriteString(ls.in, line+"\n")
	require.NoError(ls.t, err)
}

// next returns the next line not yet taken.
func (ls *liveServe) next() map[string]any {
	ls.t.Helper()
	return ls.take("an output line", func(map[string]any) bool { return true })
}

// take returns the first line, held or new, that match accepts, keeping
// the others for later; what names it in a failure.
func (ls *liveServe) take(what string, match func(map[string]any) bool) map[string]any {
	ls.t.Helper()
	for i, m := range ls.held {
		if match(m) {
			ls.held = append(ls.held[:i], ls.held[i+1:]...)
			return m
		}
	}
	for {
		var m map[string]any
		select {
		case mm, ok := <-ls.lines:
			require.True(ls.t, ok, "output ended before %s", what)
			m = mm
		case <-time.After(60 * time.Second):
			ls.t.Fatalf("no %s within 60s", what)
		}
		if match(m) {
			return m
		}
		ls.held = append(ls.held, m)
	}
}

// await returns the answer whose id is id, keeping other lines for next.
func (ls *liveServe) await(id any) map[string]any {
	ls.t.Helper()
	want := fmt.Sprint(id)
	return ls.take("the answer for id "+want, func(m map[string]any) bool {
		return fmt.Sprint(m["id"]) == want && m["event"] != "call"
	})
}

// call waits for the next call event.
func (ls *liveServe) call() map[string]any {
	ls.t.Helper()
	return ls.take("a call event", func(m map[string]any) bool { return m["event"] == "call" })
}

// finish closes the input and waits for Serve, returning the lines
// that were not taken.
func (ls *liveServe) finish() []map[string]any {
	ls.t.Helper()
	ls.in.Close()
	rest := ls.held
	ls.held = nil
	for m := range ls.lines {
		rest = append(rest, m)
	}
	require.NoError(ls.t, <-ls.done)
	return rest
}

func stepOf(l map[string]any) int {
	n, _ := l["step"].(json.Number).Int64()
	return int(n)
}

func TestSessionLifecycle(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)

	ls.send(`{"id": 1, "session": "nb", "code": "x = 41\nprint('set')"}`)
	r := ls.await(1)
	require.Equal(t, "set\n", r["stdout"], "%v", r)
	require.Equal(t, "nb", r["session"])
	require.Equal(t, 1, stepOf(r))
	require.Nil(t, r["session_ended"])

	ls.send(`{"id": 2, "session": "nb", "code": "x += 1\nprint(x)"}`)
	r = ls.await(2)
	require.Equal(t, "42\n", r["stdout"])
	require.Equal(t, 2, stepOf(r))

	// An exception leaves the session alive, like a notebook cell.
	ls.send(`{"id": 3, "session": "nb", "code": "raise KeyError('k')"}`)
	r = ls.await(3)
	require.Equal(t, "KeyError", errType(r))
	require.Nil(t, r["session_ended"])
	require.Contains(t, r["stderr"], "KeyError")

	ls.send(`{"id": 4, "session": "nb", "code": "print(x)", "name": "cell4.py"}`)
	r = ls.await(4)
	require.Equal(t, "42\n", r["stdout"])
	require.Equal(t, "", r["stderr"], "each step has its own output")

	// A permission field on a later step is refused; the session lives on.
	ls.send(`{"id": 5, "session": "nb", "code": "print(x)", "allow_read": ["."]}`)
	r = ls.await(5)
	require.Equal(t, "RequestError", errType(r))
	require.Contains(t, errMessage(r), "allow_read")
	ls.send(`{"id": 6, "session": "nb", "code": "print(x)", "timeout": "2s", "max_output": 100, "args": ["a"]}`)
	r = ls.await(6)
	require.Equal(t, "42\n", r["stdout"], "%v", r)

	// An exit ends the process; the next request starts a new one.
	ls.send(`{"id": 7, "session": "nb", "code": "import sys\nsys.exit(3)"}`)
	r = ls.await(7)
	require.Equal(t, json.Number("3"), r["exit"])
	require.Equal(t, true, r["session_ended"])
	ls.send(`{"id": 8, "session": "nb", "code": "print(x)"}`)
	r = ls.await(8)
	require.Equal(t, "NameError", errType(r))
	require.Equal(t, 1, stepOf(r))

	// Stats count the session.
	ls.send(`{"id": "s", "stats": true}`)
	r = ls.await("s")
	require.Equal(t, json.Number("1"), r["sessions_active"])

	ls.send(`{"id": 9, "session": "nb", "close": true}`)
	r = ls.await(9)
	require.Equal(t, true, r["closed"])
	require.Equal(t, "nb", r["session"])
	ls.send(`{"id": 10, "session": "nb", "close": true}`)
	r = ls.await(10)
	require.Equal(t, "RequestError", errType(r))
	ls.send(`{"id": 11, "session": "nb", "close": true, "code": "1"}`)
	require.Equal(t, "RequestError", errType(ls.await(11)))
	ls.send(`{"id": 12, "session": "other", "script": "x.py"}`)
	require.Equal(t, "RequestError", errType(ls.await(12)))
	ls.send(`{"id": 13, "close": true}`)
	require.Equal(t, "RequestError", errType(ls.await(13)))
	require.Empty(t, ls.finish())
	require.Equal(t, 0, p.Stats().SessionsActive)
}

func TestSessionEndsOnTimeoutAndCrash(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": 1, "session": "s", "code": "x = 1"}`)
	requireLineOK(t, ls.await(1))
	ls.send(`{"id": 2, "session": "s", "code": "while True: pass", "timeout": "300ms"}`)
	r := ls.await(2)
	require.Equal(t, "TimeoutError", errType(r))
	require.Equal(t, true, r["session_ended"])
	ls.send(`{"id": 3, "session": "s", "code": "print(x)"}`)
	require.Equal(t, "NameError", errType(ls.await(3)), "a new process after the timeout")
	ls.send(`{"id": 4, "session": "s", "code": "import ctypes\nctypes.string_at(0)"}`)
	r = ls.await(4)
	require.Equal(t, "SignalError", errType(r))
	require.Equal(t, true, r["session_ended"])
	ls.send(`{"id": 5, "session": "s", "code": "import os\nos._exit(0)"}`)
	r = ls.await(5)
	require.Equal(t, true, r["session_ended"], "%v", r)
	ls.send(`{"id": 6, "session": "s", "code": "x = [0] * (1 << 40)"}`)
	r = ls.await(6)
	require.Equal(t, "MemoryError", errType(r))
	require.Equal(t, true, r["session_ended"])
	ls.send(`{"id": 7, "session": "s", "code": "print('fine')"}`)
	r = ls.await(7)
	requireLineOK(t, r)
	require.Equal(t, "fine\n", r["stdout"])
	require.Empty(t, ls.finish())
}

func requireLineOK(t *testing.T, l map[string]any) {
	t.Helper()
	require.Nil(t, l["error"], "%v", l)
	require.Equal(t, json.Number("0"), l["exit"], "%v", l)
}

func TestSessionPermissionsFixedAtCreation(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	dir := p.Config().Dir
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "data"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "f.txt"), []byte("secret-ish"), 0o644))
	ls := startLive(t, p)
	ls.send(`{"id": 1, "session": "a", "code": "import os", "allow_read": ["data"], "env": {"K": "v"}}`)
	requireLineOK(t, ls.await(1))
	ls.send(`{"id": 2, "session": "a", "code": "print(open('data/f.txt').read(), os.environ['K'])"}`)
	r := ls.await(2)
	require.Equal(t, "secret-ish v\n", r["stdout"], "%v", r)
	require.Equal(t, []any{filepath.Join(dir, "data")}, r["policy"].(map[string]any)["allow_read"])
	ls.send(`{"id": 3, "session": "a", "code": "open('data/new.txt', 'w')"}`)
	require.Equal(t, "PermissionError", errType(ls.await(3)))
	// After the process ends, the next request brings its own permissions.
	ls.send(`{"id": 4, "session": "a", "code": "raise SystemExit"}`)
	require.Equal(t, true, ls.await(4)["session_ended"])
	ls.send(`{"id": 5, "session": "a", "code": "print(open('data/f.txt').read())"}`)
	require.Equal(t, "PermissionError", errType(ls.await(5)))
	// A session in another name is isolated from this one.
	ls.send(`{"id": 6, "session": "b", "code": "print('x' in globals())"}`)
	require.Equal(t, "False\n", ls.await(6)["stdout"])
	ls.send(`{"id": 7, "session": "a", "code": "x = 1"}`)
	requireLineOK(t, ls.await(7))
	ls.send(`{"id": 8, "session": "b", "code": "print('x' in globals())"}`)
	require.Equal(t, "False\n", ls.await(8)["stdout"])
	require.Empty(t, ls.finish())
}

func TestSessionLimits(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1, MaxSessions: 2, SessionIdle: 1500 * time.Millisecond})
	ls := startLive(t, p)
	ls.send(`{"id": 1, "session": "a", "code": "x = 1"}`)
	ls.send(`{"id": 2, "session": "b", "code": "x = 2"}`)
	requireLineOK(t, ls.await(1))
	requireLineOK(t, ls.await(2))
	ls.send(`{"id": 3, "session": "c", "code": "x = 3"}`)
	r := ls.await(3)
	require.Equal(t, "RequestError", errType(r))
	require.Contains(t, errMessage(r), "max_sessions")
	ls.send(`{"id": 4, "session": "b", "close": true}`)
	require.Equal(t, true, ls.await(4)["closed"])
	ls.send(`{"id": 5, "session": "c", "code": "x = 3"}`)
	requireLineOK(t, ls.await(5))

	// Eight requests pending on a session is the most it holds.
	ls.send(`{"id": "slow", "session": "a", "code": "import time\ntime.sleep(1.5)"}`)
	for i := 0; i < 9; i++ {
		ls.send(fmt.Sprintf(`{"id": "q%d", "session": "a", "code": "x += 1\nprint(x)"}`, i))
	}
	requireLineOK(t, ls.await("slow"))
	refused := 0
	var printed []string
	for i := 0; i < 9; i++ {
		r := ls.await(fmt.Sprintf("q%d", i))
		if errType(r) == "RequestError" {
			require.Contains(t, errMessage(r), "pending")
			refused++
			continue
		}
		requireLineOK(t, r)
		printed = append(printed, r["stdout"].(string))
	}
	require.Equal(t, 2, refused, "the slow step plus 7 queued fill the session")
	require.Equal(t, []string{"2\n", "3\n", "4\n", "5\n", "6\n", "7\n", "8\n"}, printed, "steps run in order")

	// An idle session is closed by the pool; its name starts afresh.
	require.Eventually(t, func() bool { return p.Stats().SessionsActive == 0 }, 10*time.Second, 50*time.Millisecond)
	ls.send(`{"id": 6, "session": "a", "code": "print(x)"}`)
	r = ls.await(6)
	require.Equal(t, "NameError", errType(r))
	require.Equal(t, 1, stepOf(r))
	require.Empty(t, ls.finish())
}

func TestSessionLogLines(t *testing.T) {
	t.Parallel()
	logFile, err := os.CreateTemp(t.TempDir(), "log") // an *os.File takes concurrent writes
	require.NoError(t, err)
	defer logFile.Close()
	p := newTestPool(t, pynox.Config{Workers: 1, Logger: slog.New(NewLogHandler(logFile))})
	lines := serveLines(t, p, `{"id": "a", "session": "s", "code": "x = 1"}
{"id": "b", "session": "s", "code": "print(x)"}
{"id": "c", "code": "print(2)"}
`)
	require.Len(t, lines, 4)
	var logs []map[string]any
	logged, err := os.ReadFile(logFile.Name())
	require.NoError(t, err)
	for _, l := range strings.Split(strings.TrimSpace(string(logged)), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		if m["event"] == "job" {
			logs = append(logs, m)
		}
	}
	require.Len(t, logs, 3)
	byID := map[string]map[string]any{}
	for _, l := range logs {
		byID[l["id"].(string)] = l
	}
	require.Equal(t, "s", byID["b"]["session"])
	require.Equal(t, float64(2), byID["b"]["step"])
	require.Nil(t, byID["c"]["session"])
	require.Nil(t, byID["c"]["step"])
	_, has := byID["c"]["step"]
	require.True(t, has, "step is null, not missing, for one-shot jobs")
}
