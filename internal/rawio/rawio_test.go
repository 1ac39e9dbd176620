package rawio

import (
	"io"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A read that drained the pipe (it returned less than it asked for) makes
// the next Read wait in the poller before reading: what is written later,
// at once or after a pause, and the pipe's end are all still read.
func TestReadAfterDrainingRead(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	rf := New(r)
	require.NotNil(t, rf)
	buf := make([]byte, 64)

	_, err = w.Write([]byte("one"))
	require.NoError(t, err)
	n, err := rf.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "one", string(buf[:n]))
	require.True(t, rf.drained)

	// Written before the next Read starts.
	_, err = w.Write([]byte("two"))
	require.NoError(t, err)
	n, err = rf.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "two", string(buf[:n]))

	// Written while the next Read waits.
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, _ = w.Write([]byte("three"))
	}()
	n, err = rf.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "three", string(buf[:n]))

	// A read that fills the buffer does not count as draining.
	_, err = w.Write(make([]byte, 100))
	require.NoError(t, err)
	n, err = rf.Read(buf)
	require.NoError(t, err)
	require.Equal(t, len(buf), n)
	require.False(t, rf.drained)
	n, err = rf.Read(buf)
	require.NoError(t, err)
	require.Equal(t, 36, n)

	// The end of the pipe, after a draining read.
	go func() {
		time.Sleep(50 * time.Millisecond)
		w.Close()
	}()
	_, err = rf.Read(buf)
	require.ErrorIs(t, err, io.EOF)
}
