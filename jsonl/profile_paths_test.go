package jsonl

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// A configuration file's paths resolve against its directory, a job's
// against the pool's working directory (issue 10 item 7): with the file in
// etc/, profile "analysis" granting "data" grants etc/data, and the job's
// os.listdir('data') fails. The failure's hint names the working
// directory and the grant's absolute path.
func TestProfilePathsHintWhereTheyResolve(t *testing.T) {
	requireSandbox(t)
	root := t.TempDir()
	etc := filepath.Join(root, "etc")
	require.NoError(t, os.MkdirAll(filepath.Join(etc, "data"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(etc, "data", "orders.csv"), []byte("id\n"), 0o644))
	path := writeFile(t, filepath.Join(etc, "pynox.toml"), "[pool]\nworkers = 1\n\n[pool.limits]\nallow_read = [\"data\"]\n\n[profiles.analysis]\nallow_read = [\"data\"]\n")
	f, err := LoadConfig(path)
	require.NoError(t, err)
	f.Config.Dir = root
	f.Config.Python = testPython()
	p, err := pynox.New(f.Config)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })

	r := run(t, p, pynox.Job{Code: "import os; print(os.listdir('data'))", Profile: "analysis"})
	requireErrorType(t, r, "FileNotFoundError")
	require.Contains(t, r.Error.Hint, "relative paths resolve against the job's working directory, the pool's "+root)
	require.Contains(t, r.Error.Hint, `did you mean "`+filepath.Join(etc, "data")+`"?`)
	require.Contains(t, r.Error.Hint, "resolve against the file's directory")

	// The path the hint suggests works.
	r = run(t, p, pynox.Job{Code: "import os; print(os.listdir(" + quotePy(filepath.Join(etc, "data")) + "))", Profile: "analysis"})
	requireOK(t, r)
	require.Equal(t, "['orders.csv']\n", r.Stdout)

	// A relative path that matches no grant still says where it resolved.
	r = run(t, p, pynox.Job{Code: "open('nothing/here')", Profile: "analysis"})
	requireErrorType(t, r, "FileNotFoundError")
	require.Contains(t, r.Error.Hint, `"nothing/here" is `+filepath.Join(root, "nothing", "here"))
	require.Contains(t, r.Error.Hint, "the job's grants are "+filepath.Join(etc, "data"))
}

func quotePy(s string) string { return "'" + s + "'" }
