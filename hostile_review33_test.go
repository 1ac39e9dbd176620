package pynox

// Review 33: an outside review's probes. Each asserts the safe outcome
// and that the pool serves the next job.

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// r33Dirs makes ro/ (a read grant holding secret.txt and a subdirectory)
// and rw/ (a write grant) in the pool's directory, on one file system, so
// that links and renames between them reach Landlock rather than EXDEV
// from the kernel.
func r33Dirs(t *testing.T, p *Pool) (ro, rw string) {
	t.Helper()
	dir := p.Config().Dir
	ro, rw = filepath.Join(dir, "ro"), filepath.Join(dir, "rw")
	require.NoError(t, os.MkdirAll(filepath.Join(ro, "sub"), 0o755))
	require.NoError(t, os.Mkdir(rw, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ro, "secret.txt"), []byte("read-only"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(rw, "mine.txt"), []byte("mine"), 0o644))
	return ro, rw
}

// TestHostileReview33ReadGrantStaysReadOnly: a file the job may only read
// stays unchanged and unlinked into its write grant, whatever way the job
// tries to make a writable name or descriptor for it: linkat with
// AT_EMPTY_PATH (flink, relaxed for the opener's own credentials in
// Linux 6.10) and AT_SYMLINK_FOLLOW, link by path, O_TMPFILE linked into
// the read grant, renameat2 RENAME_EXCHANGE and RENAME_NOREPLACE across
// the two grants, O_RDONLY|O_TRUNC, truncate, a shared writable mapping
// of a read-only descriptor (and mprotect to writable), copy_file_range
// and sendfile into a read-only descriptor, a symlink in the write grant
// opened for writing, and a directory moved out of the read grant.
func TestHostileReview33ReadGrantStaysReadOnly(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ro, rw := r33Dirs(t, p)
	secret := filepath.Join(ro, "secret.txt")
	r := run(t, p, Job{AllowRead: []string{ro}, AllowWrite: []string{rw}, Code: advCode(`
import mmap
RO, RW = ` + pyQuote(ro) + `, ` + pyQuote(rw) + `
S = RO + "/secret.txt"
fd = os.open(S, os.O_RDONLY)
AT_FDCWD = -100
sc("flink", 265, fd, b"", AT_FDCWD, RW + "/flink", 0x1000)
sc("link follow", 265, AT_FDCWD, S, AT_FDCWD, RW + "/follow", 0x400)
attempt("link path", lambda: os.link(S, RW + "/hard"))
def tmpfile_into_ro():
    t = os.open(RW, os.O_TMPFILE | os.O_RDWR, 0o644)
    os.write(t, b"planted")
    r = _libc.syscall(ctypes.c_long(265), ctypes.c_long(t), ctypes.c_char_p(b""), ctypes.c_long(AT_FDCWD), ctypes.c_char_p((RO + "/planted").encode()), ctypes.c_long(0x1000))
    if r < 0:
        raise OSError(ctypes.get_errno(), "linkat")
attempt("tmpfile into ro", tmpfile_into_ro)
sc("exchange", 316, AT_FDCWD, S, AT_FDCWD, RW + "/mine.txt", 2)
sc("rename noreplace out", 316, AT_FDCWD, S, AT_FDCWD, RW + "/moved", 1)
attempt("rename dir out", lambda: os.rename(RO + "/sub", RW + "/sub"))
attempt("rename into ro", lambda: os.rename(RW + "/mine.txt", RO + "/mine.txt"))
attempt("open trunc", lambda: os.close(os.open(S, os.O_RDONLY | os.O_TRUNC)))
attempt("truncate", lambda: os.truncate(S, 0))
attempt("ftruncate ro fd", lambda: os.ftruncate(fd, 0))
attempt("mmap shared write", lambda: mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
def mprotect_up():
    m = _libc.mmap(None, ctypes.c_size_t(4096), 1, 1, fd, ctypes.c_long(0))  # PROT_READ, MAP_SHARED
    _libc.mmap.restype = ctypes.c_void_p
    if _libc.mprotect(ctypes.c_void_p(m), ctypes.c_size_t(4096), 3) != 0:
        raise OSError(ctypes.get_errno(), "mprotect")
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
attempt("mprotect shared writable", mprotect_up)
src = os.open(RW + "/mine.txt", os.O_RDONLY)
attempt("copy_file_range into ro", lambda: os.copy_file_range(src, fd, 4, 0, 0))
attempt("sendfile into ro", lambda: os.sendfile(fd, src, 0, 4))
os.symlink(S, RW + "/sym")
attempt("write through symlink", lambda: open(RW + "/sym", "w").write("x"))
attempt("append through symlink", lambda: open(RW + "/sym", "a").write("x"))
attempt("hardlink then write", lambda: open(RW + "/hard", "w").write("x"))
`)})
	got := advProbes(t, r)
	advExpect(t, got, map[string][]string{
		"flink":                    {"EXDEV", "EACCES", "ENOENT", "EPERM"},
		"link follow":              {"EXDEV", "EACCES", "EPERM"},
		"link path":                {"EXDEV", "EACCES", "EPERM"},
		"tmpfile into ro":          {"EACCES", "EXDEV", "ENOENT", "EPERM", "EOPNOTSUPP"},
		"exchange":                 {"EXDEV", "EACCES", "EPERM"},
		"rename noreplace out":     {"EXDEV", "EACCES", "EPERM"},
		"rename dir out":           {"EXDEV", "EACCES", "EPERM"},
		"rename into ro":           {"EXDEV", "EACCES", "EPERM"},
		"open trunc":               {"EACCES", "EPERM"},
		"truncate":                 {"EACCES", "EPERM"},
		"ftruncate ro fd":          {"EINVAL", "EBADF", "EACCES"},
		"mmap shared write":        {"EACCES", "PermissionError"},
		"mprotect shared writable": {"EACCES"},
		"copy_file_range into ro":  {"EBADF"},
		"sendfile into ro":         {"EBADF"},
		"write through symlink":    {"EACCES"},
		"append through symlink":   {"EACCES"},
		"hardlink then write":      {"ok", "EACCES"}, // a new file, if the link failed
	})
	b, err := os.ReadFile(secret)
	require.NoError(t, err)
	require.Equal(t, "read-only", string(b))
	_, err = os.Stat(filepath.Join(ro, "planted"))
	require.True(t, os.IsNotExist(err), "a file was planted in the read grant")
	_, err = os.Stat(filepath.Join(ro, "sub"))
	require.NoError(t, err, "the read grant's directory was moved")
	for _, n := range []string{"flink", "follow", "moved"} {
		_, err = os.Stat(filepath.Join(rw, n))
		require.True(t, os.IsNotExist(err), "%s: a name for the read-only file in the write grant", n)
	}
	if fi, err := os.Stat(filepath.Join(rw, "hard")); err == nil {
		st, _ := os.Stat(secret)
		require.False(t, os.SameFile(fi, st), "a hard link to the read-only file in the write grant")
	}
	advServes(t, p)
}

// r33PageCachePrelude opens a file every job may read (the standard
// library's pydoc topics, some 700 KiB that nothing maps) with readahead
// off, and defines three ways to tell whether one of its pages is in the
// page cache without timing anything: preadv2(RWF_NOWAIT), which fails
// with EAGAIN rather than read from the disk; the block reads getrusage
// counts (ru_inblock) across a one-byte pread; and the major faults it
// counts (ru_majflt) across a touch of the page mapped. Each probe
// brings the page in: it reads a page once.
const r33PageCachePrelude = `import mmap, os, pydoc_data, resource
F = os.path.join(os.path.dirname(pydoc_data.__file__), "topics.py")
fd = os.open(F, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
P, N = 4096, 48
def nowait(i):
    try:
        os.preadv(fd, [bytearray(1)], i * P, os.RWF_NOWAIT)
        return 1
    except (BlockingIOError, OSError):
        return 0
def inblock(i):
    a = resource.getrusage(resource.RUSAGE_THREAD).ru_inblock
    os.pread(fd, 1, i * P)
    return int(resource.getrusage(resource.RUSAGE_THREAD).ru_inblock == a)
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
m.madvise(mmap.MADV_RANDOM)
def majflt(i):
    a = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt
    m[i * P]
    return int(resource.getrusage(resource.RUSAGE_THREAD).ru_majflt == a)
`

// TestHostileReview33PageCacheChannel: one job leaves nothing behind
// that the next job, another tenant's with no grant at all, can read.
// The page cache of the files every job may read (the interpreter's
// runtime) is state shared by every job on the host: a job that evicts a
// file's pages (posix_fadvise DONTNEED) and reads back some of them
// writes bits that a later job reads, without timing anything, through
// preadv2(RWF_NOWAIT) or getrusage's block reads and major faults. The
// same probes tell a job which pages of a shared read grant another
// tenant's job read. Found by review 33; closed by taking the eviction
// away (the filter makes DONTNEED a no-op and refuses MADV_PAGEOUT and
// MADV_COLD) and RWF_NOWAIT (EOPNOTSUPP): a page the pool's jobs can
// read stays cached, so a job can neither clear a bit nor, but for data
// never read since the host cached it, see one set.
func TestHostileReview33PageCacheChannel(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	for _, oracle := range []string{"nowait", "inblock", "majflt"} {
		t.Run(oracle, func(t *testing.T) { r33PageCacheOnce(t, p, oracle) })
	}
	advServes(t, p)
}

// r33PageCacheOnce sends 48 random bits from one job to the next through
// the page cache and checks they did not arrive.
func r33PageCacheOnce(t *testing.T, p *Pool, oracle string) {
	{
		secret := make([]byte, 48)
		for i := range secret {
			secret[i] = byte('0' + rand.IntN(2))
		}
		// Tenant A: evicts the file and reads the pages of its 1 bits.
		r := run(t, p, Job{Code: r33PageCachePrelude + `
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
for i, b in enumerate(` + pyQuote(string(secret)) + `):
    if b == "1":
        os.pread(fd, 1, i * P)
print("sent")`})
		requireOK(t, r)
		// Tenant B, a later job of its own: reads them back.
		r = run(t, p, Job{Code: r33PageCachePrelude + `
print("".join(str(` + oracle + `(i)) for i in range(N)))`})
		requireOK(t, r)
		got := strings.TrimSpace(r.Stdout)
		same := 0
		for i := range min(len(got), len(secret)) {
			if got[i] == secret[i] {
				same++
			}
		}
		t.Logf("%s: sent %s, read %s (%d/48 bits)", oracle, secret, got, same)
		require.Less(t, same, 44, "%s: a later job read %d of 48 bits another job left in the page cache", oracle, same)
	}
}

// TestHostileReview33PageCacheSpy: the same channel as a side channel.
// Two tenants share a read grant (a data set); the spy's job evicts the
// file, the victim's job, honest code, reads one record, and a later job
// of the spy's names the record from the pages left in the cache.
func TestHostileReview33PageCacheSpy(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	data := filepath.Join(p.Config().Dir, "shared.bin")
	f, err := os.Create(data)
	require.NoError(t, err)
	_, err = f.Write(make([]byte, 4<<20))
	require.NoError(t, err)
	require.NoError(t, f.Sync()) // dirty pages cannot be evicted
	require.NoError(t, f.Close())
	spy := `import os
fd = os.open(` + pyQuote(data) + `, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
`
	for range 3 {
		record := rand.IntN(16)
		requireOK(t, run(t, p, Job{AllowRead: []string{data}, Code: spy + "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)"}))
		requireOK(t, run(t, p, Job{AllowRead: []string{data}, Code: `with open(` + pyQuote(data) + `, "rb") as f:
    f.seek(` + strconv.Itoa(record) + ` * 262144)
    f.read(100)`}))
		r := run(t, p, Job{AllowRead: []string{data}, Code: spy + `def cached(off):
    try:
        os.preadv(fd, [bytearray(1)], off, os.RWF_NOWAIT)
        return True
    except OSError:
        return False
print([k for k in range(16) if cached(k * 262144)])`})
		requireOK(t, r)
		t.Logf("the victim read record %d; the spy saw the pages of records %s", record, strings.TrimSpace(r.Stdout))
		require.NotEqual(t, "["+strconv.Itoa(record)+"]", strings.TrimSpace(r.Stdout), "a later job named the record another tenant's job read")
	}
	advServes(t, p)
}

// TestHostileReview33AtimeChannel: the same class through metadata,
// which Landlock does not mediate: on a relatime mount a read moves a
// file's access time once it is not after its modification time, so a
// later job tells by stat which files of a shared read grant (or of the
// runtime: the modules a job imported that the template had not) an
// earlier job read.
func TestHostileReview33AtimeChannel(t *testing.T) {
	if os.Getenv("PYNOX_R33_CHANNELS") == "" {
		t.Skip("review 33's finding, open: a job sees by access times which files another tenant's job read (set PYNOX_R33_CHANNELS=1 to run)")
	}
	p := newTestPool(t, Config{Workers: 1})
	dir := filepath.Join(p.Config().Dir, "shared")
	require.NoError(t, os.Mkdir(dir, 0o755))
	old := time.Now().Add(-time.Hour)
	for i := range 8 {
		f := filepath.Join(dir, strconv.Itoa(i))
		require.NoError(t, os.WriteFile(f, []byte("x"), 0o644))
		require.NoError(t, os.Chtimes(f, old, old))
	}
	secret := rand.IntN(8)
	requireOK(t, run(t, p, Job{AllowRead: []string{dir}, Code: `open(` + pyQuote(filepath.Join(dir, strconv.Itoa(secret))) + `).read()`}))
	r := run(t, p, Job{AllowRead: []string{dir}, Code: `import os
print([i for i in range(8) if os.stat(` + pyQuote(dir) + ` + "/%d" % i).st_atime > os.stat(` + pyQuote(dir) + ` + "/%d" % i).st_mtime])`})
	requireOK(t, r)
	t.Logf("the victim read file %d; the spy saw %s", secret, strings.TrimSpace(r.Stdout))
	require.NotEqual(t, "["+strconv.Itoa(secret)+"]", strings.TrimSpace(r.Stdout), "a later job named the file another tenant's job read")
	advServes(t, p)
}

// TestHostileReview33KernelSurface: system calls and options a job has no
// use for, newer ones among them, fail: page cache residency queries
// (cachestat, mincore), readahead and sync_file_range, the futex2 calls,
// prctl options that would merge its pages with other processes' (KSM),
// name its mappings, change its timer slack, make it a subreaper, name a
// ptracer, turn off THP, make it an I/O flusher or rewrite its mm fields,
// the namespace ioctls on its own /proc/self/ns descriptors, and the
// madvise advice that poisons or offlines pages. A Landlock domain the
// job adds on itself (all file access handled, nothing allowed) only
// restricts it: its result still arrives, and the pool serves the next
// job.
func TestHostileReview33KernelSurface(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Code: advCode(`
import mmap
buf = ctypes.create_string_buffer(4096)
fd = os.open("/dev/null", os.O_RDONLY)
sc("cachestat", 451, fd, ctypes.addressof(buf), ctypes.addressof(buf), 0)
m = mmap.mmap(-1, 1 << 20)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
sc("mincore", 27, addr, 1 << 20, ctypes.addressof(buf))
sc("readahead", 187, fd, 0, 4096)
sc("sync_file_range", 277, fd, 0, 0, 0)
sc("futex_wake", 454, addr, 0, 1, 2)
sc("futex_waitv", 449, 0, 0, 0, 0, 0)
sc("set_mempolicy_home_node", 450, addr, 1 << 20, 0, 0)
sc("PR_SET_MEMORY_MERGE", 157, 67, 1, 0, 0, 0)
sc("PR_SET_VMA", 157, 0x53564d41, 0, addr, 4096, b"x")
sc("PR_SET_TIMERSLACK", 157, 29, 1, 0, 0, 0)
sc("PR_SET_CHILD_SUBREAPER", 157, 36, 1, 0, 0, 0)
sc("PR_SET_PTRACER", 157, 0x59616d61, -1, 0, 0, 0)
sc("PR_SET_THP_DISABLE", 157, 41, 1, 0, 0, 0)
sc("PR_SET_IO_FLUSHER", 157, 57, 1, 0, 0, 0)
sc("PR_SET_MM", 157, 35, 1, 0, 0, 0)
sc("PR_SET_MDWE", 157, 65, 1, 0, 0, 0)
sc("PR_SET_KEEPCAPS", 157, 8, 1, 0, 0, 0)
ns = os.open("/proc/self/ns/user", os.O_RDONLY)
sc("NS_GET_USERNS", 16, ns, 0xb701, 0)
sc("NS_GET_PARENT", 16, ns, 0xb702, 0)
sc("MADV_HWPOISON", 28, addr, 4096, 100)
sc("MADV_SOFT_OFFLINE", 28, addr, 4096, 101)
# Landlock on itself: every file access right of ABI 1 handled, no rule.
attr = (ctypes.c_uint64 * 3)((1 << 13) - 1, 0, 0)
rs = _libc.syscall(ctypes.c_long(444), ctypes.byref(attr), ctypes.c_long(8), ctypes.c_long(0))
R["landlock self"] = "ok" if rs >= 0 and _libc.syscall(ctypes.c_long(446), ctypes.c_long(rs), ctypes.c_long(0)) == 0 else _name(ctypes.get_errno())
attempt("read after own domain", lambda: open("/etc/hosts").read())
`)})
	requireOK(t, r)
	got := advProbes(t, r)
	eperm := []string{"EPERM"}
	advExpect(t, got, map[string][]string{
		"cachestat": eperm, "mincore": eperm, "readahead": eperm, "sync_file_range": eperm,
		"futex_wake": eperm, "futex_waitv": eperm, "set_mempolicy_home_node": eperm,
		"PR_SET_MEMORY_MERGE": eperm, "PR_SET_VMA": eperm, "PR_SET_TIMERSLACK": eperm,
		"PR_SET_CHILD_SUBREAPER": eperm, "PR_SET_PTRACER": eperm, "PR_SET_THP_DISABLE": eperm,
		"PR_SET_IO_FLUSHER": eperm, "PR_SET_MM": eperm, "PR_SET_MDWE": eperm, "PR_SET_KEEPCAPS": eperm,
		"NS_GET_USERNS": eperm, "NS_GET_PARENT": eperm,
		"MADV_HWPOISON": {"EPERM", "EINVAL"}, "MADV_SOFT_OFFLINE": {"EPERM", "EINVAL"},
		"landlock self":         {"ok"},
		"read after own domain": {"EACCES"},
	})
	advServes(t, p)
}

// TestHostileReview33ScratchInodeChannel: the scratch directories of all
// jobs lie in one tmpfs (the pool's own, or /dev/shm), whose inode
// numbers come from one counter per file system. A job that creates and
// removes n files in its own scratch directory moves the counter by n;
// a later job, another tenant's, creates a file in its scratch
// directory and reads n from its inode number (less what the pool itself
// creates per job, a constant). The same tells a job how many files
// another tenant's jobs created in between. Found open by review 33.
func TestHostileReview33ScratchInodeChannel(t *testing.T) {
	if os.Getenv("PYNOX_R33_CHANNELS") == "" {
		t.Skip("review 33's finding, open: jobs pass numbers to later jobs through the scratch tmpfs's inode numbers (set PYNOX_R33_CHANNELS=1 to run)")
	}
	p := newTestPool(t, Config{Workers: 1})
	probe := Job{Code: `import os
fd = os.open(os.environ["TMPDIR"] + "/p", os.O_CREAT | os.O_WRONLY)
print(os.fstat(fd).st_ino)`}
	ino := func() int {
		r := run(t, p, probe)
		requireOK(t, r)
		n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
		require.NoError(t, err)
		return n
	}
	send := func(n int) {
		requireOK(t, run(t, p, Job{Code: `import os
d = os.environ["TMPDIR"]
for i in range(` + strconv.Itoa(n) + `):
    os.close(os.open(d + "/f", os.O_CREAT | os.O_WRONLY))
    os.unlink(d + "/f")`}))
	}
	// The constant: what the pool creates per job, measured with n = 0.
	ino()
	send(0)
	base := ino()
	send(0)
	overhead := ino() - base
	hits := 0
	for range 3 {
		secret := 1 + rand.IntN(900)
		before := ino()
		send(secret)
		got := ino() - before - overhead
		t.Logf("sent %d, read %d", secret, got)
		if got == secret {
			hits++
		}
	}
	require.Less(t, hits, 2, "a later job read the number an earlier job left in the scratch tmpfs's inode counter")
	advServes(t, p)
}

// TestHostileReview33PidChannel: the jobs of a template share its PID
// namespace, whose pids and thread ids are handed out in order. A job
// that starts and joins n threads moves the counter by n; the next job
// from the same template reads n from its own pid (less a constant per
// job). The same tells a job how many threads another tenant's job
// started. Found open by review 33.
func TestHostileReview33PidChannel(t *testing.T) {
	if os.Getenv("PYNOX_R33_CHANNELS") == "" {
		t.Skip("review 33's finding, open: jobs pass numbers to later jobs through their template's PID namespace counter (set PYNOX_R33_CHANNELS=1 to run)")
	}
	p := newTestPool(t, Config{Workers: 1})
	pid := func() int {
		r := run(t, p, Job{Code: "import os\nprint(os.getpid())"})
		requireOK(t, r)
		n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
		require.NoError(t, err)
		return n
	}
	send := func(n int) {
		requireOK(t, run(t, p, Job{Code: `import threading
for i in range(` + strconv.Itoa(n) + `):
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()`}))
	}
	pid()
	send(0)
	base := pid()
	send(0)
	overhead := pid() - base
	hits := 0
	for range 3 {
		secret := 1 + rand.IntN(900)
		before := pid()
		send(secret)
		got := pid() - before - overhead
		t.Logf("sent %d, read %d", secret, got)
		if got == secret {
			hits++
		}
	}
	require.Less(t, hits, 2, "a later job read the number an earlier job left in its template's pid counter")
	advServes(t, p)
}

// TestHostileReview33NoSharedWritableMappings: a spare inherits its
// template's mappings, and a MAP_SHARED one would be memory the job
// shares with the template and every later job (writable, or made
// writable by mprotect when its file was opened for writing). The
// template and its spare hold none but read-only ones of files opened
// read-only (glibc's gconv cache), which mprotect cannot make writable.
func TestHostileReview33NoSharedWritableMappings(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
	me := strconv.Itoa(os.Getpid())
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	seen := 0
	var tree []string // the template and its spares: our python children and theirs
	for _, e := range ents {
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
		if len(f) > 1 && f[1] == me {
			tree = append(tree, e.Name())
		}
	}
	for len(tree) > 0 {
		pid := tree[0]
		tree = tree[1:]
		if kids, err := os.ReadFile("/proc/" + pid + "/task/" + pid + "/children"); err == nil {
			tree = append(tree, strings.Fields(string(kids))...)
		}
		exe, _ := os.Readlink("/proc/" + pid + "/exe")
		if !strings.Contains(filepath.Base(exe), "python") {
			continue
		}
		maps, err := os.ReadFile("/proc/" + pid + "/maps")
		if err != nil {
			continue
		}
		seen++
		for _, l := range strings.Split(string(maps), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 || !strings.HasSuffix(f[1], "s") {
				continue
			}
			require.NotContains(t, f[1], "w", "process %s has a shared writable mapping: %s", pid, l)
			if len(f) >= 6 && strings.HasPrefix(f[5], "/") {
				// A read-only shared mapping of a file: its descriptor was
				// read-only unless the file is one the job could open for
				// writing anyway; flag any outside the runtime's files.
				t.Logf("process %s: shared read-only mapping %s", pid, f[5])
			}
		}
	}
	require.Positive(t, seen, "no python process of this pool found")
	advServes(t, p)
}

// TestHostileReview33MagicLinkDirs: the job may open its /proc/self magic
// links as O_PATH (root, cwd, map_files) and its nsfs and pipe links, but
// a descriptor reached that way opens nothing Landlock denies by path:
// openat and fchdir from /proc/self/root reach no file outside the grants,
// map_files entries need a capability, and /proc/self/fd/3 (a socket)
// cannot be reopened.
func TestHostileReview33MagicLinkDirs(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	secret := filepath.Join(p.Config().Dir, "secret.txt")
	require.NoError(t, os.WriteFile(secret, []byte("secret"), 0o644))
	r := run(t, p, Job{Code: advCode(`
root = os.open("/proc/self/root", os.O_PATH)
rel = ` + pyQuote(secret[1:]) + `
attempt("openat root secret", lambda: os.close(os.open(rel, os.O_RDONLY, dir_fd=root)))
attempt("openat root etc", lambda: os.close(os.open("etc/hostname", os.O_RDONLY, dir_fd=root)))
attempt("openat root listdir", lambda: os.listdir(root))
def via_fchdir():
    os.fchdir(root)
    os.close(os.open(rel, os.O_RDONLY))
attempt("fchdir root secret", via_fchdir)
attempt("map_files", lambda: os.listdir("/proc/self/map_files"))
attempt("reopen socket", lambda: os.close(os.open("/proc/self/fd/3", os.O_RDWR)))
attempt("cwd parent", lambda: os.listdir("/proc/self/cwd/.."))
`)})
	requireOK(t, r)
	advExpect(t, advProbes(t, r), map[string][]string{
		"openat root secret":  {"EACCES"},
		"openat root etc":     {"EACCES", "ENOENT"},
		"openat root listdir": {"EACCES", "EBADF"},
		"fchdir root secret":  {"EACCES"},
		"map_files":           {"EACCES", "EPERM"},
		"reopen socket":       {"ENXIO", "EACCES"},
		"cwd parent":          {"EACCES"},
	})
	advServes(t, p)
}

// TestHostileReview33NoEviction: a job cannot evict pages of a file it
// may read from the page cache every job shares, nor probe a page's
// residency without timing: posix_fadvise(DONTNEED) does nothing (the
// host's mincore still finds every page), madvise MADV_PAGEOUT and
// MADV_COLD on a mapping of the file fail with EINVAL, as does
// MADV_MERGEABLE (KSM) on the job's own memory, and preadv2 with
// RWF_NOWAIT fails with EOPNOTSUPP; the advices a job's libraries use
// still work.
func TestHostileReview33NoEviction(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	data := filepath.Join(p.Config().Dir, "cached.bin")
	const size = 1 << 20
	require.NoError(t, os.WriteFile(data, make([]byte, size), 0o644))
	f, err := os.Open(data)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Sync()) // dirty pages cannot be evicted
	_, err = f.Read(make([]byte, size))
	require.NoError(t, err)
	resident := func() int {
		m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
		require.NoError(t, err)
		defer unix.Munmap(m)
		vec := make([]byte, size/os.Getpagesize())
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0])))
		require.Zero(t, errno, "mincore")
		n := 0
		for _, v := range vec {
			n += int(v & 1)
		}
		return n
	}
	require.Equal(t, size/os.Getpagesize(), resident(), "the file is not in the page cache to start with")
	r := run(t, p, Job{AllowRead: []string{data}, Code: `import errno, mmap, os
fd = os.open(` + pyQuote(data) + `, os.O_RDONLY)
def e(f):
    try:
        f()
        return "ok"
    except OSError as x:
        return errno.errorcode[x.errno]
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
anon = mmap.mmap(-1, 1 << 16)
print(e(lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)),
      e(lambda: m.madvise(21)), e(lambda: m.madvise(20)),
      e(lambda: anon.madvise(12)),  # MERGEABLE (after PAGEOUT 21 and COLD 20)
      e(lambda: os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)),
      e(lambda: os.preadv(fd, [bytearray(1)], 0, os.RWF_HIPRI)),
      e(lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)),
      e(lambda: m.madvise(mmap.MADV_DONTNEED)), e(lambda: anon.madvise(mmap.MADV_HUGEPAGE)),
      e(lambda: anon.madvise(mmap.MADV_DONTNEED)))`})
	requireOK(t, r)
	require.Equal(t, "ok EINVAL EINVAL EINVAL ENOTSUP ok ok ok ok ok\n", r.Stdout)
	require.Equal(t, size/os.Getpagesize(), resident(), "a job evicted pages of a file from the page cache")
	advServes(t, p)
}
