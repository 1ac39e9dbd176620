package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHostileReview14SelfConfinedCodeMappings probes the template's byte
// rewrite where it goes through mprotect (the CLI's pool confines itself,
// so its templates see /proc read-only): the template keeps no mapping
// writable and executable, its rewritten pages hold the file's bytes, and
// a job that makes the interpreter's ELF header page writable and patches
// it changes only its own copy: the next job and the template read the
// file's bytes.
func TestHostileReview14SelfConfinedCodeMappings(t *testing.T) {
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	p := startPool(t, "--workers=1", "--python="+py)
	p.send(t, `{"id":1,"code":"print(1)"}`)
	res := p.next(t)
	require.Equal(t, "1\n", res["stdout"], "result %v", res)

	var tpl int
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(p.cmd.Process.Pid) {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if exe, _ := os.Readlink("/proc/" + e.Name() + "/exe"); exe == py && strings.Contains(string(cmdline), "\x00-B\x00") {
			tpl = pid
		}
	}
	require.NotZero(t, tpl, "the pool's template")
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", tpl))
	require.NoError(t, err)
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", tpl))
	require.NoError(t, err)
	defer mem.Close()
	var head uint64
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(maps)), "\n") {
		f := strings.Fields(line)
		perms := f[1]
		require.False(t, strings.Contains(perms, "w") && strings.Contains(perms, "x"), "the template maps %s", line)
		if len(f) < 6 || !strings.HasPrefix(f[5], "/") {
			continue
		}
		off, _ := strconv.ParseInt(f[2], 16, 64)
		if perms != "r-xp" && (perms != "r--p" || off != 0) {
			continue
		}
		lo, _ := strconv.ParseUint(strings.SplitN(f[0], "-", 2)[0], 16, 64)
		if f[5] == py && off == 0 && perms == "r--p" && head == 0 {
			head = lo
		}
		want := make([]byte, 64)
		file, err := os.Open(f[5])
		if err != nil {
			continue
		}
		n, _ := file.ReadAt(want, off)
		file.Close()
		got := make([]byte, n)
		_, err = mem.ReadAt(got, int64(lo))
		require.NoError(t, err, line)
		require.True(t, bytes.Equal(want[:n], got), "the template's copy of %s differs from the file", line)
		checked++
	}
	t.Logf("%d mappings checked", checked)
	require.NotZero(t, head, "no r--p mapping of %s at offset 0", py)

	patch := fmt.Sprintf(`import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
ok = libc.mprotect(%d, 4096, 3) == 0
if ok:
    ctypes.memmove(%d, b"PWND", 4)
print(ok, ctypes.string_at(%d, 4))`, head, head, head)
	p.send(t, fmt.Sprintf(`{"id":2,"code":%q}`, patch))
	res = p.next(t)
	t.Logf("patching job: %v", res["stdout"])
	p.send(t, fmt.Sprintf(`{"id":3,"code":"import ctypes\nprint(ctypes.string_at(%d, 4))"}`, head))
	res = p.next(t)
	require.Equal(t, "b'\\x7fELF'\n", res["stdout"], "a job saw an earlier job's patch: %v", res)
	got := make([]byte, 4)
	_, err = mem.ReadAt(got, int64(head))
	require.NoError(t, err)
	require.Equal(t, []byte("\x7fELF"), got, "the template's copy was patched")
}
