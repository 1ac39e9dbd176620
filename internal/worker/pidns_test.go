package worker

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// statusField returns a field of /proc/<pid>/status ("" when absent).
func statusField(t *testing.T, pid int, name string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestTemplatePIDNamespace checks that a template is PID 1 of a namespace
// of its own, and that the host knows it and its spares by their pids in
// the host's namespace.
func TestTemplatePIDNamespace(t *testing.T) {
	tpl := startTestTemplate(t, false)
	if !tpl.Info().PIDNamespace {
		t.Skipf("this kernel or user may not create PID namespaces: %v", pidns.refused)
	}
	if statusField(t, os.Getpid(), "NSpid") == "" {
		t.Skip("this kernel's /proc/<pid>/status has no NSpid line (Linux < 4.1)")
	}
	require.Equal(t, strconv.Itoa(tpl.Pid())+"\t1", statusField(t, tpl.Pid(), "NSpid"),
		"the template is known by its host pid and is PID 1 of its own namespace")
	c, err := tpl.Take(false, nil)
	require.NoError(t, err)
	defer c.Close()
	require.NotEqual(t, c.nsPid, c.Pid)
	require.Equal(t, strconv.Itoa(c.Pid)+"\t"+strconv.Itoa(c.nsPid), statusField(t, c.Pid, "NSpid"))
	require.Equal(t, strconv.Itoa(tpl.Pid()), statusField(t, c.Pid, "PPid"))
	got, err := PidOfPidfd(c.pidfd)
	require.NoError(t, err)
	require.Equal(t, c.Pid, got)
}

func TestPidOfPidfd(t *testing.T) {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	defer unix.Close(fd)
	pid, err := PidOfPidfd(fd)
	require.NoError(t, err)
	require.Equal(t, os.Getpid(), pid)
	_, err = PidOfPidfd(0) // not a pidfd
	require.Error(t, err)
}
