package jsonl

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPinCPUsKey checks [pool] pin_cpus: true unless the file says false,
// kept for the command (File.PinCPUs) and never switched on in the
// Config a program embedding the library gets; a value of the wrong type
// names the key.
func TestPinCPUsKey(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		body string
		want bool
		err  string
	}{
		{"[pool]\n", true, ""},
		{"[pool]\npin_cpus = false\n", false, ""},
		{"[pool]\npin_cpus = true\n", true, ""},
		{"[pool]\npin_cpus = 1\n", false, "pool.pin_cpus"},
	} {
		path := filepath.Join(dir, "pynox.toml")
		require.NoError(t, os.WriteFile(path, []byte(c.body), 0o644))
		f, err := LoadConfig(path)
		if c.err != "" {
			require.ErrorContains(t, err, c.err)
			continue
		}
		require.NoError(t, err, c.body)
		require.Equal(t, c.want, f.PinCPUs, c.body)
		require.False(t, f.Config.PinCPUs, "LoadConfig never pins for an embedding program")
	}
}
