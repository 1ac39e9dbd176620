package worker

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pynox/pynox/internal/pidfd"
	"github.com/pynox/pynox/internal/testenv"
	"github.com/stretchr/testify/require"
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
	require.NotEqual(t, c.nsPid, c.Pid())
	require.Equal(t, strconv.Itoa(c.Pid())+"\t"+strconv.Itoa(c.nsPid), statusField(t, c.Pid(), "NSpid"))
	require.Equal(t, strconv.Itoa(tpl.Pid()), statusField(t, c.Pid(), "PPid"))
	got, err := pidfd.Pid(c.pidfd)
	require.NoError(t, err)
	require.Equal(t, c.Pid(), got)
}

// procState returns a process's state letter and parent pid ("" when it
// is gone).
func procState(pid int) (string, int) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, _ := strconv.Atoi(f[1])
	return f[0], ppid
}

// TestTemplateReapsOrphans lets a job fork (its seccomp job layer replaced
// by one that allows everything) so that its child is orphaned: as PID 1
// of its namespace the template inherits it, and reaps it once it exits,
// at its next event.
func TestTemplateReapsOrphans(t *testing.T) {
	// One instruction: return SECCOMP_RET_ALLOW.
	testPolicyHook = func(policy map[string]any) {
		policy["seccomp"].(map[string]string)["deny"] = hex.EncodeToString([]byte{0x06, 0, 0, 0, 0, 0, 0xff, 0x7f})
	}
	defer func() { testPolicyHook = nil }()
	tpl := startTestTemplate(t, false)
	if !tpl.Info().PIDNamespace {
		t.Skipf("this kernel or user may not create PID namespaces: %v", pidns.refused)
	}
	out := runTestJob(t, tpl, Job{Code: `import os, time
r, w = os.pipe()
if os.fork() == 0:
    for fd in (1, 2, 3, 4, r):
        os.close(fd)
    os.write(w, os.readlink('/proc/self').encode())
    os.close(w)
    time.sleep(0.3)
    os._exit(0)
os.close(w)
print(os.read(r, 64).decode())
`})
	require.True(t, out.Done, "setup error %q, stderr %s", out.SetupError, out.Stderr)
	orphan, err := strconv.Atoi(strings.TrimSpace(string(out.Stdout)))
	require.NoError(t, err, "stdout %q", out.Stdout)
	// Its parent gone, it exits and waits as a zombie of the template.
	require.Eventually(t, func() bool { s, _ := procState(orphan); return s == "Z" || s == "" }, 10*time.Second, 10*time.Millisecond)
	_, ppid := procState(orphan)
	require.Equal(t, tpl.Pid(), ppid, "the orphan's reaper is its namespace's PID 1, the template")
	// The template's next event (a fork) reaps it.
	c, err := tpl.Take(false, nil)
	require.NoError(t, err)
	c.Close()
	require.Eventually(t, func() bool { s, _ := procState(orphan); return s == "" }, 10*time.Second, 10*time.Millisecond,
		"the template left its orphan a zombie")
}

// TestPIDNamespaceFallback makes the kernel refuse the namespace (an id
// map it cannot write) and checks that "auto" falls back to an ordinary
// child, remembers it, and that "require" then refuses to start.
func TestPIDNamespaceFallback(t *testing.T) {
	testenv.Slow(t)
	startTestTemplate(t, false) // skips without Landlock or python3
	reset := func() {
		pidns.mu.Lock()
		pidns.known, pidns.ok, pidns.refused = false, false, nil
		pidns.mu.Unlock()
	}
	reset()
	t.Cleanup(func() { testPIDNSHook = nil; reset() })
	tries := 0
	testPIDNSHook = func(attr *syscall.SysProcAttr) {
		tries++
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 0}} // EINVAL
	}
	tpl := startTestTemplate(t, false)
	require.False(t, tpl.Info().PIDNamespace)
	require.Equal(t, 1, tries)
	out := runTestJob(t, tpl, Job{Code: "import os\nprint(os.getpid() == int(os.readlink('/proc/self')))"})
	require.True(t, out.Done, "setup error %q", out.SetupError)
	require.Equal(t, "True\n", string(out.Stdout))
	// Remembered: the next start does not try again.
	require.False(t, startTestTemplate(t, false).Info().PIDNamespace)
	require.Equal(t, 1, tries)
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	require.NoError(t, err)
	_, err = Start(Options{Python: py, Dir: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}, PIDNamespace: PIDNamespaceRequire})
	require.ErrorContains(t, err, "pid namespace required but unavailable")
	_, err = Start(Options{Python: py, Dir: t.TempDir(), PIDNamespace: "sometimes"})
	require.ErrorContains(t, err, `pid namespace mode "sometimes"`)
}
