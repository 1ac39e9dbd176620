package pynox

// Review 24: an outside review's probes of review 22 and 23's changes
// (helpers in hostile_test.go and helpers_test.go).

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// review24MapShared is a preload's source that maps path (a memfd when
// empty) shared and read-only through the C library, as a C extension
// would, and closes the descriptor: ADDR is the mapping.
func review24MapShared(path string, flags string) string {
	open := `os.memfd_create("r24memfd")` + "\nos.ftruncate(_fd, 4096)"
	if path != "" {
		open = "os.open(" + `"` + path + `", ` + flags + ")"
	}
	return `import ctypes, os
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_fd = ` + open + `
ADDR = _libc.mmap(None, 4096, 1, 1, _fd, 0)  # PROT_READ, MAP_SHARED
os.close(_fd)
`
}

// Probe 1 (HOLE, fixed): shared memory a preload leaves mapped read-only.
// The template refused a preload that leaves a writable shared mapping
// ("rw-s" in /proc/self/maps), but a shared mapping of a file opened for
// writing, mapped read-only ("r--s": a memfd, or a file opened "r+b"),
// is made writable by mprotect, which jobs may call: a job wrote into it
// and a later job read it back, as through review 22's MAP_SHARED
// reserve. Such a preload is now refused (VmFlags "sh" in
// /proc/self/smaps); a shared mapping of a file opened read-only, which
// mprotect cannot make writable, is fine. And the template checks again
// just before it forks, so that what is mapped after a preload's own
// check (lazily, here on the runner's first garbage collection; or by the
// runner itself, as the reserve was) is refused too.
func TestReview24PreloadSharedReadOnlyRefused(t *testing.T) {
	requireSandbox(t)
	site := t.TempDir()
	writeFile(t, filepath.Join(site, "r24memfd.py"), review24MapShared("", ""))
	data := writeFile(t, filepath.Join(t.TempDir(), "data.bin"), strings.Repeat("x", 4096))
	writeFile(t, filepath.Join(site, "r24rwfile.py"), review24MapShared(data, "os.O_RDWR"))
	writeFile(t, filepath.Join(site, "r24rofile.py"), review24MapShared(data, "os.O_RDONLY"))
	writeFile(t, filepath.Join(site, "r24lazy.py"), `import gc, mmap
_maps = []
def _later(phase, info):
    if not _maps:
        _maps.append(mmap.mmap(-1, 4096))
gc.callbacks.append(_later)
`)
	for _, mod := range []string{"r24memfd", "r24rwfile", "r24lazy"} {
		_, err := New(Config{Workers: 1, Dir: t.TempDir(), Python: testPython(), PackageDirs: []string{site}, Preload: []string{mod}})
		require.Error(t, err, "preload %s: shared memory a job can make writable was accepted: every job would share it", mod)
		require.ErrorIs(t, err, ErrSpawn)
		require.Contains(t, err.Error(), "shared memory")
	}
	p := newTestPool(t, Config{Workers: 1, PackageDirs: []string{site}, Preload: []string{"r24rofile"}})
	r := run(t, p, Job{Code: `
import ctypes, r24rofile
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
print("mprotect", libc.mprotect(r24rofile.ADDR, 4096, 3), ctypes.get_errno())
print(ctypes.string_at(r24rofile.ADDR, 4))
`})
	requireOK(t, r)
	require.Equal(t, "mprotect -1 13\nb'xxxx'\n", r.Stdout, "a read-only shared mapping of a read-only file became writable")
}
