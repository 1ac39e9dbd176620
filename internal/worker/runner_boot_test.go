package worker

import (
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRunnerBoot checks how a template gets its program (template.go:
// runnerBoot): the runner's source comes on the template's standard input,
// not on its command line (where the interpreter would keep copies of it,
// and its syntax tree, for the template's whole life), and descriptor 0
// is /dev/null once the runner runs. A job still runs.
func TestRunnerBoot(t *testing.T) {
	tpl := startTestTemplate(t, false)
	pid := strconv.Itoa(tpl.Pid())
	cmdline, err := os.ReadFile("/proc/" + pid + "/cmdline")
	require.NoError(t, err)
	require.NotContains(t, string(cmdline), "class Spare", "the runner's source is on the template's command line")
	require.Contains(t, string(cmdline), runnerBoot)
	stdin, err := os.Readlink("/proc/" + pid + "/fd/0")
	require.NoError(t, err)
	require.Equal(t, "/dev/null", stdin, "the template's descriptor 0")
	o := runTestJob(t, tpl, Job{Code: "import sys\nprint(len(sys.argv), sys.stdin.read() == '')"})
	require.Equal(t, "1 True\n", string(o.Stdout), "stderr %s", o.Stderr)
	t.Logf("template: %d kB of anonymous memory (RssAnon)", anonMemory(tpl.Pid())>>10)
}
