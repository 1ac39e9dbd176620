package pynox

// Review 22: an outside review's probes (helpers in hostile_test.go and
// helpers_test.go). Each asserts the safe behaviour.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// review22Tmpfs mounts a tmpfs of size bytes and inodes inodes on a fresh
// temporary directory (root only) and unmounts it when the test ends.
func review22Tmpfs(t *testing.T, size, inodes int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs takes root")
	}
	dir := t.TempDir()
	opts := "size=" + strconv.Itoa(size) + ",nr_inodes=" + strconv.Itoa(inodes) + ",mode=0755"
	require.NoError(t, unix.Mount("pynox-review22", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts))
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// Probe 1: the scratch file system's inodes. Every job's and session's
// scratch directory lay in one shared tmpfs (/dev/shm by default), whose
// inodes (nr_inodes = one per 4 KiB of half the machine's memory) ran out
// long before its bytes: an empty file costs a job only ~650 bytes of its
// memory cgroup (100,000 files under a 64 MiB allowance), so one session
// at the default ceiling took every inode of /dev/shm and every later
// job's scratch failed (SandboxSetupError) while it lived. Here, on a
// tmpfs sized like /dev/shm (256 MiB, 65,536 inodes) with a pool that
// follows the sizing rule (max_sessions 4 x memory 64 MiB), one session
// filled the inodes with ~40 MiB of its 64 and the next job failed. Now
// a pool with memory cgroups mounts a tmpfs of its own on its scratch
// directory, with no inode limit (scratchRoot.mountOwn): the session's
// files cost its memory allowance alone (the kernel kills it at its
// limit, or its creations fail), and the next job's scratch works.
func TestReview22ScratchInodes(t *testing.T) {
	const size, inodes = 256 << 20, 65536
	scratch := review22Tmpfs(t, size, inodes)
	p := newTestPool(t, Config{Workers: 1, MaxSessions: 4, ScratchDir: scratch, Limits: Limits{Memory: 64 << 20}})
	if p.Cgroups() == "none" {
		t.Skip("no memory cgroups: nothing bounds a job's scratch at all, and the pool keeps the shared tmpfs")
	}
	require.True(t, p.scratch.mounted, "a root pool with memory cgroups mounts a tmpfs of its own on its scratch directory")
	var own unix.Statfs_t
	require.NoError(t, unix.Statfs(p.scratch.path, &own))
	require.Zero(t, own.Files, "the pool's scratch tmpfs has no inode limit")
	co := checkout(t, p, Job{Timeout: 30 * time.Second})
	r := feed(t, co, `
import os
d = os.open(os.environ["TMPDIR"], os.O_RDONLY)
n = 0
try:
    while n < 200000:
        os.close(os.open("f%d" % n, os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=d))
        n += 1
except OSError as e:
    print("stopped", e.strerror)
print(n)
`)
	if r.Error != nil {
		require.Equal(t, "MemoryError", r.Error.Type, "the session's files are bounded by its memory: %+v", r.Error)
	}
	t.Logf("the session: %q, %+v", strings.TrimSpace(r.Stdout), r.Error)
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(scratch, &st))
	require.Greater(t, st.Ffree, uint64(inodes-100), "the session's files took the shared tmpfs's inodes")
	res := run(t, p, Job{Code: "import os\nopen(os.path.join(os.environ['TMPDIR'], 'x'), 'w').write('ok')\nprint('ok')",
		Name: "next"})
	require.Nil(t, res.Error, "another tenant's job failed while a session holds the scratch file system's inodes: %+v\n%s", res.Error, res.Stderr)
}

// review22SharedWritable lists the writable shared mappings of process
// pid (the 's' and 'w' of /proc/PID/maps): memory every process forked
// from it shares with it and with each other.
func review22SharedWritable(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return nil // gone meanwhile
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && len(f[1]) == 4 && f[1][1] == 'w' && f[1][3] == 's' {
			out = append(out, line)
		}
	}
	return out
}

// review22FindReserve finds, from a job, the runner's MemoryError reserve
// (a 1 MiB mmap object the spare keeps) by walking the objects the
// garbage collector tracks, and prints its address.
const review22FindReserve = `
import ctypes, gc, mmap
found = []
for o in gc.get_objects():
    vals = o if isinstance(o, (tuple, list)) else o.values() if isinstance(o, dict) else ()
    for x in vals:
        if isinstance(x, mmap.mmap) and len(x) == 1 << 20 and not any(x is y for y in found):
            found.append(x)
assert found, "no reserve found"
`

// Probe 2 (HOLE, fixed): memory shared between jobs through the
// template. The template maps the address space a spare keeps back to
// report a MemoryError with (runner.py, spare_plan) with
// mmap.mmap(-1, RESERVE), whose default is MAP_SHARED: one 1 MiB region
// of shared memory that the template, every spare, every job and every
// session process forked from it map at the same address, writable (the
// runner's comment says "each spare's own once forked", true only of a
// private mapping). A session step (one tenant, no grants, no network)
// wrote into it, and a later one-shot job of another tenant read it back
// at the same address: a channel between jobs that no grant, no network
// and no namespace shows, and data a job leaves for every later job of
// its template. Now the reserve is MAP_PRIVATE: a write is the writer's
// own copy; and no process of the pool's templates has a writable shared
// mapping.
func TestReview22NoMemorySharedAcrossJobs(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	r := feed(t, co, review22FindReserve+`
for m in found:
    m[0:16] = b"REVIEW22-SECRET!"
print(" ".join(str(ctypes.addressof(ctypes.c_char.from_buffer(m))) for m in found))
`)
	requireOK(t, r)
	addrs := strings.Fields(r.Stdout)
	require.NotEmpty(t, addrs)
	var reads []string
	for _, a := range addrs {
		reads = append(reads, fmt.Sprintf("print(ctypes.string_at(%s, 16))", a))
	}
	res := run(t, p, Job{Code: "import ctypes\n" + strings.Join(reads, "\n")})
	requireOK(t, res)
	require.NotContains(t, res.Stdout, "REVIEW22-SECRET", "a job read what a session of another tenant wrote into memory both share through the template")
	// No process of the template's family maps writable shared memory.
	for _, tpl := range p.templatePIDs() {
		pids := []int{tpl}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", tpl, tpl))
		for _, f := range strings.Fields(string(b)) {
			n, err := strconv.Atoi(f)
			require.NoError(t, err)
			pids = append(pids, n)
		}
		for _, pid := range pids {
			require.Empty(t, review22SharedWritable(t, pid), "process %d (template %d or its child) maps writable shared memory", pid, tpl)
		}
	}
	advServes(t, p)
}

// Probe 3 (HOLE, fixed): the same channel through a preload. The
// template refuses a preload that leaves a thread or a descriptor behind,
// but one that maps writable shared memory at import (mmap.mmap(-1, n),
// Python's default, or multiprocessing's shared memory) gave every job
// and session of every tenant that memory, at one address. Such a preload
// is now refused at start, naming the mapping; a private one is fine.
func TestReview22PreloadSharedMemoryRefused(t *testing.T) {
	requireSandbox(t)
	site := t.TempDir()
	writeFile(t, filepath.Join(site, "r22shared.py"), "import mmap\n_m = mmap.mmap(-1, 4096)\n")
	writeFile(t, filepath.Join(site, "r22private.py"), "import mmap\n_m = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE)\n")
	_, err := New(Config{Workers: 1, Dir: t.TempDir(), Python: testPython(), PackageDirs: []string{site}, Preload: []string{"r22shared"}})
	require.Error(t, err, "a preload that maps writable shared memory was accepted: every job would share it")
	require.ErrorIs(t, err, ErrSpawn)
	require.Contains(t, err.Error(), "preload r22shared")
	require.Contains(t, err.Error(), "shared memory")
	p := newTestPool(t, Config{Workers: 1, PackageDirs: []string{site}, Preload: []string{"r22private"}})
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
}

// Probe 4 (HOLE, fixed): world-writable files in a write grant. Review 10 took
// the set-user-ID and set-group-ID bits out of the modes a job creates
// files with; the bits for others are still the job's to choose. A job
// (running as the pool's uid, often root) that sets its umask to 0 leaves
// root-owned files mode 0666 and directories mode 01777 in the operator's
// directory: every local user of the host may then write there, or change
// a job's output after the operator read it and before a program of the
// operator uses it. chmod is denied to jobs, so the creation mode is the
// whole story. Now the template sets the umask its jobs inherit to (at
// least) 022, and seccomp allows umask only with those bits set (the
// modes of open and mkdir cannot be filtered usefully: Python creates
// every file with 0666 and relies on the umask); os.umask(0), which a few
// libraries call to read the umask, raises PermissionError.
func TestReview22NoWorldWritableOutputs(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	out := filepath.Join(p.Config().Dir, "out")
	require.NoError(t, os.Mkdir(out, 0o755))
	r := run(t, p, Job{AllowWrite: []string{"out"}, Code: `
import os
import ctypes, errno
try:
    os.umask(0)
except PermissionError as e:
    print("os.umask refused")
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
r = libc.syscall(` + strconv.Itoa(unix.SYS_UMASK) + `, 0)
print("umask syscall", r, errno.errorcode.get(ctypes.get_errno()))
print("umask keeps 022:", os.umask(0o077) & 0o022 == 0o022)
for name, f in [("d", lambda: os.mkdir("out/d", 0o1777)), ("f", lambda: os.close(os.open("out/f", os.O_CREAT | os.O_WRONLY, 0o666)))]:
    try:
        f()
    except OSError as e:
        print(name, e)
`})
	requireOK(t, r)
	require.Contains(t, r.Stdout, "os.umask refused")
	require.Contains(t, r.Stdout, "umask syscall -1 EPERM")
	require.Contains(t, r.Stdout, "umask keeps 022: True")
	for _, n := range []string{"d", "f"} {
		fi, err := os.Lstat(filepath.Join(out, n))
		require.NoError(t, err, "the job made no %s: %s", n, r.Stdout)
		require.Zero(t, fi.Mode().Perm()&0o002, "%s is %v on the host: any local user may write it", n, fi.Mode())
	}
}
