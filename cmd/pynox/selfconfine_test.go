package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/testenv"
)

// TestPoolConfinesItself starts `pynox pool` with a ceiling and a preload
// that probes, in each template, what code there may do (as a job that
// escaped into the template could): the pool's own configuration file and
// anything outside the ceiling are unreadable, the read ceiling is not
// writable, and TCP is denied, since the ceiling does not grant the
// network. With [pool] confine_self = false the same probe gets through,
// which shows the probe works and what the layer stops.
func TestPoolConfinesItself(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	abi, err := sandbox.ABI()
	if err != nil {
		t.Skipf("kernel lacks Landlock: %v", err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, port, err := net.SplitHostPort(ln.Addr().String())
	require.NoError(t, err)

	for _, confine := range []bool{true, false} {
		t.Run("confine_self="+strconv.FormatBool(confine), func(t *testing.T) {
			dir := t.TempDir()
			for _, d := range []string{"etc", "data", "work", "pkg"} {
				require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o755))
			}
			cfgPath := filepath.Join(dir, "etc", "pynox.toml")
			require.NoError(t, os.WriteFile(cfgPath, []byte(`
[pool]
workers = 1
confine_self = `+strconv.FormatBool(confine)+`
preload = ["selfprobe"]
package_dirs = ["../pkg"]

[pool.limits]
allow_read = ["../data"]
allow_write = ["../work"]
`), 0o644))
			readFile := filepath.Join(dir, "data", "in.txt")
			require.NoError(t, os.WriteFile(readFile, []byte("in"), 0o644))
			src, err := os.ReadFile("../../testdata/selfprobe.py")
			require.NoError(t, err)
			q := strconv.Quote
			probe := strings.NewReplacer("@PORT@", port, "@SECRET@", q(cfgPath), "@READ_FILE@", q(readFile),
				"@READ_DIR@", q(filepath.Join(dir, "data")), "@WRITE_DIR@", q(filepath.Join(dir, "work"))).Replace(string(src))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "pkg", "selfprobe.py"), []byte(probe), 0o644))

			c, _ := startClientIn(t, dir, "--config="+cfgPath)
			ready := c.Ready()
			sc := ready.SelfConfinement
			res := runJob(t, c, pynox.Job{Code: "import json, selfprobe\nprint(json.dumps(selfprobe.results))"})
			require.Equal(t, 0, res.Exit, "result: %+v", res)
			var got map[string]string
			require.NoError(t, json.Unmarshal([]byte(res.Stdout), &got))

			if !confine {
				require.Equal(t, 0, sc.Landlock)
				require.NotEmpty(t, sc.Reason)
				require.Equal(t, "ok", got["read_outside"], "the probe reads the config file without the layer")
				require.Equal(t, "ok", got["write_read_ceiling"])
				require.Equal(t, "ok", got["tcp_connect"])
				return
			}
			require.Equal(t, min(abi, 11), sc.Landlock, "ready event: %+v", ready)
			want := map[string]string{
				"read_outside": "PermissionError", "list_outside": "PermissionError",
				"read_ceiling": "ok", "write_read_ceiling": "PermissionError", "write_write_ceiling": "ok",
				"tcp_connect": "ok",
			}
			if abi >= 4 {
				require.Equal(t, "deny", sc.TCP)
				want["tcp_connect"] = "PermissionError"
			}
			require.Equal(t, want, got)
		})
	}
}
