package mountns

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// seedScript enters the mount namespace at descriptor 3 and prints its
// mounts (through the host's /proc, opened before), its root's entries
// and those of /t (None without one).
const seedScript = `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
proc = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY)
if libc.setns(3, 0x00020000) != 0:
    raise OSError(ctypes.get_errno(), "setns")
fd = os.open("mountinfo", os.O_RDONLY, dir_fd=proc)
print(os.read(fd, 65536).decode().strip())
print("ROOT", sorted(os.listdir("/")), sorted(os.listdir("/t")) if os.path.isdir("/t") else None)
`

// A prepared mounter's seed namespace (SeedFD), from which every stock
// build starts, holds one mount, a read-only tmpfs with nothing but an
// empty directory t, before and after builds and jobs: no build's tree
// nor any job's mount is ever left in it; a job's namespace shows
// nothing of it (its root is the job's tree, and no tmpfs of the seed's
// size is among its mounts).
func TestPreparedSeedStaysEmpty(t *testing.T) {
	m := preparedMounter(t, 2, 0, false)
	enter := func(f *os.File) string {
		cmd := exec.Command("/usr/bin/python3", "-I", "-S", "-c", seedScript)
		cmd.ExtraFiles = []*os.File{f}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	seed := func() string {
		f, err := os.Open("/proc/" + strconv.Itoa(m.cmd.Process.Pid) + "/fd/" + strconv.Itoa(SeedFD))
		if os.IsNotExist(err) {
			t.Skip("the mounter made no seed namespace here")
		}
		require.NoError(t, err)
		defer f.Close()
		return enter(f)
	}
	check := func(out string) {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2, "the seed holds more than one mount:\n%s", out)
		require.Contains(t, lines[0], " / / ro,")
		require.Contains(t, lines[0], " tmpfs ")
		require.Equal(t, "ROOT ['t'] []", lines[1])
		require.Contains(t, lines[0], "size=4k") // the seed's tmpfs, as the kernel shows its options
	}
	settle(t, m, 1+2)
	check(seed())
	a := dataDir(t, "A")
	for range 4 {
		ns, err := m.Build(Plan{Binds: []Bind{{Source: openPath(t, a), Path: "/data", ReadOnly: true}}})
		require.NoError(t, err)
		out := enter(ns.Mount)
		t.Log(out)
		require.NotContains(t, out, "size=4k", "a job's namespace shows the seed's tmpfs")
		require.Contains(t, out, "'data'")
		require.NotContains(t, out, "'t'")
		ns.Close()
	}
	settle(t, m, 1+2)
	check(seed())
}
