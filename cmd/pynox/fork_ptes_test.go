package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestSelfConfinedTemplateCopiesFilePTEsAtFork checks the template's last
// step before "ready" (runner.py: _copy_file_ptes_at_fork) in the CLI's
// pool, which confines itself with Landlock and so gives its templates
// /proc read-only: the interpreter's code mapping still gets its
// anonymous page (the byte is stored through the mapping, made writable
// for that store), and keeps the protection the loader gave it
// (r-xp: never writable once the template is ready).
func TestSelfConfinedTemplateCopiesFilePTEsAtFork(t *testing.T) {
	testenv.Slow(t)
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	p := startPool(t, "--workers=1", "--python="+py)
	p.send(t, `{"id":1,"code":"print(1)"}`)
	res := p.next(t)
	require.Equal(t, "1\n", res["stdout"], "result %v", res)
	var templates []int
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
		// A template runs the interpreter as `python3 -I -B -c <boot>`
		// (the mounter, another child, as `-I -S`).
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if exe, _ := os.Readlink("/proc/" + e.Name() + "/exe"); exe == py && strings.Contains(string(cmdline), "\x00-B\x00") {
			templates = append(templates, pid)
		}
	}
	require.NotEmpty(t, templates, "the pool's templates (children running %s)", py)
	for _, pid := range templates {
		f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps")
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		var code string
		found := false
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 6 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
				code = ""
				if fields[5] == py && strings.Contains(fields[1], "x") {
					code = fields[1]
				}
				continue
			}
			if code != "" && len(fields) >= 2 && fields[0] == "Anonymous:" {
				found = true
				require.Equal(t, "r-xp", code, "template %d: the interpreter's code mapping", pid)
				n, _ := strconv.Atoi(fields[1])
				require.Positive(t, n, "template %d: the interpreter's code mapping has no anonymous page: a fork would not copy its entries", pid)
				code = ""
			}
		}
		f.Close()
		require.True(t, found, "template %d maps the interpreter's code", pid)
	}
}
