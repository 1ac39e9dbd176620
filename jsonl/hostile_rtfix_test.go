package jsonl

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// An empty path is refused in every ceiling and grant list of a
// configuration file, naming the table and key (the root package's
// TestHostileRTFixEmptyPaths checks Config and requests).
func TestHostileRTFixEmptyPathsInConfigFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ toml, field string }{
		{"[pool.limits]\nallow_write = [\"\"]\n", "[pool.limits] allow_write"},
		{"[pool.limits]\nallow_read = [\"data\", \"\"]\n", "[pool.limits] allow_read"},
		{"[pool]\npackage_dirs = [\"\"]\n", "[pool] package_dirs"},
		{"[profiles.etl]\nallow_write = [\"\"]\n", "[profiles.etl] allow_write"},
	} {
		path := filepath.Join(dir, "pool.toml")
		require.NoError(t, os.WriteFile(path, []byte(tc.toml), 0o644))
		_, err := LoadConfig(path)
		require.Error(t, err, tc.toml)
		require.Contains(t, err.Error(), tc.field)
		require.Contains(t, err.Error(), "empty path")
	}
}
