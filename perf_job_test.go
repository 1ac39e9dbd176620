package pynox

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// collectOutputs (one open of the outputs directory for reading, issue
// 12) reaches it as collect did: a job that puts a symlink, a file or a
// FIFO at its place gets nothing attached, and the next job in the reused
// scratch directory starts with an empty, usable one.
func TestCollectOutputsReplaced(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	for _, how := range []string{
		"os.rename(d, t + '/real'); os.symlink(t + '/real', d)",
		"os.rename(d, t + '/real'); open(d, 'w').write('a file')",
		"os.rename(d, t + '/real'); os.symlink('/etc', d)",
	} {
		res := run(t, p, Job{Code: `
import os
d = os.environ["PYNOX_OUTPUTS"]
t = os.environ["TMPDIR"]
open(os.path.join(d, "a.txt"), "w").write("one")
` + how + `
print("ok")
`})
		requireOK(t, res)
		require.Empty(t, res.Files, "%s: %+v", how, res.Files)
		res = run(t, p, Job{Code: `
import os
d = os.environ["PYNOX_OUTPUTS"]
print(os.listdir(d))
open(os.path.join(d, "b.txt"), "w").write("two")
`})
		requireOK(t, res)
		require.Equal(t, "[]\n", res.Stdout, "after %s", how)
		require.Len(t, res.Files, 1, "after %s", how)
		require.Equal(t, "two", string(res.Files[0].Data))
	}
}

// jobMayStat with several permissions requires each of them.
func TestJobMayStatEveryPermission(t *testing.T) {
	t.Parallel()
	d := t.TempDir()
	for _, c := range []struct {
		mode uint32
		want bool
	}{{0o700, true}, {0o500, true}, {0o300, false}, {0o600, false}, {0o100, false}} {
		require.NoError(t, os.Chmod(d, os.FileMode(c.mode)))
		fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(fd, &st))
		require.Equal(t, c.want, jobMayStat(fd, &st, 5), "mode %o", c.mode)
		require.Equal(t, c.mode&0o100 != 0, jobMayStat(fd, &st, 1), "mode %o", c.mode)
		unix.Close(fd)
	}
	require.NoError(t, os.Chmod(d, 0o700))
}

// A scratch directory's empty subdirectories are removed in one call
// whatever their mode (rmdir needs only the parent's permissions); one
// that is not empty, or that the job made unreadable, still goes the long
// way, and the directory is reused empty.
func TestScratchReleaseEmptyAndFullSubdirs(t *testing.T) {
	t.Parallel()
	s, err := newScratchRoot(t.TempDir())
	require.NoError(t, err)
	defer s.close()
	name, fd, err := s.create()
	require.NoError(t, err)
	require.NoError(t, unix.Close(fd))
	d := s.dir(name)
	require.NoError(t, os.Mkdir(filepath.Join(d, "empty"), 0o700))
	require.NoError(t, os.Mkdir(filepath.Join(d, "locked"), 0o700))
	require.NoError(t, os.Mkdir(filepath.Join(d, "full"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(d, "full", "f"), []byte("x"), 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(d, "fulllocked"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(d, "fulllocked", "f"), []byte("x"), 0o600))
	require.NoError(t, os.Chmod(filepath.Join(d, "locked"), 0))
	require.NoError(t, os.Chmod(filepath.Join(d, "fulllocked"), 0))
	require.NoError(t, s.release(name))
	ents, err := os.ReadDir(d)
	require.NoError(t, err)
	require.Empty(t, ents)
	again, fd, err := s.create()
	require.NoError(t, err)
	require.NoError(t, unix.Close(fd))
	require.Equal(t, name, again, "the emptied directory is reused")
}

// release removes an empty outputs directory in one call before it lists
// the scratch directory; whatever else stands at its place (a directory
// with files, a file, a symlink to a directory outside) is removed by the
// listing, following no symlink, and the directory is reused empty.
func TestScratchReleaseOutputsFastPath(t *testing.T) {
	t.Parallel()
	s, err := newScratchRoot(t.TempDir())
	require.NoError(t, err)
	defer s.close()
	victim := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(victim, "f"), []byte("precious"), 0o600))
	for _, setup := range []func(out string){
		func(out string) { require.NoError(t, os.Mkdir(out, 0o700)) },
		func(out string) {
			require.NoError(t, os.Mkdir(out, 0o700))
			require.NoError(t, os.WriteFile(filepath.Join(out, "a"), nil, 0o600))
		},
		func(out string) { require.NoError(t, os.WriteFile(out, []byte("x"), 0o600)) },
		func(out string) { require.NoError(t, os.Symlink(victim, out)) },
	} {
		name, fd, err := s.create()
		require.NoError(t, err)
		require.NoError(t, unix.Close(fd))
		d := s.dir(name)
		setup(filepath.Join(d, OutputsDir))
		require.NoError(t, os.WriteFile(filepath.Join(d, "other"), nil, 0o600))
		require.NoError(t, s.release(name))
		ents, err := os.ReadDir(d)
		require.NoError(t, err)
		require.Empty(t, ents)
		b, err := os.ReadFile(filepath.Join(victim, "f"))
		require.NoError(t, err)
		require.Equal(t, "precious", string(b))
	}
}
