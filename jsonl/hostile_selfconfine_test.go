package jsonl

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConfineSelfKey checks [pool] confine_self: true unless the file says
// false, kept for the command (File.ConfineSelf) and never switched on in
// the Config a program embedding the library gets; a value of the wrong
// type names the key.
func TestConfineSelfKey(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		body string
		want bool
		err  string
	}{
		{"[pool]\n", true, ""},
		{"[pool]\nconfine_self = false\n", false, ""},
		{"[pool]\nconfine_self = true\n", true, ""},
		{"[pool]\nconfine_self = \"no\"\n", false, "confine_self"},
	} {
		path := filepath.Join(dir, "pynox.toml")
		require.NoError(t, os.WriteFile(path, []byte(c.body+"[pool.limits]\nallow_write = []\n"), 0o644))
		f, err := LoadConfig(path)
		if c.err != "" {
			require.ErrorContains(t, err, c.err)
			continue
		}
		require.NoError(t, err, c.body)
		require.Equal(t, c.want, f.ConfineSelf, c.body)
		require.False(t, f.Config.ConfineSelf, "LoadConfig never confines an embedding program")
	}
}
