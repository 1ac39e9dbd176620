package jsonl

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// Issue 17.10: of two pipelined closes of one session, the second finds
// no session.
func TestPipelinedClosesOfOneSession(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ls := startLive(t, p)
	ls.send(`{"id": 1, "session": "a", "code": "x = 1"}` + "\n" +
		`{"id": 2, "session": "a", "close": true}` + "\n" +
		`{"id": 3, "session": "a", "close": true}`)
	requireLineOK(t, ls.await(1))
	require.Equal(t, true, ls.await(2)["closed"])
	r := ls.await(3)
	require.Nil(t, r["closed"], "the second close: %v", r)
	require.Equal(t, "RequestError", errType(r))
	require.Contains(t, errMessage(r), `no session named "a"`)
	require.Empty(t, ls.finish())
}

// Serve on a Pool that New did not make fails at once, writing nothing.
func TestServeZeroValuePool(t *testing.T) {
	t.Parallel()
	var p pynox.Pool
	var out bytes.Buffer
	err := Serve(context.Background(), &p, strings.NewReader(`{"code": "1"}`+"\n"), &out)
	require.ErrorIs(t, err, pynox.ErrClosed)
	require.Contains(t, err.Error(), "New")
	require.Empty(t, out.String())
}
