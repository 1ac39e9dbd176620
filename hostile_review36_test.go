package pynox

// Review 36: an outside review's probes of the seccomp argument filters
// added after review 33 (madvise, fadvise64, preadv2, pwritev2). Each
// asserts the safe outcome and that the pool serves the next job.

import (
	"time"

	"github.com/pynox/pynox/internal/testenv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHostileReview36SeccompArgBypass: the argument filters hold against
// high bits above the int the kernel reads (madvise PAGEOUT/COLD with bit
// 32 set, fadvise64 DONTNEED with bit 32 set, preadv2 and pwritev2
// RWF_NOWAIT with bit 32 set), and the other calls that evict or probe
// the page cache stay refused (process_madvise, remap_file_pages,
// io_uring_setup, io_setup, mincore).
func TestHostileReview36SeccompArgBypass(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Code: advCode(`
import mmap, pydoc_data
F = os.path.join(os.path.dirname(pydoc_data.__file__), "topics.py")
fd = os.open(F, os.O_RDONLY)
buf = ctypes.create_string_buffer(4096)
iov = (ctypes.c_uint64 * 2)(ctypes.addressof(buf), 1)
H = 1 << 32
sc("madvise PAGEOUT hi", 28, 0, 4096, 21 | H)
sc("madvise COLD hi", 28, 0, 4096, 20 | H)
sc("madvise MERGEABLE hi", 28, 0, 4096, 12 | H)
sc("madvise PAGEOUT neg", 28, 0, 4096, 21 - (1 << 64) + H)
sc("fadvise DONTNEED", 221, fd, 0, 0, 4)
sc("fadvise DONTNEED hi", 221, fd, 0, 0, 4 | H)
sc("preadv2 NOWAIT", 327, fd, ctypes.addressof(iov), 1, 0, 0, 8)
sc("preadv2 NOWAIT hi", 327, fd, ctypes.addressof(iov), 1, 0, 0, 8 | H)
sc("preadv2 NOWAIT pos-1", 327, fd, ctypes.addressof(iov), 1, -1, -1, 8)
sc("pwritev2 NOWAIT hi", 328, fd, ctypes.addressof(iov), 1, 0, 0, 8 | H)
sc("process_madvise", 440, -1, 0, 0, 21, 0)
sc("remap_file_pages", 216, 0, 4096, 0, 0, 0)
sc("io_uring_setup", 425, 1, ctypes.addressof(buf))
sc("io_setup", 206, 1, ctypes.addressof(buf))
sc("mincore", 27, 0, 4096, ctypes.addressof(buf))
sc("cachestat", 451, fd, ctypes.addressof(buf), ctypes.addressof(buf), 0)
`)})
	requireOK(t, r)
	t.Log(r.Stdout)
	got := advProbes(t, r)
	eperm := []string{"EPERM"}
	advExpect(t, got, map[string][]string{
		"madvise PAGEOUT hi": {"EINVAL"}, "madvise COLD hi": {"EINVAL"}, "madvise MERGEABLE hi": {"EINVAL"},
		"madvise PAGEOUT neg": {"EINVAL"},
		"fadvise DONTNEED":    {"ok"}, "fadvise DONTNEED hi": {"ok"},
		"preadv2 NOWAIT": {"EOPNOTSUPP", "ENOTSUP"}, "preadv2 NOWAIT hi": {"EOPNOTSUPP", "ENOTSUP"}, "preadv2 NOWAIT pos-1": {"EOPNOTSUPP", "ENOTSUP"},
		"pwritev2 NOWAIT hi": {"EOPNOTSUPP", "ENOTSUP"},
		"process_madvise":    eperm, "remap_file_pages": eperm, "io_uring_setup": eperm, "io_setup": eperm,
		"mincore": eperm, "cachestat": eperm,
	})
	advServes(t, p)
}

// TestHostileReview36MappedPagesHidden: with mincore and cachestat
// refused, a job could still tell which pages of a shared file are in
// the page cache without reading them in: touch one page of a mapping
// and fault-around maps the cached pages next to it, which
// /proc/self/pagemap (present bits), smaps (Rss) or statm would count.
// None of them is readable.
func TestHostileReview36MappedPagesHidden(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{Code: advCode(`
for f in ("pagemap", "smaps", "smaps_rollup", "statm", "numa_maps"):
    attempt(f, lambda: open("/proc/self/" + f, "rb").read(64))
`)})
	requireOK(t, r)
	got := advProbes(t, r)
	no := []string{"EACCES", "EPERM", "ENOENT"}
	advExpect(t, got, map[string][]string{"pagemap": no, "smaps": no, "smaps_rollup": no, "statm": no, "numa_maps": no})
	advServes(t, p)
}

// TestHostileReview36LingeringInRecycledNS: a one-shot mount job forks a
// detached grandchild (fork, setsid, fork) meant to outlive it in its
// namespace attached ahead and keep writing into the job's scratch
// directory, which a namespace that comes back (recycleAhead) hands,
// emptied, to the next job asking for the same mounts. No later job of
// the same mounts finds anything there: the job's processes are all gone
// before its namespace and scratch directory come back.
func TestHostileReview36LingeringInRecycledNS(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, data := r13ProcPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	plant := r28NS + `import os, threading, time
t = os.environ["TMPDIR"]
o = os.environ.get("PYNOX_OUTPUTS")
def linger():
    end = time.time() + 4
    while time.time() < end:
        for d in (t, o):
            try:
                open(os.path.join(d or t, "planted"), "w").write("x")
            except Exception:
                pass
        time.sleep(0.005)
try:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            linger()
        os._exit(0)
except OSError:
    pass
# Processes are refused: a non-daemon thread, which the interpreter's
# exit waits for after the job's code (and its result) is done.
threading.Thread(target=linger).start()
print("forked")
`
	check := r28NS + `import os
print(sorted(os.listdir(os.environ["TMPDIR"])), sorted(os.listdir(os.environ["PYNOX_OUTPUTS"])) if os.environ.get("PYNOX_OUTPUTS") else [])
`
	reused := false
	for range 4 {
		res := run(t, p, Job{Mounts: mounts, Code: plant})
		requireOK(t, res)
		planted := r28NSOf(t, res)
		end := time.Now().Add(1500 * time.Millisecond)
		for time.Now().Before(end) {
			res := run(t, p, Job{Mounts: mounts, Code: check})
			requireOK(t, res)
			require.NotContains(t, res.Stdout, "planted", "a later job found what a lingering process of an earlier job wrote")
			reused = reused || r28NSOf(t, res) == planted
		}
	}
	t.Logf("a later job ran in a planting job's namespace: %v; %+v", reused, aheadOf(p))
	advServes(t, p)
}
