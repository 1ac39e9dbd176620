package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// Help is asked for, so it goes to stdout with exit 0, in every spelling;
// the pool's help lists every flag it defines and shows a request
// (issue 10 item 4).
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"pool", "--help"}, {"pool", "-h"}, {"pool", "help"}, {"help", "pool"}, {"pool", "--workers=3", "--help"}} {
		var out, errb strings.Builder
		require.Equal(t, 0, run(args, strings.NewReader(""), &out, &errb), "%q: %s", args, errb.String())
		require.Empty(t, errb.String(), "%q", args)
		require.Contains(t, out.String(), "Usage: pynox pool [flags]", "%q", args)
		require.Contains(t, out.String(), `echo '{"id": 1, "code": "print(6 * 7)", "timeout": "5s"}' | pynox pool`)
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		var out, errb strings.Builder
		require.Equal(t, 0, run(args, strings.NewReader(""), &out, &errb), "%q", args)
		require.Contains(t, out.String(), "pynox pool [flags]")
		require.Contains(t, out.String(), "pynox version")
		require.Contains(t, out.String(), `echo '{"id": 1, "code": "print(6 * 7)"}' | pynox pool`)
	}

	// Every flag the pool defines is in its help, with the key it
	// overrides where it has one.
	var names []string
	for _, n := range keyFlags {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		require.Contains(t, poolUsage, "--"+n+"=", n)
	}
	for key, n := range keyFlags {
		if key == "config" {
			continue
		}
		parts := strings.Split(key, ".")
		table, k := strings.Join(parts[:len(parts)-1], "."), parts[len(parts)-1]
		require.Contains(t, poolUsage, "["+table+"] "+k, "--%s overrides %s", n, key)
	}
	// Each flag line of the help is a flag pool() defines, one line per
	// flag.
	for _, n := range definedPoolFlags(t) {
		require.Contains(t, poolUsage, "--"+n, n)
	}
}

// definedPoolFlags lists the flags the help shows, each checked to be one
// pool() defines (an undefined one is refused as unknown before anything
// runs).
func definedPoolFlags(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(poolUsage, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "--") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(line, "--"), "=")
		name, _, _ = strings.Cut(name, " ")
		if name == "help" {
			continue
		}
		var errb strings.Builder
		// An empty value is refused for most flags, but never as unknown.
		run([]string{"pool", "--" + name + "=\x00", "--no-such-flag"}, strings.NewReader(""), &strings.Builder{}, &errb)
		require.NotContains(t, errb.String(), "unknown flag --"+name, "the help lists --%s, which pool() does not define", name)
		out = append(out, name)
	}
	require.Len(t, out, len(keyFlags), "the help lists one line per flag")
	return out
}

// Mistakes on the command line say which flag and what it takes, exit 2
// and point at the help.
func TestPoolFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pool", "--workers=x"}, "pynox pool: --workers=x: expected a positive integer\nRun \"pynox pool --help\" for the flags.\n"},
		{[]string{"pool", "--workers=0"}, "pynox pool: --workers=0: expected a positive integer\n"},
		{[]string{"pool", "--workers=100000"}, "pynox pool: --workers=100000: expected at most 1024\n"},
		{[]string{"pool", "--bogus"}, "pynox pool: unknown flag --bogus\nRun \"pynox pool --help\" for the flags.\n"},
		{[]string{"pool", "--config"}, "pynox pool: --config needs a value, as in --config=VALUE\n"},
		{[]string{"pool", "extra"}, "pynox pool: unexpected argument \"extra\": pynox pool takes flags only\n"},
		{[]string{"pool", "--log=xml"}, "pynox pool: --log=xml: expected \"json\"\n"},
		{[]string{"frobnicate"}, "pynox: unknown command \"frobnicate\"\n"},
		{[]string{"help", "frobnicate"}, "pynox help: unknown command \"frobnicate\"\n"},
	} {
		var out, errb strings.Builder
		require.Equal(t, 2, run(tc.args, strings.NewReader(""), &out, &errb), "%q", tc.args)
		require.True(t, strings.HasPrefix(errb.String(), tc.want), "%q: got %q", tc.args, errb.String())
		require.NotContains(t, errb.String(), "Usage of", "%q", tc.args)
	}
}

// pynox version and --version print the module version and the VCS
// revision the toolchain recorded, or say honestly that none was.
func TestVersion(t *testing.T) {
	var out, errb strings.Builder
	require.Equal(t, 0, run([]string{"--version"}, strings.NewReader(""), &out, &errb))
	require.True(t, strings.HasPrefix(out.String(), "pynox "), out.String())
	// A test binary records no VCS revision.
	require.Contains(t, out.String(), "no VCS revision recorded")
	out.Reset()
	require.Equal(t, 0, run([]string{"version"}, strings.NewReader(""), &out, &errb))
	require.Contains(t, out.String(), "pynox ")

	// What a stamped build reports.
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/pynox/pynox", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123abcd"},
			{Key: "vcs.time", Value: "2026-12-01T17:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	require.Equal(t, "pynox v0.3.0, revision 0123abcd (2026-12-01T17:00:00Z) with uncommitted changes, go1.26.8", formatVersion(bi))
	bi = &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/pynox/pynox", Version: "(devel)"}}
	require.Equal(t, "pynox (devel), no VCS revision recorded (built by go run, outside a git checkout or in a git worktree, or with -buildvcs=false), go1.26.8", formatVersion(bi))

	// A built binary reports what the toolchain recorded in it: the same
	// revision `go version -m` shows, or none.
	requireSandboxOrSkip(t)
	bin := builtBinary(t) // the package's one build, with -buildvcs's default (auto)
	v, err := exec.Command(bin, "--version").Output()
	require.NoError(t, err)
	v2, err := exec.Command(bin, "version").Output()
	require.NoError(t, err)
	require.Equal(t, string(v), string(v2))
	m, err := exec.Command("go", "version", "-m", bin).Output()
	require.NoError(t, err)
	rev := ""
	for _, l := range strings.Split(string(m), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "build" && strings.HasPrefix(f[1], "vcs.revision=") {
			rev = strings.TrimPrefix(f[1], "vcs.revision=")
		}
	}
	if rev == "" {
		require.Contains(t, string(v), "no VCS revision recorded", string(v))
	} else {
		require.Contains(t, string(v), ", revision "+rev, string(v))
	}
	t.Logf("%s", v)
}

func requireSandboxOrSkip(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain to build with")
	}
}

// Start-up failures name the flag, or the file, line and key, and say
// what is expected; the library's error kind ("Spawn") never shows
// (issue 10 item 3).
func TestPoolStartErrorsNameTheSetting(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	bin := pynoxBinary(t) // skips where jobs cannot run confined
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		return p
	}
	typ := write("type.toml", "[pool]\n\nworkers = \"two\"\n")
	read := write("read.toml", "[pool]\nworkers = 1\n\n[pool.limits]\nallow_read = [\"/nonexistent\"]\n")
	pkg := write("pkg.toml", "[pool]\npackage_dirs = [\"nope\"]\n")
	pre := write("pre.toml", "[pool]\nworkers = 1\npreload = [\"no_such_module_x\"]\n")
	py := write("py.toml", "[pool]\npython = \"/nonexistent/python3\"\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config=" + typ}, typ + ":3: pool.workers: expected an integer, got a string"},
		{[]string{"--config=" + read}, read + `:5: pool.limits.allow_read: "/nonexistent": does not exist; expected an existing file or directory`},
		{[]string{"--config=" + pkg}, pkg + `:2: pool.package_dirs: "` + filepath.Join(dir, "nope") + `": does not exist; expected an existing directory`},
		{[]string{"--config=" + pre}, pre + `:3: pool.preload: "no_such_module_x": preload no_such_module_x failed: ModuleNotFoundError`},
		{[]string{"--config=" + py}, py + `:2: pool.python: "/nonexistent/python3": does not exist`},
		{[]string{"--config=" + filepath.Join(dir, "none.toml")}, "--config=" + filepath.Join(dir, "none.toml") + ": does not exist; expected a TOML configuration file"},
		{[]string{"--package-dir=/nonexistent"}, "--package-dir=/nonexistent: does not exist; expected an existing directory"},
		{[]string{"--allow-read=/nonexistent"}, "--allow-read=/nonexistent: does not exist; expected an existing file or directory"},
		{[]string{"--workers=1", "--preload=no_such_module_x"}, "--preload=no_such_module_x: preload no_such_module_x failed: ModuleNotFoundError"},
		{[]string{"--preload=a b"}, `--preload=a b: expected a module name`},
		{[]string{"--python=/nonexistent/python3"}, "--python=/nonexistent/python3: does not exist; expected the path or command name of a CPython 3 interpreter"},
		// The flag wins over the file, and the message names the flag.
		{[]string{"--config=" + read, "--allow-read=/nonexistent2"}, "--allow-read=/nonexistent2: does not exist"},
	} {
		// In a process of its own: a pool that gets as far as starting
		// confines its whole process (Config.ConfineSelf).
		var out, errb strings.Builder
		cmd := exec.Command(bin, append([]string{"pool"}, tc.args...)...)
		cmd.Dir = dir
		cmd.Stdout, cmd.Stderr = &out, &errb
		require.Error(t, cmd.Run())
		require.Equal(t, 1, cmd.ProcessState.ExitCode(), "%q: %s", tc.args, errb.String())
		require.Equal(t, "pynox pool: "+tc.want, errb.String()[:min(len(errb.String()), len("pynox pool: "+tc.want))], "%q", tc.args)
		for _, bad := range []string{"Spawn", "struct", "lstat", "invalid config"} {
			require.NotContains(t, errb.String(), bad, "%q", tc.args)
		}
		require.Empty(t, out.String(), "no ready line")
	}
}

// cgroups = "require" where the machine offers no cgroups names the flag
// or the key: the pool runs in a mount namespace without cgroup file
// systems.
func TestPoolCgroupsRequireUnmetNamesTheSetting(t *testing.T) {
	t.Parallel()
	bin := pynoxBinary(t)
	if os.Geteuid() != 0 {
		t.Skip("a mount namespace needs root here")
	}
	var points []string
	mi, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	sc := bufio.NewScanner(strings.NewReader(string(mi)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		for i, x := range f {
			if x == "-" && i+1 < len(f) && (f[i+1] == "cgroup" || f[i+1] == "cgroup2") {
				points = append(points, f[4])
			}
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	dir := t.TempDir()
	cfg := filepath.Join(dir, "cg.toml")
	require.NoError(t, os.WriteFile(cfg, []byte("[pool]\nworkers = 1\ncgroups = \"require\"\n"), 0o644))
	start := func(args ...string) string {
		script := ""
		for _, p := range points {
			script += "umount -l '" + p + "' || exit 3\n"
		}
		script += `exec "$@"`
		cmd := exec.Command("/bin/sh", append([]string{"-c", script, "sh", bin, "pool"}, args...)...)
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		require.Error(t, err)
		require.Equal(t, 1, cmd.ProcessState.ExitCode(), "%s", stderr.String())
		require.Empty(t, stdout.String())
		require.NotContains(t, stderr.String(), "Spawn")
		return stderr.String()
	}
	require.Contains(t, start("--workers=1", "--cgroups=require"), `pynox pool: --cgroups=require: per-job cgroups are unavailable`)
	require.Contains(t, start("--config="+cfg), `pynox pool: `+cfg+`:3: pool.cgroups: "require": per-job cgroups are unavailable`)
}

// The issue's own case (issue 10 item 7): from the repository root with
// --config=examples/pynox.toml, profile analysis grants examples/data;
// the job's os.listdir('data') fails and the hint says what to open.
func TestExamplesProfilePathHint(t *testing.T) {
	t.Parallel()
	pynoxBinary(t)
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	p := startPoolIn(t, root, "--config=examples/pynox.toml", "--workers=1")
	p.send(t, `{"id": 1, "profile": "analysis", "code": "import os; print(os.listdir('data'))"}`)
	r := p.next(t)
	e := r["error"].(map[string]any)
	require.Equal(t, "FileNotFoundError", e["type"], "%v", r)
	require.Contains(t, e["hint"], "relative paths resolve against the job's working directory, the pool's "+root)
	require.Contains(t, e["hint"], `did you mean "`+filepath.Join(root, "examples", "data")+`"?`)
	require.NoError(t, p.stdin.Close())
	require.NoError(t, p.cmd.Wait())
}
