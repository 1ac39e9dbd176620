package jsonl

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc")
	path := writeFile(t, filepath.Join(etc, "pynox.toml"), `
[pool]
workers = 4
preload = ["json"]
package_dirs = ["site"]
max_sessions = 32
session_idle = "15m"
log = "json"
python = "/usr/bin/python3"
cgroups = "require"

[pool.limits]
threads = 32
allow_read = ["../data", "/srv/agent/data"]
allow_write = ["../work"]
allow_network = false
timeout = "30s"
memory = "1g"
max_output = 1048576
max_file_size = "256m"

[profiles.analysis]
allow_read = ["../data"]
allow_write = ["../work"]
env = { MODE = "analysis" }

[profiles.fetch]
allow_network = true
timeout = "10s"
`)
	f, err := LoadConfig(path)
	require.NoError(t, err)
	c := f.Config
	require.Equal(t, path, f.Path)
	require.Equal(t, path, c.Source)
	require.Equal(t, "json", f.Log)
	require.Equal(t, 4, c.Workers)
	require.Equal(t, []string{"json"}, c.Preload)
	require.Equal(t, []string{filepath.Join(etc, "site")}, c.PackageDirs)
	require.Equal(t, 32, c.MaxSessions)
	require.Equal(t, 15*time.Minute, c.SessionIdle)
	require.Equal(t, "/usr/bin/python3", c.Python)
	require.Equal(t, "require", c.Cgroups)
	require.Equal(t, 32, c.Limits.Threads)
	require.Equal(t, []string{filepath.Join(dir, "data"), "/srv/agent/data"}, c.Limits.AllowRead)
	require.Equal(t, []string{filepath.Join(dir, "work")}, c.Limits.AllowWrite)
	require.Equal(t, 30*time.Second, c.Limits.Timeout)
	require.Equal(t, int64(1<<30), c.Limits.Memory)
	require.Equal(t, 1<<20, c.Limits.MaxOutput)
	require.Equal(t, int64(256<<20), c.Limits.MaxFileSize)
	require.Equal(t, []string{"analysis", "fetch"}, c.ProfileNames())
	require.Equal(t, []string{filepath.Join(dir, "data")}, c.Profiles["analysis"].AllowRead)
	require.Equal(t, "analysis", c.Profiles["analysis"].Env["MODE"])
	require.True(t, c.Profiles["fetch"].AllowNetwork)
	require.Equal(t, 10*time.Second, c.Profiles["fetch"].Timeout)
}

func TestLoadConfigRefusesBadFiles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		content string
		want    []string
	}{
		{"unknown key in limits", "[pool]\nworkers = 2\n\n[pool.limits]\nalow_read = [\"x\"]\n", []string{":5:", "unknown key pool.limits.alow_read"}},
		{"unknown section", "[pools]\nworkers = 2\n", []string{"unknown key pools"}},
		{"unknown profile key", "[profiles.a]\nallow_reed = []\n", []string{":2:", "profiles.a.allow_reed"}},
		{"wrong type", "[pool]\nworkers = \"four\"\n", []string{":2:", "pool.workers"}},
		{"bool as string", "[pool.limits]\nallow_network = \"yes\"\n", []string{":2:", "allow_network"}},
		{"bad duration", "[pool.limits]\ntimeout = \"soon\"\n", []string{"invalid duration"}},
		{"bad size", "[pool.limits]\nmemory = \"lots\"\n", []string{"invalid size"}},
		{"negative workers", "[pool]\nworkers = -1\n", []string{":2: pool.workers: expected a positive integer, got -1"}},
		{"too many workers", "[pool]\nworkers = 100000\n", []string{":2: pool.workers: expected at most 1024, got 100000"}},
		{"bad log", "[pool]\nlog = \"xml\"\n", []string{`:2: pool.log: expected "json" or "", got "xml"`}},
		{"bad cgroups", "[pool]\ncgroups = \"yes\"\n", []string{`:2: pool.cgroups: expected "auto", "require" or "off", got "yes"`}},
		{"zero threads", "[pool.limits]\nthreads = 0\n", []string{":2: pool.limits.threads: expected a positive integer, got 0"}},
		{"not toml", "[pool\n", []string{"pynox.toml"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, filepath.Join(t.TempDir(), "pynox.toml"), tc.content)
			_, err := LoadConfig(path)
			require.Error(t, err)
			require.Contains(t, err.Error(), path)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestConfigBeneathOwnWriteGrantRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := writeFile(t, filepath.Join(dir, "pynox.toml"), "[pool.limits]\nallow_write = [\".\"]\n")
	_, err := LoadConfig(path)
	require.ErrorContains(t, err, "beneath its own write ceiling")

	// A write ceiling set elsewhere (the command line's --allow-write)
	// that covers the file is refused by New, which says how to fix it.
	requireSandbox(t)
	path = writeFile(t, filepath.Join(dir, "sub", "pynox.toml"), "[pool]\nworkers = 1\n")
	f, err := LoadConfig(path)
	require.NoError(t, err)
	f.Config.Dir = dir
	f.Config.Limits.AllowWrite = []string{dir}
	_, err = pynox.New(f.Config)
	require.ErrorContains(t, err, "beneath the write ceiling")
	require.ErrorContains(t, err, "--allow-write")
}
