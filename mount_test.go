package pynox

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Each mode against real python3 under the real sandbox: a read-only
// mount reads and refuses writes, a read-write one writes through to the
// host; both are reported in the policy; a relative host path resolves
// against the pool's directory.
func TestMountModes(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	dir := p.Config().Dir
	ro := filepath.Join(dir, "data")
	rw := filepath.Join(dir, "out")
	require.NoError(t, os.Mkdir(ro, 0o755))
	require.NoError(t, os.Mkdir(rw, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ro, "in.txt"), []byte("input"), 0o644))
	res := run(t, p, Job{
		Mounts: []MountSpec{{HostPath: "data"}, {HostPath: rw, Path: rw, Mode: ReadWrite}},
		Code: `
import errno
print(open(` + pyQuote(ro+"/in.txt") + `).read())
for what, f in [("write", lambda: open(` + pyQuote(ro+"/new") + `, "w")),
                ("append", lambda: open(` + pyQuote(ro+"/in.txt") + `, "a")),
                ("remove", lambda: __import__("os").remove(` + pyQuote(ro+"/in.txt") + `))]:
    try:
        f()
        print(what, "allowed")
    except PermissionError as e:
        print(what, "denied")
open(` + pyQuote(rw+"/result.txt") + `, "w").write("written")
`})
	requireOK(t, res)
	require.Equal(t, "input\nwrite denied\nappend denied\nremove denied\n", res.Stdout)
	b, err := os.ReadFile(filepath.Join(rw, "result.txt"))
	require.NoError(t, err)
	require.Equal(t, "written", string(b))
	require.Equal(t, []MountSpec{{HostPath: ro, Path: ro, Mode: ReadOnly}, {HostPath: rw, Path: rw, Mode: ReadWrite}}, res.Policy.Mounts)
	require.Contains(t, res.Policy.AllowRead, ro)
	require.Contains(t, res.Policy.AllowWrite, rw)
	require.NoFileExists(t, filepath.Join(ro, "new"))
}

// Mounts are checked against the ceiling exactly as grants, and what the
// pool cannot enforce (a virtual path, an overlay, a byte limit) is a
// SandboxSetupError that names what is missing, before anything runs.
func TestMountRefusals(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	dir := p.Config().Dir
	data := filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	noWrite := newTestPool(t, Config{Workers: 1, Limits: Limits{AllowWrite: []string{}}})
	outside := t.TempDir()
	for _, tc := range []struct {
		name   string
		pool   *Pool
		mounts []MountSpec
		typ    string
		msg    string
	}{
		{"empty host", p, []MountSpec{{}}, "RequestError", "mounts[0].host: empty path"},
		{"unknown mode", p, []MountSpec{{HostPath: data, Mode: "rx"}}, "RequestError", `mounts[0].mode: unknown mode "rx"; expected "ro", "rw" or "overlay"`},
		{"relative path", p, []MountSpec{{HostPath: data, Path: "data"}}, "RequestError", `mounts[0].path: "data" is not an absolute path`},
		{"missing host", p, []MountSpec{{HostPath: "nope"}}, "RequestError", "mounts[0].host: nope: no such file or directory"},
		{"ro outside the ceiling", p, []MountSpec{{HostPath: outside}}, "RequestError", "is outside the pool's ceiling"},
		{"rw without a write ceiling", noWrite, []MountSpec{{HostPath: noWrite.Config().Dir, Mode: ReadWrite}}, "RequestError", "mounts[0]: a read-write mount is a write grant"},
		{"rw outside the ceiling", p, []MountSpec{{HostPath: outside, Mode: ReadWrite}}, "RequestError", "is outside the pool's ceiling"},
		{"limit on ro", p, []MountSpec{{HostPath: data, WriteBytesLimit: 1 << 20}}, "RequestError", "a read-only mount takes no write limit"},
		{"negative limit", p, []MountSpec{{HostPath: data, Mode: ReadWrite, WriteBytesLimit: -1}}, "RequestError", "must not be negative"},
		{"byte limit on rw", p, []MountSpec{{HostPath: data, Mode: ReadWrite, WriteBytesLimit: 1 << 20}}, "SandboxSetupError", "mounts[0].write_bytes_limit: a read-write mount's writes go to the host directory itself, and bounding them would take file system project quotas"},
		{"second of two", p, []MountSpec{{HostPath: data}, {HostPath: data, Mode: ReadWrite, WriteBytesLimit: 1}}, "SandboxSetupError", "mounts[1].write_bytes_limit"},
		{"path /", p, []MountSpec{{HostPath: data, Path: "/"}}, "RequestError", "mounts[0].path: a mount cannot replace /"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, tc.pool, Job{Code: "print('ran')", Mounts: tc.mounts})
			requireErrorType(t, res, tc.typ)
			require.Contains(t, res.Error.Message, tc.msg)
			require.Empty(t, res.Stdout)
			require.Equal(t, -1, res.Exit)
			require.Nil(t, res.Policy)
		})
	}
	requireScratchEmpty(t, p, "a refused request left its scratch behind")
	ms := p.Mounts()
	require.Equal(t, p.scratch.path, ms.Scratch)
	require.NotContains(t, ms.Missing, "confine_self", "this pool is not confined")
	if len(p.nsObstacles()) == 0 {
		require.Equal(t, []MountMode{ReadOnly, ReadWrite, Overlay}, ms.Modes)
		require.True(t, ms.VirtualPaths)
		require.True(t, ms.WriteBytesLimit)
		require.Contains(t, ms.Missing, "project quotas")
	} else {
		require.Equal(t, []MountMode{ReadOnly, ReadWrite}, ms.Modes)
		require.Contains(t, ms.Missing, "mount namespace")
	}
}

// A session's mounts are fixed at its start and hold for every step.
func TestMountSession(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	data := filepath.Join(p.Config().Dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f"), []byte("x"), 0o644))
	c, err := p.Checkout(t.Context(), Job{Mounts: []MountSpec{{HostPath: data}}})
	require.NoError(t, err)
	defer c.Finish(t.Context())
	for range 2 {
		ev, err := c.Feed(t.Context(), Step{Code: "print(open(" + pyQuote(data+"/f") + ").read())\ntry:\n    open(" + pyQuote(data+"/g") + ", 'w')\nexcept PermissionError:\n    print('denied')"})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		require.Equal(t, "x\ndenied\n", ev.Result.Stdout)
		require.Len(t, ev.Result.Policy.Mounts, 1)
	}
}
