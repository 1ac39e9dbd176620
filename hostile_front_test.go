package pynox

// Probes of the pool's front door (issue 9, items 5, 7 and 11): what a
// client's request line may say, what a job's write grants may cover, and
// what a hint may reveal.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Request keys are matched exactly: encoding/json alone would take "CODE"
// or "ſession" (a long s folds to s) for a field and keep the last of two
// "code" keys, so a front end vetting lines by exact key could be
// bypassed. Each line is refused with a RequestError that names the key,
// nothing runs, and the pool keeps serving.
func TestHostileFrontKeyFolding(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ran := "print('" + "folded key ran" + "')"
	cases := []struct {
		id, line, want string
	}{
		{"upper", `{"id": "upper", "CODE": "` + ran + `"}`, `unknown field "CODE": field names are exact and case-sensitive; did you mean "code"?`},
		{"mixed", `{"id": "mixed", "code": "` + ran + `", "ALLOW_WRITE": ["."]}`, `unknown field "ALLOW_WRITE"`},
		{"longs", `{"id": "longs", "ſession": "nb", "code": "` + ran + `"}`, `unknown field "ſession": field names are exact and case-sensitive; did you mean "session"?`},
		{"dup", `{"id": "dup", "code": "print('vetted')", "code": "` + ran + `"}`, `key "code" appears twice`},
		{"escdup", `{"id": "escdup", "code": "print('vetted')", "cod\u0065": "` + ran + `"}`, `key "code" appears twice`},
		{"envdup", `{"id": "envdup", "code": "` + ran + `", "env": {"A": "1", "A": "2"}}`, `env: key "A" appears twice`},
		{"reply", `{"id": "reply", "reply": {"CALL_ID": 1, "result": 1}}`, `reply: unknown field "CALL_ID"`},
		{"replydup", `{"id": "replydup", "reply": {"call_id": 1, "call_id": 2, "result": 1}}`, `reply: key "call_id" appears twice`},
		{"resultdup", `{"id": "resultdup", "reply": {"call_id": 1, "result": [{"a": 1, "a": 2}]}}`, `reply.result[]: key "a" appears twice`},
		{"session", `{"id": "session", "session": "nb", "Code": "` + ran + `"}`, `unknown field "Code"`},
	}
	var in []string
	for _, c := range cases {
		in = append(in, c.line)
	}
	// A duplicated id is echoed as null: the answer must not pick one.
	in = append(in, `{"id": "first", "id": "second", "code": "`+ran+`"}`)
	in = append(in, `{"id": "after", "code": "print('still serving')"}`)
	lines := serveLines(t, p, strings.Join(in, "\n")+"\n")
	require.Len(t, lines, 1+len(in), "one answer per line")
	got := map[string]map[string]any{}
	for _, l := range lines[1:] {
		got[fmt.Sprint(l["id"])] = l
		require.NotContains(t, l["stdout"], "folded key ran", "%v", l)
	}
	for _, c := range cases {
		require.Equal(t, "RequestError", errType(got[c.id]), c.id)
		require.Contains(t, errMessage(got[c.id]), c.want, c.id)
	}
	require.Equal(t, "RequestError", errType(got["<nil>"]))
	require.Contains(t, errMessage(got["<nil>"]), `key "id" appears twice`)
	require.Equal(t, "still serving\n", got["after"]["stdout"])
}

// The decoder's exact check leaves well-formed requests alone, keys
// written with escapes included, and every field name it accepts is one
// the request types declare.
func TestDecodeRequestExactKeys(t *testing.T) {
	t.Parallel()
	req, err := decodeRequest([]byte(`{"id": 1, "c\u006fde": "print(1)", "env": {"ſ": "1", "s": "2", "S": "3"}, "reply": null}`))
	require.Nil(t, err)
	require.Equal(t, "print(1)", req.Code)
	require.Equal(t, map[string]string{"ſ": "1", "s": "2", "S": "3"}, req.Env, "map keys differing only in case are distinct")
	require.Contains(t, requestSchema.fields, "code")
	require.Contains(t, requestSchema.fields, "session")
	require.Equal(t, []string{"call_id", "error", "result"}, requestSchema.fields["reply"].names())
	require.NotContains(t, requestSchema.fields, "Host", "Job.Host is not part of the protocol")

	// Many keys (past the short list) are still checked for repeats.
	var env []string
	for i := range 40 {
		env = append(env, fmt.Sprintf("%q: \"v\"", fmt.Sprint("K", i)))
	}
	env = append(env, `"K7": "again"`)
	_, err = decodeRequest([]byte(`{"code": "1", "env": {` + strings.Join(env, ", ") + `}}`))
	require.NotNil(t, err)
	require.Contains(t, err.Message, `env: key "K7" appears twice`)

	// Syntax errors keep the decoder's own message.
	_, err = decodeRequest([]byte(`{"code": "1", "env": {"A": }`))
	require.NotNil(t, err)
	require.Contains(t, err.Message, "not valid JSON at column 28")
	// A stray closing brace was taken for the end of input by dec.More.
	_, err = decodeRequest([]byte(`{"code": "1"}}`))
	require.NotNil(t, err)
	require.Contains(t, err.Message, "trailing data")
	b, merr := json.Marshal(request{Job: Job{ID: "x", Code: "1", Env: map[string]string{"A": "b"}}})
	require.NoError(t, merr)
	_, err = decodeRequest(b)
	require.Nil(t, err, "%s", b)
}

// Hints are built from names alone. The pool runs with more rights than
// its jobs (often root's): a hint that looked at the filesystem told a job
// whether a file exists in a directory the job may not search, and a job
// that reported a 2,000-deep chain of directories ending in a symlink
// loop held its worker while the pool resolved it (34 CPU-s in the
// review). Now the hint for a file in an unsearchable directory is the
// same whether the file exists or not, and the deep chain's job answers
// like any other.
func TestHostileFrontHintsLexical(t *testing.T) {
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
		f, err := LoadConfig(cfgPath)
		require.NoError(t, err)
		f.Config.Dir, f.Config.Python = dir, testPython()
		p, err := New(f.Config)
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

// The configuration file is read as exactly as request lines: go-toml,
// like encoding/json, folds case when decoding into a struct, so
// "WORKERS" or "[POOL]" passed for a setting — against LoadConfig's
// promise that no typo in a security setting passes silently.
func TestHostileFrontConfigKeysExact(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ content, want string }{
		{"[pool]\nWORKERS = 3\n", ":2: unknown key pool.WORKERS: keys are exact and case-sensitive; did you mean workers?"},
		{"[POOL]\nworkers = 3\n", ":1: unknown key POOL: keys are exact and case-sensitive; did you mean pool?"},
		{"[pool.limits]\nALLOW_WRITE = [\"/nonexistent\"]\n", ":2: unknown key pool.limits.ALLOW_WRITE"},
		{"[profiles.Mixed]\ntimeout = \"1s\"\n[profiles.x]\nTimeout = \"2s\"\n", ":4: unknown key profiles.x.Timeout"},
	} {
		path := writeFile(t, filepath.Join(t.TempDir(), "pynox.toml"), tc.content)
		_, err := LoadConfig(path)
		require.Error(t, err, tc.content)
		require.Contains(t, err.Error(), path+tc.want)
	}
	// Profile names are the operator's own: any case is fine.
	path := writeFile(t, filepath.Join(t.TempDir(), "pynox.toml"), "[profiles.Mixed]\ntimeout = \"1s\"\n")
	f, err := LoadConfig(path)
	require.NoError(t, err)
	require.Equal(t, []string{"Mixed"}, f.Config.ProfileNames())
}
