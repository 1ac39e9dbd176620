package pynox

// Review 27: an outside review of the pool's own scratch tmpfs (after
// reviews 25 and 26). Each probe asserts the safe behaviour.

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// Probe 1: hard links cost no inode, and the tmpfs has no inode limit:
// a session under a 64 MiB allowance linking one file again and again
// under long names (a dentry and an external name, ~450 bytes a link)
// stops within its allowance: dentries and names are charged to it too.
func TestReview27ScratchHardLinksCharged(t *testing.T) {
	testenv.Slow(t)
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
		require.True(t, e.IsDir(), "a job left %q in the scratch root", e.Name())
		require.NotContains(t, []string{"pynox-x", "l", "r", "s", "c"}, e.Name())
	}
	var a, b unix.Stat_t
	require.NoError(t, unix.Stat(p.scratch.path, &a))
	require.NoError(t, unix.Fstat(p.scratch.fd, &b))
	require.Equal(t, b.Dev, a.Dev, "the pool's scratch tmpfs is no longer mounted")
}

// Probe 3: no other way to a file that the group or others may write:
// the raw umask syscall with 022 clear in its low 32 bits but set above
// them, posix.umask, an AF_UNIX socket's file, O_TMPFILE linked in,
// mkdir and open asking for every bit, a FIFO. Every file the job makes
// in its write grant and its TMPDIR keeps 022 clear.
func TestReview27UmaskNoWayAround(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	res := run(t, p, Job{AllowWrite: []string{"."}, Code: `
import os, ctypes, socket, posix, stat
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = []
for arg in (0, 1 << 32, (1 << 32) | 0o002, 0o020, ~0o755):
    r = libc.syscall(95, ctypes.c_long(arg))
    out.append("umask(%#x)=%d" % (arg & (2**64 - 1), r))
try:
    posix.umask(0)
    out.append("posix.umask ALLOWED")
except OSError:
    pass
print(" ".join(out))
r = libc.syscall(0x40000000 | 95, ctypes.c_long(0))  # the x32 ABI's umask
print("x32 umask", r)
cur = libc.syscall(95, ctypes.c_long(0o022)); libc.syscall(95, ctypes.c_long(cur))
print("umask now %o" % cur)
made = []
for base in (os.environ["TMPDIR"], os.getcwd()):
    d = os.path.join(base, "m")
    os.mkdir(d, 0o7777); made.append(d)
    f = os.path.join(base, "f")
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY, 0o777)); made.append(f)
    try:
        s = socket.socket(socket.AF_UNIX); s.bind(os.path.join(base, "s")); made.append(os.path.join(base, "s"))
    except OSError as e:
        print("socket", e.errno)
    try:
        fd = os.open(base, os.O_TMPFILE | os.O_WRONLY, 0o777)
        os.link("/proc/self/fd/%d" % fd, os.path.join(base, "t"), follow_symlinks=True); made.append(os.path.join(base, "t"))
    except OSError as e:
        print("tmpfile", e.errno)
    try:
        os.mkfifo(os.path.join(base, "p"), 0o777); made.append(os.path.join(base, "p"))
    except OSError as e:
        print("fifo", e.errno)
for m in made:
    print("mode %s %o" % (os.path.basename(m), stat.S_IMODE(os.lstat(m).st_mode)))
`})
	requireOK(t, res)
	t.Log(res.Stdout)
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	require.NotContains(t, res.Stdout, "ALLOWED")
	// Only the calls whose low 32 bits hold 022 pass (returning the old
	// mask, 022): (1<<32)|002 and 020 do not.
	require.Equal(t, "umask(0x0)=-1 umask(0x100000000)=-1 umask(0x100000002)=-1 umask(0x10)=-1 umask(0xfffffffffffffe12)=18", lines[0])
	require.Equal(t, "x32 umask -1", lines[1])
	require.Equal(t, "umask now 22", lines[2])
	n := 0
	for _, l := range lines[3:] {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == "mode" {
			n++
			m, err := strconv.ParseUint(f[2], 8, 32)
			require.NoError(t, err)
			require.Zero(t, m&0o022, "a job made %s with group or others write permission: %s", f[1], l)
			require.Zero(t, m&0o6000, "a job made %s set-ID: %s", f[1], l)
		}
	}
	require.GreaterOrEqual(t, n, 4, res.Stdout)
}

// Probe 4: after jobs and a session step have run (spares forked, the
// template's lazily made plans and reserve in place), neither the
// template nor any process forked from it (its spares, the session) has
// a writable shared mapping: nothing a job writes could reach a later
// job through memory forked from the template. Read from outside (a job
// may not read its own smaps).
func TestReview27NoSharedMemoryInTemplate(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1, MaxSessions: 1})
	requireOK(t, run(t, p, Job{Code: "import json, mmap\nprint(1)"}))
	co := checkout(t, p, Job{})
	ev, err := co.Feed(t.Context(), Step{Code: "x = 1"})
	require.NoError(t, err)
	require.NotNil(t, ev.Result)
	requireOK(t, run(t, p, Job{Code: "print(2)"}))
	tpl := p.workers[0].live.Load()
	require.NotNil(t, tpl)
	pids := []int{tpl.Pid()}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(tpl.Pid()) + "/task/" + strconv.Itoa(tpl.Pid()) + "/children"); err == nil {
		for _, f := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(f)
			pids = append(pids, n)
		}
	}
	require.Greater(t, len(pids), 1, "no process forked from the template to look at")
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
		if err != nil {
			continue // gone
		}
		head := ""
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			if !strings.HasSuffix(f[0], ":") {
				head = line
				continue
			}
			if f[0] != "VmFlags:" || head == "" {
				continue
			}
			perms := strings.Fields(head)[1]
			flags := " " + strings.Join(f[1:], " ") + " "
			shared := strings.Contains(flags, " sh ") || (strings.Contains(flags, " ms ") && strings.Contains(flags, " mw ")) || (perms[1] == 'w' && perms[3] == 's')
			require.False(t, shared, "pid %d (of %v) has a writable shared mapping: %s", pid, pids, head)
		}
	}
	t.Logf("looked at %d processes", len(pids))
}
