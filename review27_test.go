package pynox

// Review 27: an outside review of the pool's own scratch tmpfs (after
// reviews 25 and 26). Each probe asserts the safe behaviour.

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Probe 1: hard links cost no inode, and the tmpfs has no inode limit:
// a session under a 64 MiB allowance linking one file again and again
// under long names (a dentry and an external name, ~450 bytes a link)
// stops within its allowance: dentries and names are charged to it too.
func TestReview27ScratchHardLinksCharged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the pool mounts its own scratch tmpfs only as root")
	}
	const memory = 64 << 20
	p := newTestPool(t, Config{Workers: 1, MaxSessions: 1, Limits: Limits{Memory: memory}})
	if p.Cgroups() == "none" {
		t.Skip("no memory cgroups: the pool keeps the shared tmpfs")
	}
	require.True(t, p.scratch.mounted)
	co := checkout(t, p, Job{Timeout: 30 * time.Second})
	code := `
import os
d = os.open(os.environ["TMPDIR"], os.O_RDONLY)
os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=d))
pad = "L" * 230
n = 0
try:
    while n < 1500000:
        os.link("f", "%s%d" % (pad, n), src_dir_fd=d, dst_dir_fd=d)
        n += 1
except OSError as e:
    print("stopped", e.strerror)
print(n)
`
	ev, err := co.Feed(t.Context(), Step{Code: code})
	if err == nil && ev.Result != nil {
		t.Logf("%q %+v", strings.TrimSpace(ev.Result.Stdout), ev.Result.Error)
	} else {
		t.Logf("the session ended: %v", err)
	}
	var st unix.Stat_t
	links := 0
	if ents, err := os.ReadDir(p.scratch.path); err == nil {
		for _, e := range ents {
			if ents2, err := os.ReadDir(p.scratch.path + "/" + e.Name()); err == nil {
				for _, e2 := range ents2 {
					if unix.Lstat(p.scratch.path+"/"+e.Name()+"/"+e2.Name(), &st) == nil && st.Nlink > uint64(links) {
						links = int(st.Nlink)
					}
				}
			}
		}
	}
	t.Logf("links left: %d (%.0f bytes of the allowance a link)", links, float64(memory)/float64(max(links, 1)))
	require.Less(t, links, memory/200, "the session's hard links outgrew its memory allowance: dentries are not charged to it")
}

// Probe 2: a job cannot reach the root of the pool's scratch tmpfs (its
// TMPDIR's parent, shared with every other job's scratch directory):
// no listing, no entry made there by mkdir, link, rename or symlink, no
// unmount or remount of the tmpfs, and the tmpfs is nosuid and nodev.
func TestReview27ScratchRootUnreachable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the pool mounts its own scratch tmpfs only as root")
	}
	p := newTestPool(t, Config{Workers: 1})
	if p.Cgroups() == "none" {
		t.Skip("no memory cgroups: the pool keeps the shared tmpfs")
	}
	require.True(t, p.scratch.mounted)
	res := run(t, p, Job{Code: `
import os, ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
t = os.environ["TMPDIR"]
root = os.path.dirname(t)
open(os.path.join(t, "f"), "w").write("x")
def tryit(name, fn):
    try:
        fn()
        print("ALLOWED", name)
    except OSError as e:
        print("refused", name, e.errno)
tryit("listdir", lambda: os.listdir(root))
tryit("mkdir", lambda: os.mkdir(os.path.join(root, "pynox-x")))
tryit("link", lambda: os.link(os.path.join(t, "f"), os.path.join(root, "l")))
tryit("rename", lambda: os.rename(os.path.join(t, "f"), os.path.join(root, "r")))
tryit("symlink", lambda: os.symlink("/", os.path.join(root, "s")))
tryit("create", lambda: open(os.path.join(root, "c"), "w"))
tryit("rmdir-own", lambda: os.rmdir(t) if os.listdir(t) == [] else (_ for _ in ()).throw(OSError(errno.ENOTEMPTY, "x")))
def mnt(rc):
    if rc != 0:
        raise OSError(ctypes.get_errno(), "mount")
tryit("umount", lambda: mnt(libc.umount2(root.encode(), 2)))
tryit("remount", lambda: mnt(libc.mount(None, root.encode(), None, 0x20 | 0x1000, None)))  # MS_REMOUNT|MS_BIND
st = os.statvfs(t)
print("flags", st.f_flag & (os.ST_NOSUID | os.ST_NODEV))
`})
	requireOK(t, res)
	t.Log(res.Stdout)
	require.NotContains(t, res.Stdout, "ALLOWED")
	require.Contains(t, res.Stdout, "flags 6")
	ents, err := os.ReadDir(p.scratch.path)
	require.NoError(t, err)
	for _, e := range ents {
		require.True(t, e.IsDir() && strings.HasPrefix(e.Name(), ""), "a job left %q in the scratch root", e.Name())
		require.NotContains(t, []string{"pynox-x", "l", "r", "s", "c"}, e.Name())
	}
	var a, b unix.Stat_t
	require.NoError(t, unix.Stat(p.scratch.path, &a))
	require.NoError(t, unix.Fstat(p.scratch.fd, &b))
	require.Equal(t, b.Dev, a.Dev, "the pool's scratch tmpfs is no longer mounted")
}
