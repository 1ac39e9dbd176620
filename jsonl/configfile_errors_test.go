package jsonl

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// A value of the wrong type names the file, the line, the key and what is
// expected, in TOML's words; Go's struct types never show (issue 10 item
// 3). A duration written as a bare number is refused, not taken for
// nanoseconds.
func TestLoadConfigTypeErrorsSayWhatIsExpected(t *testing.T) {
	tests := []struct{ content, want string }{
		{"[pool]\n\nworkers = \"two\"\n", `:3: pool.workers: expected an integer, got a string`},
		{"[pool]\nworkers = [1]\n", `:2: pool.workers: expected an integer, got an array`},
		{"[pool.limits]\ntimeout = 5\n", `:2: pool.limits.timeout: expected a duration string such as "5s" or "500ms", got an integer`},
		{"[pool]\nsession_idle = 1.5\n", `:2: pool.session_idle: expected a duration string such as "5s" or "500ms", got a float`},
		{"[pool.limits]\nmemory = true\n", `:2: pool.limits.memory: expected a size: a number of bytes or a string such as "512m", got a boolean`},
		{"[pool.limits]\nallow_read = \"data\"\n", `:2: pool.limits.allow_read: expected an array of strings, got a string`},
		{"[pool.limits]\nallow_read = [\"a\", 3]\n", `:2: pool.limits.allow_read: expected an array of strings, got an array holding an integer`},
		{"[pool.limits]\nallow_network = \"yes\"\n", `:2: pool.limits.allow_network: expected true or false, got a string`},
		{"[pool]\nlimits = 3\n", `:2: pool.limits: expected a table, got an integer`},
		// The same key name in two tables: the line is the right table's.
		{"[pool.limits]\nallow_read = [\"x\"]\n\n[profiles.a]\nallow_read = \"data\"\n", `:5: profiles.a.allow_read: expected an array of strings, got a string`},
		{"[profiles.a]\nenv = { MODE = 1 }\n", `:2: profiles.a.env.MODE: expected a string, got an integer`},
		{"[profiles.a]\ntimeout = 5\n", `:2: profiles.a.timeout: expected a duration string`},
		{"profiles = 1\n", `:1: profiles: expected a table of tables, got an integer`},
		{"[pool.limits]\ntimeout = \"5 parsecs\"\n", `:2: pool.limits.timeout: invalid duration "5 parsecs": want a number with a unit`},
		{"[pool]\nmax_sessions = 0\n", `:2: pool.max_sessions: expected a positive integer, got 0`},
		{"[pool]\npid_namespace = \"maybe\"\n", `:2: pool.pid_namespace: expected "auto", "require" or "off", got "maybe"`},
	}
	for i, tc := range tests {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			path := writeFile(t, filepath.Join(t.TempDir(), "pynox.toml"), tc.content)
			_, err := LoadConfig(path)
			require.Error(t, err)
			require.Contains(t, err.Error(), path+tc.want)
			msg := err.Error()[len(path):]
			require.NotContains(t, msg, "struct")
			require.NotContains(t, msg, "pynox.")
			require.NotContains(t, msg, "cannot decode")
		})
	}

	// A missing file names it, without Go's operation names.
	_, err := LoadConfig(filepath.Join(t.TempDir(), "none.toml"))
	var ce *pynox.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "config", ce.Key)
	require.Contains(t, ce.Problem, "does not exist; expected a TOML configuration file")
	require.NotContains(t, err.Error(), "lstat")
}

// File.Line finds the line that sets a key, or its table's.
func TestFileLine(t *testing.T) {
	path := writeFile(t, filepath.Join(t.TempDir(), "pynox.toml"),
		"# comment\n[pool]\nworkers = 1\n\n[pool.limits]\nallow_read = [\n  \"a\",\n]\n[profiles.x]\nallow_read = [\"b\"]\nenv = { A = \"1\" }\n")
	for _, d := range []string{"a", "b"} {
		require.NoError(t, os.MkdirAll(filepath.Join(filepath.Dir(path), d), 0o755))
	}
	f, err := LoadConfig(path)
	require.NoError(t, err)
	for key, line := range map[string]int{
		"pool": 2, "pool.workers": 3, "pool.limits.allow_read": 6, "pool.limits.timeout": 5,
		"profiles.x.allow_read": 10, "profiles.x.env.A": 11, "pool.python": 2, "config": 0,
	} {
		require.Equal(t, line, f.Line(key), key)
	}
	require.Equal(t, 0, (*File)(nil).Line("pool"))
}
