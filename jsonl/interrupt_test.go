package jsonl

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// markCode returns code that creates path, and path's JSON string.
func markCode(path string) string {
	q, _ := json.Marshal(path)
	return "open(" + string(q) + ", 'w').close()\n"
}

func awaitMark(t *testing.T, path string) {
	t.Helper()
	require.Eventually(t, func() bool { _, err := os.Stat(path); return err == nil }, time.Minute, 10*time.Millisecond)
}

func jsonLine(t *testing.T, v map[string]any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestServeInterruptSession(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	dir := p.Config().Dir
	ls := startLive(t, p)

	ls.send(jsonLine(t, map[string]any{"id": 1, "session": "s", "code": "x = 5", "allow_write": []string{dir}}))
	requireLineOK(t, ls.await(1))
	ls.send(`{"id": 2, "session": "s", "interrupt": true}`)
	l := ls.next()
	require.Equal(t, map[string]any{"id": json.Number("2"), "session": "s", "interrupted": false}, l, "no step is running")

	mark := filepath.Join(dir, "started")
	ls.send(jsonLine(t, map[string]any{"id": 3, "session": "s", "code": markCode(mark) + "while True: pass"}))
	awaitMark(t, mark)
	ls.send(`{"id": 4, "session": "s", "interrupt": true}`)
	l = ls.next() // the answer, out of band, before the step's result
	require.Equal(t, map[string]any{"id": json.Number("4"), "session": "s", "interrupted": true}, l)
	l = ls.next()
	require.Equal(t, json.Number("3"), l["id"])
	require.Equal(t, "KeyboardInterrupt", errType(l))
	require.NotEqual(t, true, l["session_ended"])

	ls.send(`{"id": 5, "session": "s", "code": "print(x)"}`)
	l = ls.await(5)
	requireLineOK(t, l)
	require.Equal(t, "5\n", l["stdout"])
	require.Equal(t, 3, stepOf(l))

	// Bad interrupts: one answer each, naming what is wrong.
	ls.send(`{"id": 6, "session": "nope", "interrupt": true}`)
	l = ls.await(6)
	require.Equal(t, "RequestError", errType(l))
	require.Contains(t, errMessage(l), `no session named "nope"`)
	ls.send(`{"id": 7, "interrupt": true}`)
	require.Contains(t, errMessage(ls.await(7)), "interrupt needs the session")
	ls.send(`{"id": 8, "session": "s", "interrupt": true, "code": "1"}`)
	require.Contains(t, errMessage(ls.await(8)), "no other fields than id, session and interrupt")
	require.Empty(t, ls.finish())
}

func TestServeCancelJobs(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	dir := p.Config().Dir
	ls := startLive(t, p)
	mark := filepath.Join(dir, "running")
	ls.send(jsonLine(t, map[string]any{"id": "run", "code": markCode(mark) + "while True: pass", "allow_write": []string{dir}}))
	awaitMark(t, mark)
	// Queued jobs (waiting for the worker): answered at once, never run.
	for range 2 {
		ls.send(`{"id": "queued", "code": "print('ran')"}`)
	}
	ls.send(`{"id": "c1", "cancel": "queued"}`)
	require.Equal(t, map[string]any{"id": "c1", "cancel": "queued", "cancelled": true}, ls.next())
	for range 2 {
		l := ls.next()
		require.Equal(t, "queued", l["id"])
		require.Equal(t, "CancelledError", errType(l))
		require.Equal(t, json.Number("-1"), l["exit"])
		require.Empty(t, l["stdout"])
	}

	// The running job: killed, then answered.
	ls.send(`{"cancel": "run"}`)
	require.Equal(t, map[string]any{"id": nil, "cancel": "run", "cancelled": true}, ls.next())
	l := ls.next()
	require.Equal(t, "run", l["id"])
	require.Equal(t, "CancelledError", errType(l))
	require.Equal(t, json.Number("-1"), l["exit"])

	// Nothing to cancel, and bad requests.
	ls.send(`{"id": "c3", "cancel": 7}`)
	require.Equal(t, map[string]any{"id": "c3", "cancel": json.Number("7"), "cancelled": false}, ls.next())
	ls.send(`{"id": "c4", "cancel": [1]}`)
	require.Contains(t, errMessage(ls.await("c4")), "cancel: expected the id of a job")
	ls.send(`{"id": "c5", "cancel": 1, "code": "1"}`)
	require.Contains(t, errMessage(ls.await("c5")), "no other fields than id and cancel")

	// The pool serves on.
	ls.send(`{"id": "after", "code": "print('ok')"}`)
	require.Equal(t, "ok\n", ls.await("after")["stdout"])
	// The three cancelled jobs count as cancelled, not failed: their code
	// neither raised nor exited (the spec's "failed").
	st := p.Stats()
	require.Equal(t, int64(3), st.Cancelled)
	require.Zero(t, st.Failed)
	require.Equal(t, st.Jobs, st.OK+st.Failed+st.Timeouts+st.Signals+st.RequestErrors+st.WorkerErrors+st.Cancelled)
	require.Empty(t, ls.finish())
}
