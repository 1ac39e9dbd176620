package mountns

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// scratchMounted reports whether path is a mountpoint in this process's
// mount namespace.
func scratchMounted(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	return strings.Contains(string(b), " "+path+" ")
}

// The mounter unmounts the pool's scratch tmpfs (op "scratch") when the
// host goes, and nothing else: it takes it only as its first request,
// with a descriptor of the mount's root that the path shows; a second
// one, one after another request, a path that is not that mount, or a
// directory that is no mount root is refused; a path swapped for another
// mount by the time the host goes is left alone.
func TestScratchUnmountedWhenHostGoes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs takes root")
	}
	python := "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	dir := t.TempDir()
	mount := func(name string) (string, int) {
		p := filepath.Join(dir, name)
		require.NoError(t, os.Mkdir(p, 0o700))
		require.NoError(t, unix.Mount("pynox-scratch-test", p, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m"))
		t.Cleanup(func() { unix.Unmount(p, unix.MNT_DETACH) })
		fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		t.Cleanup(func() { unix.Close(fd) })
		return p, fd
	}
	a, afd := mount("a")
	b, bfd := mount("b")
	plain := filepath.Join(dir, "plain")
	require.NoError(t, os.Mkdir(plain, 0o700))
	pfd, err := unix.Open(plain, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(pfd)

	// Not the path's mount, and not a mount root: refused.
	m, err := Start(python)
	require.NoError(t, err)
	require.Error(t, m.Scratch(a, bfd))
	require.NoError(t, m.Close())
	require.True(t, scratchMounted(t, a))
	m, err = Start(python)
	require.NoError(t, err)
	require.Error(t, m.Scratch(plain, pfd))
	require.NoError(t, m.Close())

	// Taken as the first request; a second is refused; unmounted when
	// the host goes.
	m, err = Start(python)
	require.NoError(t, err)
	require.NoError(t, m.Scratch(a, afd))
	require.Error(t, m.Scratch(b, bfd), "a second scratch was taken")
	require.NoError(t, m.Close())
	require.False(t, scratchMounted(t, a), "the mounter left the scratch tmpfs mounted when the host went")
	require.True(t, scratchMounted(t, b), "the mounter unmounted a mount it was not handed")

	// Not as the first request: refused.
	m, err = Start(python)
	require.NoError(t, err)
	require.NoError(t, m.Release(12345)) // any request first
	require.Error(t, m.Scratch(b, bfd), "a scratch was taken after another request")
	require.NoError(t, m.Close())
	require.True(t, scratchMounted(t, b))

	// The path shows another mount by the time the host goes: left alone.
	c, cfd := mount("c")
	m, err = Start(python)
	require.NoError(t, err)
	require.NoError(t, m.Scratch(c, cfd))
	require.NoError(t, unix.Unmount(c, unix.MNT_DETACH))
	require.NoError(t, unix.Mount("pynox-other", c, "tmpfs", 0, "size=1m"))
	require.NoError(t, m.Close())
	require.True(t, scratchMounted(t, c), "the mounter unmounted another mount at the scratch's path")
}
