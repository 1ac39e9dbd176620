package worker

import (
	"encoding/hex"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/pynox/pynox/internal/sandbox"
	"github.com/stretchr/testify/require"
)

// startTestTemplate starts a real template on Debian's python3 (the
// interpreter path must be a binary, not a launcher script).
func startTestTemplate(t testing.TB, network bool) *Template {
	t.Helper()
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock, so jobs cannot run confined: %v", err)
	}
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	tpl, err := Start(Options{Python: py, Dir: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}, Network: network})
	require.NoError(t, err)
	t.Cleanup(func() { tpl.Close() })
	return tpl
}

func runTestJob(t *testing.T, tpl *Template, job Job) *Outcome {
	t.Helper()
	c, err := tpl.Take(job.Network, nil)
	require.NoError(t, err)
	defer c.Close()
	job.Name = "<code>"
	job.Limits = Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10}
	job.Timeout = 10 * time.Second
	job.MaxOutput = 1 << 16
	return c.Run(&job, nil)
}

// TestTemplateLayerRefusedFailsClosed makes the kernel refuse the seccomp
// template layer (an invalid program) and checks that no job runs: each
// answers a setup error naming the step, before any user code.
func TestTemplateLayerRefusedFailsClosed(t *testing.T) {
	// Control: the same test template with the real policy runs code.
	ok := runTestJob(t, startTestTemplate(t, false), Job{Code: "print('ran')"})
	require.True(t, ok.Started, "setup error: %s", ok.SetupError)
	require.Equal(t, "ran\n", string(ok.Stdout))

	testPolicyHook = func(policy map[string]any) {
		progs := policy["seccomp"].(map[string]string)
		// One instruction with an opcode the kernel does not know: EINVAL.
		progs["template"] = hex.EncodeToString([]byte{0xff, 0xff, 0, 0, 0, 0, 0, 0})
	}
	defer func() { testPolicyHook = nil }()
	tpl := startTestTemplate(t, true)
	marker := filepath.Join(t.TempDir(), "marker")
	for _, network := range []bool{false, true} {
		o := runTestJob(t, tpl, Job{Code: "open(" + strconv.Quote(marker) + ", 'w').write('ran')\nprint('ran')", Network: network})
		require.False(t, o.Started, "network=%v: user code started under a template without its seccomp layer", network)
		require.Contains(t, o.SetupError, "seccomp (template layer)", "network=%v", network)
		require.Empty(t, o.Stdout)
		require.NoFileExists(t, marker)
	}
}

// TestJobLayerOnEveryKind checks, in the kernel, that spares of both kinds
// carry the job layer on top of the template layer: a job, with the
// network granted or not, cannot fork or open a pidfd, which the template
// layer alone allows.
func TestJobLayerOnEveryKind(t *testing.T) {
	tpl := startTestTemplate(t, true)
	probe := "import os\n" +
		"for name, f in (('fork', os.fork), ('pidfd_open', lambda: os.pidfd_open(os.getppid()))):\n" +
		"    try:\n" +
		"        r = f()\n" +
		"    except PermissionError:\n" +
		"        print(name, 'denied')\n" +
		"    else:\n" +
		"        if r == 0:\n" +
		"            os._exit(0)\n" +
		"        print(name, 'ALLOWED')\n"
	for _, network := range []bool{false, true} {
		o := runTestJob(t, tpl, Job{Code: probe, Network: network})
		require.True(t, o.Started, "setup error: %s", o.SetupError)
		require.Equal(t, "fork denied\npidfd_open denied\n", string(o.Stdout), "network=%v; stderr: %s", network, o.Stderr)
	}
}
