package pynox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// refusalChildEnv marks the test binary run inside a child user
// namespace by TestMountRefusedWithoutUserNamespaces.
const refusalChildEnv = "PYNOX_TEST_NS_REFUSAL_CHILD"

// TestMountRefusedWithoutUserNamespaces starts a real pool where user
// namespaces are unavailable for real: the test binary runs again in a
// child user namespace (uid and gid 0 mapped to themselves) that sets its
// own user.max_user_namespaces to 0, so that no process in it can make
// another. There the pool reports what its mounts lack (the probe) and
// refuses a virtual path and an overlay with a SandboxSetupError naming
// the sysctl, before any code runs; a mount at the host path still works.
func TestMountRefusedWithoutUserNamespaces(t *testing.T) {
	if os.Getenv(refusalChildEnv) != "" {
		mountRefusalChild(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("mapping uid 0 into a child user namespace needs root")
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("user namespaces are disabled on this machine already: no child user namespace to test in")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestMountRefusedWithoutUserNamespaces$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), refusalChildEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
	}
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	require.NoError(t, err, "the test in the child user namespace failed")
	require.Contains(t, string(out), "--- PASS: TestMountRefusedWithoutUserNamespaces", "the child ran no test")
	require.NotContains(t, string(out), "--- SKIP", "the child skipped the test")
}

// mountRefusalChild is TestMountRefusedWithoutUserNamespaces inside the
// child user namespace.
func mountRefusalChild(t *testing.T) {
	require.NoError(t, os.WriteFile("/proc/sys/user/max_user_namespaces", []byte("0"), 0),
		"setting this user namespace's user.max_user_namespaces")
	b, err := os.ReadFile("/proc/sys/user/max_user_namespaces")
	require.NoError(t, err)
	require.Equal(t, "0", strings.TrimSpace(string(b)))
	dir := os.Getenv(refusalChildEnv)
	data := filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("hello"), 0o644))
	marker := filepath.Join(dir, "ran")
	p, err := New(Config{Workers: 1, Dir: dir, Cgroups: "off", Limits: Limits{AllowWrite: []string{dir}}})
	require.NoError(t, err)
	defer p.Close()
	ms := p.Mounts()
	require.False(t, ms.VirtualPaths)
	require.NotContains(t, ms.Modes, Overlay)
	require.Contains(t, ms.Missing, "user namespaces are disabled (user.max_user_namespaces = 0)")
	code := `open(` + pyQuote(marker) + `, "w").write("ran")`
	for name, m := range map[string]MountSpec{
		"virtual path": {HostPath: data, Path: "/data"},
		"overlay":      {HostPath: data, Path: "/work", Mode: Overlay},
	} {
		res := run(t, p, Job{Mounts: []MountSpec{m}, Code: code})
		require.NotNil(t, res.Error, name)
		require.Equal(t, "SandboxSetupError", res.Error.Type, name)
		require.Contains(t, res.Error.Message, "user.max_user_namespaces = 0", name)
		require.Contains(t, res.Error.Message, "no code ran", name)
		require.NoFileExists(t, marker, name)
	}
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data}}, Code: `print(open(` + pyQuote(filepath.Join(data, "f.txt")) + `).read())`})
	requireOK(t, res)
	require.Equal(t, "hello\n", res.Stdout)
}
