package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// allowedCPUCount is how many CPUs the test process may run on.
func allowedCPUCount(t *testing.T) int {
	var set unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &set))
	return set.Count()
}

// TestPinCPUsFlag checks that `pynox pool` pins its templates by default
// (a CPU per worker in the ready event's pinned_cpus where two CPUs or
// more are allowed), and that --pin-cpus=false and [pool] pin_cpus =
// false turn it off, the flag overriding the file.
func TestPinCPUsFlag(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	dir := t.TempDir()
	off := filepath.Join(dir, "off.toml")
	require.NoError(t, os.WriteFile(off, []byte("[pool]\npin_cpus = false\n"), 0o644))
	pinned := func(args ...string) []any {
		p := startPoolIn(t, dir, append([]string{"--workers=2"}, args...)...)
		v, ok := p.ready["pinned_cpus"].([]any)
		require.True(t, ok, "pinned_cpus is a list: %v", p.ready)
		return v
	}
	if allowedCPUCount(t) >= 2 {
		require.Len(t, pinned(), 2, "on by default")
		require.Len(t, pinned("--config="+off, "--pin-cpus"), 2, "the flag overrides the file")
	} else {
		require.Empty(t, pinned(), "one allowed CPU: nothing to pin")
	}
	require.Empty(t, pinned("--pin-cpus=false"))
	require.Empty(t, pinned("--config="+off))
}

// TestPinCPUsBadValues checks that a wrong value of the flag or of the
// key is refused with its name and what is expected.
func TestPinCPUsBadValues(t *testing.T) {
	var out, errb strings.Builder
	require.Equal(t, 2, run([]string{"pool", "--pin-cpus=maybe"}, strings.NewReader(""), &out, &errb))
	require.Contains(t, errb.String(), `--pin-cpus=maybe: expected true or false`)

	path := filepath.Join(t.TempDir(), "bad.toml")
	require.NoError(t, os.WriteFile(path, []byte("[pool]\npin_cpus = \"yes\"\n"), 0o644))
	errb.Reset()
	require.Equal(t, 1, run([]string{"pool", "--config=" + path}, strings.NewReader(""), &out, &errb))
	require.Contains(t, errb.String(), "pool.pin_cpus: expected true or false")
}
