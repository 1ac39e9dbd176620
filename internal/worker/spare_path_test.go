package worker

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A one-line job, and one whose expression follows only blank lines, runs
// its expression alone (runner.py: _split_at_last_line returns no code
// before it): the value, the error's line and the globals (__builtins__
// included) are what CPython's own reading of the code gives.
func TestOneLineJobWithoutHead(t *testing.T) {
	tpl := startTestTemplate(t, false)
	for _, c := range []struct {
		code, value string
		errLine     int
	}{
		{code: "6 * 7", value: "42"},
		{code: "\n\n6 * 7\n", value: "42"},
		{code: "  \n\t\n6 * 7", value: "42"},
		{code: "'__builtins__' in globals(), sorted(k for k in globals() if k != '__builtins__')",
			value: `[true, ["__doc__", "__loader__", "__name__", "__package__", "__spec__"]]`},
		{code: "\n\n1 / 0", errLine: 3},
		{code: "1 / 0", errLine: 1},
	} {
		o := runTestJob(t, tpl, Job{Code: c.code})
		require.True(t, o.Started, "code %q: setup error %s", c.code, o.SetupError)
		if c.errLine != 0 {
			require.NotNil(t, o.Error, "code %q: no error; stderr %s", c.code, o.Stderr)
			require.Equal(t, "ZeroDivisionError", o.Error.Type)
			require.NotNil(t, o.Error.Line)
			require.Equal(t, c.errLine, *o.Error.Line, "code %q", c.code)
			require.Contains(t, string(o.Stderr), "line "+string(rune('0'+c.errLine)), "code %q", c.code)
			continue
		}
		require.Nil(t, o.Error, "code %q: stderr %s", c.code, o.Stderr)
		require.JSONEq(t, c.value, string(o.Value), "code %q", c.code)
	}
}

// A job frame larger than one receive (runner.py: _recv_with_fds reads
// the rest of it from the channel) arrives whole, with its descriptors.
func TestJobFrameLargerThanOneReceive(t *testing.T) {
	tpl := startTestTemplate(t, false)
	dir := t.TempDir()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_CLOEXEC|unix.O_DIRECTORY, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	code := "s = '" + strings.Repeat("x", 200<<10) + "'\nopen(" + `"` + dir + `/f", "w").write("ok")` + "\nlen(s)"
	o := runTestJob(t, tpl, Job{Code: code, Grants: []Grant{{Fd: fd, Access: 0x1fff}}})
	require.True(t, o.Started, "setup error %s", o.SetupError)
	require.Nil(t, o.Error, "stderr %s", o.Stderr)
	require.Equal(t, "204800", string(o.Value))
	b, err := unix.Open(dir+"/f", unix.O_RDONLY, 0)
	require.NoError(t, err)
	unix.Close(b)
}
