package pynox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/testenv"
)

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	return path
}

func TestCeilingAndProfiles(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, d := range []string{"data/a", "data/b", "work/out", "other", "site/mypkg"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	writeFile(t, filepath.Join(root, "data/a/x.txt"), "A")
	writeFile(t, filepath.Join(root, "data/b/y.txt"), "B")
	writeFile(t, filepath.Join(root, "site/mypkg/__init__.py"), "VALUE = 42\n")
	require.NoError(t, os.Symlink(filepath.Join(root, "other"), filepath.Join(root, "data/escape")))

	p := newTestPool(t, Config{
		Dir: root,
		Limits: Limits{
			AllowRead:   []string{filepath.Join(root, "data"), filepath.Join(root, "site")},
			AllowWrite:  []string{filepath.Join(root, "work")},
			Timeout:     5 * time.Second,
			Memory:      512 << 20,
			MaxOutput:   4096,
			MaxFileSize: 1 << 20,
		},
		Profiles: map[string]Profile{
			"analysis": {AllowRead: []string{"data/a"}, AllowWrite: []string{"work/out"}, Env: map[string]string{"MODE": "analysis", "KEEP": "p"}, Timeout: 2 * time.Second},
			"greedy":   {Memory: 1 << 30},
		},
	})

	refusals := []struct {
		name string
		job  Job
		want string
	}{
		{"read beneath no listed path", Job{Code: "1", AllowRead: []string{"other"}}, "allow_read: " + filepath.Join(root, "other") + " is outside"},
		{"symlink out of the ceiling", Job{Code: "1", AllowRead: []string{"data/escape"}}, filepath.Join(root, "other") + " is outside"},
		{"write beneath a read-only listed path", Job{Code: "1", AllowWrite: []string{"data/a"}}, "allow_write"},
		{"package dir outside", Job{Code: "1", PackageDirs: []string{"other"}}, "package_dirs"},
		{"timeout", Job{Code: "1", Timeout: 6 * time.Second}, "timeout 6s exceeds the pool's ceiling of 5s"},
		{"memory", Job{Code: "1", Memory: 1 << 30}, "memory 1 GiB exceeds the pool's ceiling of 512 MiB"},
		{"output", Job{Code: "1", MaxOutput: 8192}, "max_output 8 KiB exceeds the pool's ceiling of 4 KiB"},
		{"file size", Job{Code: "1", MaxFileSize: 2 << 20}, "max_file_size 2 MiB exceeds"},
		{"network", Job{Code: "1", AllowNetwork: true}, "allow_network"},
		{"unknown profile", Job{Code: "1", Profile: "nope"}, `profile: unknown profile "nope"; the configured profiles are analysis, greedy`},
		{"profile over the ceiling", Job{Code: "1", Profile: "greedy"}, "memory 1 GiB exceeds"},
		{"package dir beneath a write grant", Job{Code: "1", PackageDirs: []string{"work/out"}, AllowWrite: []string{"work"}}, "must stay read-only"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, p, tc.job)
			requireErrorType(t, r, "RequestError")
			require.Contains(t, r.Error.Message, tc.want)
		})
	}

	t.Run("defaults come from the ceiling", func(t *testing.T) {
		r := run(t, p, Job{Code: "print('x' * 10000)"})
		requireOK(t, r)
		require.Equal(t, int64(5000), r.Policy.TimeoutMS)
		require.Equal(t, int64(512<<20), r.Policy.MemoryBytes)
		require.Len(t, r.Stdout, 4096)
		require.True(t, r.StdoutTruncated)
	})
	t.Run("ceiling max_file_size applies to requests that set none", func(t *testing.T) {
		r := run(t, p, Job{Code: "open('work/big', 'wb').write(b'x' * (2 << 20))", AllowWrite: []string{"work"}})
		require.NotNil(t, r.Error)
		require.Contains(t, r.Error.Message, "File too large")
	})
	t.Run("profile fields first, request on top", func(t *testing.T) {
		r := run(t, p, Job{
			Profile:   "analysis",
			Code:      "import os\nprint(open('data/a/x.txt').read(), open('data/b/y.txt').read(), os.environ['MODE'], os.environ['KEEP'])\nopen('work/out/r', 'w').write('ok')",
			AllowRead: []string{"data/b"},
			Env:       map[string]string{"MODE": "request"},
		})
		requireOK(t, r)
		require.Equal(t, "A B request p\n", r.Stdout)
		require.Equal(t, []string{filepath.Join(root, "data/a"), filepath.Join(root, "data/b")}, r.Policy.AllowRead)
		require.Equal(t, []string{filepath.Join(root, "work/out")}, r.Policy.AllowWrite)
		require.Equal(t, int64(2000), r.Policy.TimeoutMS)
		r = run(t, p, Job{Profile: "analysis", Code: "1", Timeout: 3 * time.Second})
		require.Equal(t, int64(3000), r.Policy.TimeoutMS, "the request's scalar overrides the profile's")
	})
	t.Run("package dirs per request", func(t *testing.T) {
		r := run(t, p, Job{Code: "import mypkg; print(mypkg.VALUE)", PackageDirs: []string{"site"}})
		requireOK(t, r)
		require.Equal(t, "42\n", r.Stdout)
		r = run(t, p, Job{Code: "import mypkg"})
		requireErrorType(t, r, "ModuleNotFoundError")
	})
}

func TestPreloadHygiene(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandbox(t)
	site := t.TempDir()
	writeFile(t, filepath.Join(site, "thready.py"), "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
	writeFile(t, filepath.Join(site, "leaky.py"), "import os\n_fd = os.open('/dev/null', os.O_RDONLY)\n")
	writeFile(t, filepath.Join(site, "broken.py"), "raise ImportError('nope')\n")
	writeFile(t, filepath.Join(site, "fine.py"), "X = 1\n")
	tests := []struct {
		module string
		want   []string
	}{
		{"thready", []string{"preload thready", "2 threads"}},
		{"leaky", []string{"preload leaky", "descriptors open", "/dev/null"}},
		{"broken", []string{"preload broken failed", "nope"}},
		{"no_such_module", []string{"preload no_such_module failed", "ModuleNotFoundError"}},
	}
	for _, tc := range tests {
		t.Run(tc.module, func(t *testing.T) {
			_, err := New(Config{Workers: 1, Dir: t.TempDir(), Python: testPython(), PackageDirs: []string{site}, Preload: []string{"fine", tc.module}})
			require.Error(t, err)
			require.ErrorIs(t, err, ErrSpawn)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
	p := newTestPool(t, Config{Workers: 1, PackageDirs: []string{site}, Preload: []string{"fine"}})
	require.Equal(t, []string{"fine"}, p.Preloaded())
	r := run(t, p, Job{Code: "import fine, sys; print(fine.X, 'fine' in sys.modules)"})
	requireOK(t, r)
	require.Equal(t, "1 True\n", r.Stdout)
	require.Equal(t, []string{"fine"}, r.Runtime.PreloadedModules)

	// The pool's package dirs are read-only in every job's Landlock rules,
	// although the template has them on its sys.path too.
	real, err := filepath.EvalSymlinks(site)
	require.NoError(t, err)
	found := false
	for _, rule := range p.info.Landlock.Rules {
		if rule.Path == real {
			found = true
			require.Equal(t, sandbox.ReadAccess(p.info.Landlock.ABI), rule.Access, "package dir rights")
		}
	}
	require.True(t, found, "no rule for the package dir %s", real)
}

func TestWriteGrantOverPreloadRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "site", "tool.py"), "X = 1\n")
	p := newTestPool(t, Config{Workers: 1, Dir: dir, PackageDirs: []string{filepath.Join(dir, "site")}, Preload: []string{"tool"}})
	for _, w := range []string{".", "site", "site/tool.py"} {
		r := run(t, p, Job{Code: "1", AllowWrite: []string{w}})
		requireErrorType(t, r, "RequestError")
		require.Contains(t, r.Error.Message, "must stay read-only")
	}
	require.NoError(t, os.Mkdir(filepath.Join(dir, "out"), 0o755))
	requireOK(t, run(t, p, Job{Code: "import tool; open('out/x', 'w').write(str(tool.X))", AllowWrite: []string{"out"}}))
}

func TestJobsDoNotShareRandomStreams(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, Preload: []string{"random"}})
	seen := map[string]bool{}
	for i := 0; i < 5; i++ {
		r := run(t, p, Job{Code: "import random; print(random.getrandbits(64))"})
		requireOK(t, r)
		require.False(t, seen[r.Stdout], "two jobs drew the same random number")
		seen[r.Stdout] = true
	}
}

func pandasAvailable(t *testing.T) {
	t.Helper()
	py := testPython()
	if py == "" {
		t.Skip("Debian's /usr/bin/python3 is not installed")
	}
	if err := importErr(py, "pandas, numpy"); err != nil {
		t.Skipf("pandas and numpy are not importable by %s (apt-get install python3-pandas): %v", py, err)
	}
}

func TestPandasPreload(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	pandasAvailable(t)
	// One template (one pandas import): both numpy jobs below fork from the same state.
	p := newTestPool(t, Config{Workers: 1, Preload: []string{"pandas", "numpy"}, Limits: Limits{Memory: 256 << 20}})
	require.Equal(t, []string{"pandas", "numpy"}, p.Preloaded())
	r := run(t, p, Job{Code: "import pandas as pd\ndf = pd.DataFrame({'product': ['a', 'b', 'a'], 'amount': [1, 2, 3]})\nprint(df.groupby('product').amount.sum().to_dict())", Memory: 64 << 20})
	requireOK(t, r)
	require.Equal(t, "{'a': 4, 'b': 2}\n", r.Stdout)
	// numpy's global generator is re-seeded per job.
	a := run(t, p, Job{Code: "import numpy as np; print(np.random.randint(1 << 30))"})
	b := run(t, p, Job{Code: "import numpy as np; print(np.random.randint(1 << 30))"})
	requireOK(t, a)
	requireOK(t, b)
	require.NotEqual(t, a.Stdout, b.Stdout)
	r = run(t, p, Job{Code: "import os; print(os.environ.get('OPENBLAS_NUM_THREADS'))"})
	require.Equal(t, "1\n", r.Stdout)
	require.Equal(t, []string{"pandas", "numpy"}, r.Runtime.PreloadedModules)
}

func TestStatsAfterMixedOutcomes(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	jobs := []Job{
		{Code: "print(1)"},
		{Code: "print(2)"},
		{Code: "raise ValueError('x')"},
		{Code: "import sys; sys.exit(4)"},
		{Code: "open('/etc/passwd')"},
		{Code: "while True: pass", Timeout: 200 * time.Millisecond},
		{Code: "import ctypes; ctypes.string_at(0)"},
		{Code: "1", Memory: 1 << 40},
	}
	for _, j := range jobs {
		run(t, p, j)
	}
	s := p.Stats()
	require.Equal(t, int64(8), s.Jobs)
	require.Equal(t, int64(2), s.OK)
	require.Equal(t, int64(3), s.Failed)
	require.Equal(t, int64(1), s.Timeouts)
	require.Equal(t, int64(1), s.Signals)
	require.Equal(t, int64(1), s.RequestErrors)
	require.Equal(t, int64(0), s.WorkerErrors)
	require.Equal(t, s.Jobs, s.OK+s.Failed+s.Timeouts+s.Signals+s.RequestErrors+s.WorkerErrors+s.Cancelled)
	require.Equal(t, map[string]int64{"ValueError": 1, "PermissionError": 1, "TimeoutError": 1, "SignalError": 1, "RequestError": 1}, s.Errors)
	require.Equal(t, 2, s.Workers)
	require.Greater(t, s.DurationMSTotal, int64(100))
	require.Greater(t, s.QueueUSTotal, int64(0))
}

// TestPandasTemplateHugePages checks that a template with pandas preloaded
// has its dense anonymous memory backed by transparent huge pages
// (runner.py: _collapse_huge_pages), which makes each fork and exit
// cheaper, and that its jobs still run.
func TestPandasTemplateHugePages(t *testing.T) {
	requireLong(t, "a pandas template's huge pages (a speed property, not a confinement one)")
	pandasAvailable(t)
	if thp, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil || strings.Contains(string(thp), "[never]") {
		t.Skip("transparent huge pages are unavailable or disabled on this machine")
	}
	var uts unix.Utsname
	require.NoError(t, unix.Uname(&uts))
	var major, minor int
	fmt.Sscanf(unix.ByteSliceToString(uts.Release[:]), "%d.%d", &major, &minor)
	if major < 6 || (major == 6 && minor < 1) {
		t.Skipf("MADV_COLLAPSE needs Linux 6.1; this is %d.%d", major, minor)
	}
	p := newTestPool(t, Config{Workers: 1, Preload: []string{"pandas"}})
	requireOK(t, run(t, p, Job{Code: "import pandas; print(pandas.DataFrame({'a': [1, 2]}).a.sum())"}))
	pids := p.templatePIDs()
	require.Len(t, pids, 1)
	hugeKB := func(pid int) int {
		rollup, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		require.NoError(t, err)
		var kb int
		for _, line := range strings.Split(string(rollup), "\n") {
			if strings.HasPrefix(line, "AnonHugePages:") {
				fmt.Sscanf(strings.TrimPrefix(line, "AnonHugePages:"), "%d", &kb)
			}
		}
		return kb
	}
	require.Greater(t, hugeKB(pids[0]), 0, "no huge pages in the pandas template")

	// A session's process is forked from that same template: it starts
	// from the collapsed heap too.
	co := checkout(t, p, Job{})
	requireOK(t, feed(t, co, "x = 1"))
	_, ppid, ok := procStat(co.Pid())
	require.True(t, ok)
	require.Equal(t, pids[0], ppid, "the session's process is the pool template's child")
}
