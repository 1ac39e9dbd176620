package pynox

// Probes of the pool's front door (issue 9, items 5, 7 and 11): what a
// client's request line may say, what a job's write grants may cover, and
// what a hint may reveal.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// Hints are built from names alone. The pool runs with more rights than
// its jobs (often root's): a hint that looked at the filesystem told a job
// whether a file exists in a directory the job may not search, and a job
// that reported a 2,000-deep chain of directories ending in a symlink
// loop held its worker while the pool resolved it (34 CPU-s in the
// review). Now the hint for a file in an unsearchable directory is the
// same whether the file exists or not, and the deep chain's job answers
// like any other.
func TestHostileFrontHintsLexical(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the oracle is about what the pool (root) sees and the job (root without capabilities) does not")
	}
	p := newTestPool(t, Config{Workers: 1})
	dir := p.cfg.Dir
	hidden := filepath.Join(dir, "hidden")
	require.NoError(t, os.Mkdir(hidden, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(hidden, "present"), []byte("x"), 0o600))
	require.NoError(t, os.Chown(filepath.Join(hidden, "present"), 65534, 65534))
	require.NoError(t, os.Chown(hidden, 65534, 65534))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "out"), 0o755))

	for _, mode := range []string{"r", "w"} {
		hints := map[string]string{}
		for _, name := range []string{"present", "absent"} {
			r := run(t, p, Job{Code: fmt.Sprintf("open('hidden/%s', %q)", name, mode)})
			requireErrorType(t, r, "PermissionError")
			hints[name] = strings.ReplaceAll(r.Error.Hint, name, "NAME")
		}
		require.NotEmpty(t, hints["present"])
		require.Equal(t, hints["present"], hints["absent"], "mode %s: the hint must not tell whether the file exists", mode)
	}

	// The deep chain: as deep as a path may be (PATH_MAX), ending in a
	// symlink to itself by its absolute name, reported as the filename of
	// a PermissionError.
	chain := `import os
base = os.path.join(os.getcwd(), 'out')
n = min(2000, (4090 - len(base) - len('/loop')) // 2)
os.chdir(base)
for _ in range(n):
    os.mkdir('d')
    os.chdir('d')
target = base + '/d' * n + '/loop'
os.symlink(target, 'loop')
print(n)
raise PermissionError(13, 'Permission denied', target)
`
	r := run(t, p, Job{Code: chain, AllowWrite: []string{"out"}})
	requireErrorType(t, r, "PermissionError")
	require.Contains(t, r.Error.Hint, "write grants", "the name lies within the job's grant: %s", r.Error.Hint)
	t.Logf("chain depth %s", strings.TrimSpace(r.Stdout))
	requireOK(t, run(t, p, Job{Code: "pass"}))
}

// A pool grants no writes unless its operator sets a write ceiling: with
// the README's layout (the binary in the working directory) the old
// default ceiling, the working directory, let a job replace ./pynox, which
// the operator's next start then ran as root, outside any sandbox. Write
// grants that cover the pool's own executable, its directory or the
// configuration file are refused even beneath an explicit ceiling.
func TestHostileFrontOwnFiles(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandbox(t)
	exe, err := os.Executable()
	require.NoError(t, err)
	exe, err = filepath.EvalSymlinks(exe)
	require.NoError(t, err)
	exeDir := filepath.Dir(exe)

	t.Run("no write ceiling by default", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.Mkdir(filepath.Join(dir, "out"), 0o755))
		// A configuration file in the working directory is the natural
		// set-up, and fine now that nothing is writable by default.
		cfgPath := filepath.Join(dir, "pynox.toml")
		require.NoError(t, os.WriteFile(cfgPath, []byte("[pool]\nworkers = 1\n"), 0o644))
		// (jsonl.LoadConfig gives New the file as Config.Source.)
		p, err := New(Config{Workers: 1, Source: cfgPath, Dir: dir, Python: testPython()})
		require.NoError(t, err)
		t.Cleanup(func() { p.Close() })
		r := run(t, p, Job{Code: "open('out/x', 'w').write('x')", AllowWrite: []string{"out"}})
		requireErrorType(t, r, "RequestError")
		require.Contains(t, r.Error.Message, "allow_write: the pool grants no writes at all")
		require.Contains(t, r.Error.Message, "--allow-write")
		r = run(t, p, Job{Code: "open('out/x', 'w').write('x')"})
		requireErrorType(t, r, "PermissionError")
		require.Contains(t, r.Error.Hint, "the pool grants no writes at all")
		require.NoFileExists(t, filepath.Join(dir, "out", "x"))
		requireOK(t, run(t, p, Job{Code: "pass"}))
	})

	t.Run("the executable and its directory", func(t *testing.T) {
		// The pool's working directory holds its executable (here the test
		// binary), and the ceiling allows writing there.
		work, err := os.MkdirTemp(exeDir, "work")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(work) })
		p := newTestPool(t, Config{Workers: 1, Dir: exeDir, Limits: Limits{AllowWrite: []string{exeDir}}})
		before := advStat(t, exe)
		for _, grant := range []string{".", exe, filepath.Base(exe), exeDir + "/../" + filepath.Base(exeDir)} {
			r := run(t, p, Job{Code: "open('marker-' + str(__import__('os').getpid()), 'w')", AllowWrite: []string{grant}})
			requireErrorType(t, r, "RequestError")
			require.Contains(t, r.Error.Message, "allow_write: ", grant)
			require.Contains(t, r.Error.Message, "the pool's own executable", grant)
		}
		requireUnchanged(t, before, exe)
		// The hint of a denied write there does not suggest what would be
		// refused.
		r := run(t, p, Job{Code: "open('new.txt', 'w')"})
		requireErrorType(t, r, "PermissionError")
		require.Contains(t, r.Error.Hint, "to write, use a subdirectory and grant that (a write grant of "+exeDir+" would cover "+exe)
		// A directory beside it is fine.
		r = run(t, p, Job{Code: "open('" + filepath.Base(work) + "/ok', 'w').write('ok')", AllowWrite: []string{filepath.Base(work)}})
		requireOK(t, r)
	})

	t.Run("a profile that covers the executable", func(t *testing.T) {
		_, err := New(Config{Workers: 1, Dir: t.TempDir(), Python: testPython(),
			Limits: Limits{AllowWrite: []string{"/"}}, Profiles: map[string]Profile{"build": {AllowWrite: []string{exeDir}}}})
		require.ErrorContains(t, err, `profiles.build.allow_write: "`+exeDir+`": would cover `+exe)
	})

	t.Run("hard links to the executable and the configuration", func(t *testing.T) {
		dir := t.TempDir()
		etc := t.TempDir()
		cfgPath := filepath.Join(etc, "pynox.toml")
		require.NoError(t, os.WriteFile(cfgPath, []byte("[pool]\nworkers = 1\n"), 0o644))
		if err := os.Link(exe, filepath.Join(dir, "exe-link")); err != nil {
			t.Skipf("cannot hard-link the test binary into a scratch directory: %v", err)
		}
		require.NoError(t, os.Link(cfgPath, filepath.Join(dir, "config-link")))
		p := newTestPool(t, Config{Workers: 1, Dir: dir, Source: cfgPath})
		for grant, what := range map[string]string{"exe-link": "the pool's own executable", "config-link": "the pool's configuration file"} {
			r := run(t, p, Job{Code: "pass", AllowWrite: []string{grant}})
			requireErrorType(t, r, "RequestError")
			require.Contains(t, r.Error.Message, "is a hard link to", grant)
			require.Contains(t, r.Error.Message, what, grant)
		}
		// Through a profile, the message says where the grant came from.
		p = newTestPool(t, Config{Workers: 1, Dir: dir, Source: cfgPath, Profiles: map[string]Profile{"w": {AllowWrite: []string{"config-link"}}}})
		r := run(t, p, Job{Code: "pass", Profile: "w"})
		requireErrorType(t, r, "RequestError")
		require.Contains(t, r.Error.Message, `profile "w" allow_write: `)
	})
}
