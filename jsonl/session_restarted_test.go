package jsonl

import (
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// TestSessionRestartedLine: the first step of a session's replacement
// process carries "restarted": true alongside "step": 1; the session's
// first step, and every later step of a process, carry no "restarted".
// A replacement keeps the new request's permissions.
func TestSessionRestartedLine(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": 1, "session": "nb", "code": "x = 1"}`)
	r := ls.await(1)
	requireLineOK(t, r)
	require.Equal(t, 1, stepOf(r))
	_, has := r["restarted"]
	require.False(t, has, "the session's first process is no replacement: %v", r)
	ls.send(`{"id": 2, "session": "nb", "code": "import os\nos._exit(3)"}`)
	r = ls.await(2)
	require.Equal(t, true, r["session_ended"])
	_, has = r["restarted"]
	require.False(t, has)
	ls.send(`{"id": 3, "session": "nb", "code": "print('x' in globals())"}`)
	r = ls.await(3)
	requireLineOK(t, r)
	require.Equal(t, "False\n", r["stdout"])
	require.Equal(t, 1, stepOf(r))
	require.Equal(t, true, r["restarted"], "%v", r)
	ls.send(`{"id": 4, "session": "nb", "code": "print(2)"}`)
	r = ls.await(4)
	require.Equal(t, 2, stepOf(r))
	_, has = r["restarted"]
	require.False(t, has)
	require.Empty(t, ls.finish())
}
