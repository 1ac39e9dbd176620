package worker

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// smapsEntry is one mapping of /proc/<pid>/smaps: its range, protection,
// file offset, path and Anonymous figure (kB).
type smapsEntry struct {
	lo, hi    uint64
	perms     string
	offset    uint64
	path      string
	anonymous int
}

func readSmaps(t *testing.T, pid int) []smapsEntry {
	t.Helper()
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps")
	require.NoError(t, err)
	defer f.Close()
	var out []smapsEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") && strings.Contains(fields[0], "-") {
			r := strings.SplitN(fields[0], "-", 2)
			lo, _ := strconv.ParseUint(r[0], 16, 64)
			hi, _ := strconv.ParseUint(r[1], 16, 64)
			off, _ := strconv.ParseUint(fields[2], 16, 64)
			e := smapsEntry{lo: lo, hi: hi, perms: fields[1], offset: off}
			if len(fields) > 5 {
				e.path = fields[5]
			}
			out = append(out, e)
			continue
		}
		if fields[0] == "Anonymous:" && len(out) > 0 {
			out[len(out)-1].anonymous, _ = strconv.Atoi(fields[1])
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// procMemRewrites says whether this kernel lets a process write a byte
// of its own read-only file mapping through /proc/self/mem (the step the
// template takes, see runner.py: _copy_file_ptes_at_fork), by doing it
// to this test binary's own code.
func procMemRewrites(t *testing.T) bool {
	exe, err := os.Readlink("/proc/self/exe")
	require.NoError(t, err)
	for _, e := range readSmaps(t, os.Getpid()) {
		if e.path != exe || e.perms != "r-xp" {
			continue
		}
		fd, err := unix.Open("/proc/self/mem", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return false
		}
		defer unix.Close(fd)
		b := make([]byte, 1)
		if _, err := unix.Pread(fd, b, int64(e.lo)); err != nil {
			return false
		}
		_, err = unix.Pwrite(fd, b, int64(e.lo))
		return err == nil
	}
	return false
}

// TestTemplateFileMappingsCopiedAtFork checks the template's last step
// before "ready": each read-only mapping of the interpreter's file has an
// anonymous page (so that a fork copies the mapping's page-table entries
// and a spare does not fault the interpreter's code in again), its
// protection is what the loader gave it (never writable), and the bytes
// of that page are still the file's. A preload's own libraries are left
// alone (a trivial job's spare touches little of them).
func TestTemplateFileMappingsCopiedAtFork(t *testing.T) {
	if !procMemRewrites(t) {
		t.Skip("this kernel refuses writes to a read-only mapping through /proc/self/mem (proc_mem.force_override=never)")
	}
	tpl := startTestTemplate(t, false)
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	require.NoError(t, err)
	file, err := os.ReadFile(py)
	require.NoError(t, err)
	mem, err := os.Open("/proc/" + strconv.Itoa(tpl.Pid()) + "/mem")
	if err != nil {
		t.Skipf("cannot read the template's memory to compare it with the file: %v", err)
	}
	defer mem.Close()
	seen := 0
	maps := readSmaps(t, tpl.Pid())
	for i, e := range maps {
		if e.path != py || strings.Contains(e.perms, "w") {
			continue
		}
		if i+1 < len(maps) && maps[i+1].path == py && maps[i+1].lo == e.hi && strings.Contains(maps[i+1].perms, "w") {
			continue // the loader's RELRO: relocated, then made read-only (not the file's bytes)
		}
		seen++
		require.Contains(t, []string{"r-xp", "r--p"}, e.perms, "mapping %x-%x of the interpreter", e.lo, e.hi)
		require.Positive(t, e.anonymous, "mapping %x-%x (%s) of the interpreter has no anonymous page: a fork would not copy its entries", e.lo, e.hi, e.perms)
		n := min(uint64(4096), e.hi-e.lo)
		got := make([]byte, n)
		_, err := mem.ReadAt(got, int64(e.lo))
		require.NoError(t, err)
		require.True(t, bytes.Equal(got, file[e.offset:e.offset+n]), "mapping %x-%x (%s): its first page differs from the file", e.lo, e.hi, e.perms)
	}
	require.GreaterOrEqual(t, seen, 2, "the interpreter's code and constants mappings")
	// Spares still serve jobs.
	o := runTestJob(t, tpl, Job{Code: "print(sum(range(100)))"})
	require.Equal(t, "4950\n", string(o.Stdout), "setup error %q, stderr %s", o.SetupError, o.Stderr)
}

// TestTemplatePreloadMappingsNotCopiedAtFork checks that the step above
// leaves a preload's libraries alone: with numpy preloaded, numpy's
// extension modules have no anonymous page in their code mappings (a
// fork does not copy their entries), while the interpreter's code has.
func TestTemplatePreloadMappingsNotCopiedAtFork(t *testing.T) {
	testenv.Slow(t)
	if !procMemRewrites(t) {
		t.Skip("this kernel refuses writes to a read-only mapping through /proc/self/mem (proc_mem.force_override=never)")
	}
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	if err := exec.Command(py, "-I", "-c", "import numpy").Run(); err != nil {
		t.Skip("numpy is not installed for " + py)
	}
	startTestTemplate(t, false) // skips where jobs cannot run confined
	tpl, err := Start(Options{Python: py, Dir: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin", "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1"}, Preload: []string{"numpy"}})
	require.NoError(t, err)
	t.Cleanup(func() { tpl.Close() })
	var numpyCode, pyCode int
	for _, e := range readSmaps(t, tpl.Pid()) {
		if e.perms != "r-xp" {
			continue
		}
		switch {
		case e.path == py:
			pyCode++
			require.Positive(t, e.anonymous, "the interpreter's code mapping")
		case strings.Contains(e.path, "/numpy/") && strings.Contains(e.path, ".so"):
			numpyCode++
			require.Zero(t, e.anonymous, "%s: a preload's code mapping was given an anonymous page", e.path)
		}
	}
	require.Equal(t, 1, pyCode)
	require.Positive(t, numpyCode, "numpy's extension modules are mapped")
}
