package pynox

// Review 25: an outside review of the pool's own scratch tmpfs
// (scratchRoot.mountOwn, commit 8caaa43). Each probe asserts the safe
// behaviour.

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// review25Tmpfs mounts a tmpfs (root only) on a fresh directory with the
// given extra options and unmounts it when the test ends.
func review25Tmpfs(t *testing.T, opts string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs takes root")
	}
	dir := t.TempDir()
	require.NoError(t, unix.Mount("pynox-review25", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts))
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// review25Files counts the regular files beneath dir.
func review25Files(dir string) int {
	n := 0
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return nil
	})
	return n
}

// Probe 1: the inodes of the unlimited tmpfs are charged to the job's
// memory cgroup (cgroup v1 here, kmem accounted): a session under a known
// allowance (64 MiB) making empty files in its TMPDIR, again and again
// over several turns, stops within its allowance; the files it leaves
// stay bounded by it, not by the host's memory.
func TestReview25ScratchInodesCharged(t *testing.T) {
	testenv.Slow(t)
	if os.Geteuid() != 0 {
		t.Skip("the pool mounts its own scratch tmpfs only as root")
	}
	const memory = 64 << 20
	p := newTestPool(t, Config{Workers: 1, MaxSessions: 1, Limits: Limits{Memory: memory}})
	if p.Cgroups() == "none" {
		t.Skip("no memory cgroups: the pool keeps the shared tmpfs")
	}
	require.True(t, p.scratch.mounted, "a root pool with memory cgroups mounts a tmpfs of its own")
	co := checkout(t, p, Job{Timeout: 30 * time.Second})
	code := `
import os
d = os.open(os.environ["TMPDIR"], os.O_RDONLY)
base = len(os.listdir(d))
n = 0
try:
    while n < 2000000:
        os.close(os.open("t%d_%d" % (base, n), os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=d))
        n += 1
except OSError as e:
    print("stopped", e.strerror)
print(n)
`
	for turn := range 4 {
		ev, err := co.Feed(t.Context(), Step{Code: code})
		if err != nil || ev.Result == nil {
			t.Logf("turn %d: %v", turn, err)
			break // the session is gone
		}
		r := ev.Result
		t.Logf("turn %d: %q %+v", turn, strings.TrimSpace(r.Stdout), r.Error)
	}
	total := review25Files(p.scratch.path)
	t.Logf("files left in the pool's scratch tmpfs: %d (the 64 MiB allowance over them: %.0f bytes a file)", total, float64(memory)/float64(total))
	// An empty tmpfs file costs ~650 bytes (inode and dentry); 200 bytes
	// a file would be three times cheaper than the kernel can make one.
	require.Less(t, total, memory/200, "the session's empty files outgrew its memory allowance: their inodes are not charged to it")
}

// Probe 2: a job's TMPDIR lies in the pool's own tmpfs (no inode limit),
// not in the shared /dev/shm beneath it.
func TestReview25ScratchTmpdirOnOwnTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the pool mounts its own scratch tmpfs only as root")
	}
	p := newTestPool(t, Config{Workers: 1})
	if p.Cgroups() == "none" {
		t.Skip("no memory cgroups: the pool keeps the shared tmpfs")
	}
	require.True(t, p.scratch.mounted)
	var own unix.Stat_t
	require.NoError(t, unix.Stat(p.scratch.path, &own))
	res := run(t, p, Job{Code: `
import os
t = os.environ["TMPDIR"]
s = os.statvfs(t)
print(os.stat(t).st_dev, s.f_files)
open(os.path.join(t, "x"), "w").write("ok")
`})
	requireOK(t, res)
	f := strings.Fields(res.Stdout)
	require.Len(t, f, 2, res.Stdout)
	require.Equal(t, strconv.FormatUint(own.Dev, 10), f[0], "the job's TMPDIR is not on the pool's own tmpfs")
	require.Equal(t, "0", f[1], "the job's TMPDIR has an inode limit")
}

// Probe 3: fake and hostile entries beside a live pool's scratch tmpfs
// in a world-writable sticky tmpfs (as /dev/shm): a directory of another
// user named like a scratch directory, a symlink to the live pool's
// scratch, a root-owned directory of another file system's mount named
// like one. The sweep of a new pool unmounts and removes none of them,
// and the live pool's tmpfs stays mounted.
func TestReview25ScratchSweepFakes(t *testing.T) {
	parent := review25Tmpfs(t, "size=8m,nr_inodes=256,mode=1777")
	var pst unix.Stat_t
	require.NoError(t, unix.Stat(parent, &pst))

	live, err := newScratchRoot(parent)
	require.NoError(t, err)
	live.mountOwn()
	require.True(t, live.mounted)
	t.Cleanup(func() { live.close() })

	fake := filepath.Join(parent, scratchPrefix+"nobody")
	require.NoError(t, os.Mkdir(fake, 0o755))
	require.NoError(t, os.Chown(fake, 65534, 65534))
	require.NoError(t, os.WriteFile(filepath.Join(fake, "keep"), []byte("x"), 0o644))
	require.NoError(t, os.Chown(filepath.Join(fake, "keep"), 65534, 65534))
	link := filepath.Join(parent, scratchPrefix+"link")
	require.NoError(t, os.Symlink(live.path, link))
	require.NoError(t, os.Lchown(link, 65534, 65534))
	// A root-owned, unlocked mountpoint named like a scratch directory,
	// of another file system (ramfs, not a tmpfs): not a pool's.
	other := filepath.Join(parent, scratchPrefix+"ramfs")
	require.NoError(t, os.Mkdir(other, 0o700))
	require.NoError(t, unix.Mount("pynox-review25-ramfs", other, "ramfs", 0, "mode=0700"))
	t.Cleanup(func() { unix.Unmount(other, unix.MNT_DETACH) })
	require.NoError(t, os.WriteFile(filepath.Join(other, "keep"), []byte("x"), 0o600))

	again, err := newScratchRoot(parent)
	require.NoError(t, err)
	again.mountOwn()
	require.True(t, again.mounted)
	require.NoError(t, again.close())

	require.FileExists(t, filepath.Join(fake, "keep"), "another user's entry was swept")
	fi, err := os.Lstat(link)
	require.NoError(t, err, "a symlink named like a scratch directory was removed")
	require.Equal(t, fs.ModeSymlink, fi.Mode().Type())
	require.FileExists(t, filepath.Join(other, "keep"), "another file system mounted on an entry named like a scratch directory was unmounted")
	var st unix.Stat_t
	require.NoError(t, unix.Stat(live.path, &st))
	require.NotEqual(t, pst.Dev, st.Dev, "a live pool's scratch tmpfs was unmounted by the sweep")
	var sf unix.Statfs_t
	require.NoError(t, unix.Statfs(live.path, &sf))
	require.Equal(t, int64(unix.TMPFS_MAGIC), int64(sf.Type))
}

// review25MountedAt says whether a mount's mount point is path in
// /proc/self/mountinfo.
func review25MountedAt(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

// Probe 4: mount propagation. Where the scratch parent is a shared mount
// (systemd makes /dev/shm shared on most hosts; here it is private), the
// pool's tmpfs propagates to the parent's peers (here a bind mount of
// it elsewhere, as a container or a service's namespace would hold).
// Close must take every copy away with it (the umount propagates too),
// and so must the sweep of a killed pool's.
func TestReview25ScratchMountPropagation(t *testing.T) {
	parent := review25Tmpfs(t, "size=8m,mode=1777")
	require.NoError(t, unix.Mount("", parent, "", unix.MS_SHARED, ""))
	peer := t.TempDir()
	require.NoError(t, unix.Mount(parent, peer, "", unix.MS_BIND, ""))
	t.Cleanup(func() { unix.Unmount(peer, unix.MNT_DETACH) })

	s, err := newScratchRoot(parent)
	require.NoError(t, err)
	s.mountOwn()
	require.True(t, s.mounted)
	name := filepath.Base(s.path)
	propagated := review25MountedAt(t, filepath.Join(peer, name))
	t.Logf("the pool's scratch tmpfs propagated to the shared parent's peer: %v", propagated)
	require.NoError(t, s.close())
	require.False(t, review25MountedAt(t, filepath.Join(peer, name)), "Close left a propagated copy of the scratch tmpfs")

	// A killed pool's: the sweep's unmount must propagate as well.
	dead, err := newScratchRoot(parent)
	require.NoError(t, err)
	dead.mountOwn()
	require.True(t, dead.mounted)
	deadName := filepath.Base(dead.path)
	unix.Close(dead.fd)
	unix.Close(dead.mountLock)
	unix.Close(dead.lock)
	again, err := newScratchRoot(parent)
	require.NoError(t, err)
	require.NoError(t, again.close())
	require.False(t, review25MountedAt(t, filepath.Join(parent, deadName)), "the sweep left a killed pool's tmpfs")
	require.False(t, review25MountedAt(t, filepath.Join(peer, deadName)), "the sweep left a propagated copy of a killed pool's tmpfs")
}

// Probe 5: a local unprivileged user in the world-writable, sticky parent
// (as /dev/shm) cannot move, remove or replace the live pool's scratch
// entry, the path Close unmounts and removes by name, nor enter it; what
// the user makes beside it is neither unmounted nor removed by Close.
func TestReview25ScratchUnprivilegedUser(t *testing.T) {
	parent := review25Tmpfs(t, "size=8m,mode=1777")
	live, err := newScratchRoot(parent)
	require.NoError(t, err)
	live.mountOwn()
	require.True(t, live.mounted)
	name, fd, err := live.create()
	require.NoError(t, err)
	unix.Close(fd)
	job := live.dir(name)

	script := `
import os, sys
path, parent, job = sys.argv[1], sys.argv[2], sys.argv[3]
done = []
for what, f in [
    ("rename", lambda: os.rename(path, os.path.join(parent, "moved"))),
    ("rmdir", lambda: os.rmdir(path)),
    ("replace", lambda: os.replace(os.path.join(parent, "mine"), path)),
    ("list", lambda: os.listdir(path)),
    ("job", lambda: os.listdir(job)),
]:
    try:
        f()
        done.append(what)
    except OSError:
        pass
os.symlink("/etc", os.path.join(parent, "pynox-scratch-evil"))
print(" ".join(done))
`
	require.NoError(t, os.Chmod(filepath.Dir(parent), 0o755)) // the test's temporary directory, for the user to reach parent
	require.NoError(t, os.Mkdir(filepath.Join(parent, "mine"), 0o755))
	require.NoError(t, os.Chown(filepath.Join(parent, "mine"), 65534, 65534))
	cmd := exec.Command("/usr/bin/python3", "-c", script, live.path, parent, job)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Empty(t, strings.TrimSpace(string(out)), "an unprivileged user could act on the pool's scratch entry")

	path := live.path
	require.NoError(t, live.close())
	require.False(t, review25MountedAt(t, path), "Close left the scratch tmpfs mounted")
	require.NoDirExists(t, path)
	require.DirExists(t, filepath.Join(parent, "mine"), "Close removed another user's directory")
	fi, err := os.Lstat(filepath.Join(parent, "pynox-scratch-evil"))
	require.NoError(t, err)
	require.Equal(t, fs.ModeSymlink, fi.Mode().Type())
	require.FileExists(t, "/etc/passwd")
}

// Probe 6: user extended attributes on the unlimited tmpfs. A tmpfs
// bounds its user.* xattrs by its inode space only when it has an inode
// limit (nr_inodes): the pool's own has none, so only the memory cgroup
// can bound them. A session under 64 MiB setting 64 KiB values on file
// after file stops within its allowance (measured here: the job's
// setxattr is refused, EPERM, so it sets none).
func TestReview25ScratchXattrsCharged(t *testing.T) {
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
	r := feed(t, co, `
import os
t = os.environ["TMPDIR"]
v = b"x" * 65000
n = 0
try:
    while n < 100000:
        f = os.path.join(t, "x%d" % n)
        open(f, "w").close()
        for k in range(2):
            os.setxattr(f, "user.k%d" % k, v)
        n += 1
except OSError as e:
    print("stopped", e.strerror)
print(n)
`)
	t.Logf("the session: %q %+v", strings.TrimSpace(r.Stdout), r.Error)
	var xattrs int64
	filepath.WalkDir(p.scratch.path, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			for _, k := range []string{"user.k0", "user.k1"} {
				if n, err := unix.Getxattr(path, k, nil); err == nil {
					xattrs += int64(n)
				}
			}
		}
		return nil
	})
	t.Logf("user xattrs left in the scratch tmpfs: %d MiB", xattrs>>20)
	require.Less(t, xattrs, int64(2*memory), "the session's xattrs outgrew its memory allowance")
}
