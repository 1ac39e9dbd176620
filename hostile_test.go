package pynox

// Adversarial suite (issue 4): every probe is real Python run as a real job
// under the real sandbox, trying to get out. Each probe asserts the specific
// denial (error type, errno, exit) and, where the probe targets a file, that
// nothing was read or written, checked from the host side. After each group
// the pool must still serve a normal job.
//
// Probes that exercise several system calls in one job print one line
//
//	PROBES {"name": "EPERM", "other": "ok", ...}
//
// naming, per probe, the errno symbol the call failed with, "ok" when it
// succeeded, or the exception class; the Go side checks each against the
// expected outcomes (see advExpect).
//
// This file holds the probes' shared helpers; the probes are in
// hostile_<area>_test.go by area (files, processes, network, kernel,
// signals, crossjob, resources, protocol, and the later seccomp, cgroup,
// front, worker and session rounds).

import (
	"crypto/sha256"
	"encoding/json"
	"errors"

	"os"

	"sort"

	"strings"
	"sync"

	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// advPrelude is prepended to every probe job: sc runs a raw system call
// through libc's syscall(3), attempt runs a Python callable, and report
// prints the PROBES line.
const advPrelude = `import ctypes, errno as _errno, json, os, sys
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
R = {}

def _name(n):
    return _errno.errorcode.get(n, "errno %d" % n)

def _arg(a):
    if isinstance(a, int):
        return ctypes.c_long(a)
    if isinstance(a, str):
        return ctypes.c_char_p(a.encode())
    if isinstance(a, bytes):
        return ctypes.c_char_p(a)
    return a

def sc(name, nr, *args, child_exits=False):
    ctypes.set_errno(0)
    r = _libc.syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    if r == 0 and child_exits:
        os._exit(0)  # a process-creating call that worked: the copy leaves at once
    R[name] = "ok" if r >= 0 else _name(ctypes.get_errno())
    return r

def attempt(name, fn):
    try:
        fn()
        R[name] = "ok"
    except OSError as e:
        R[name] = _name(e.errno) if e.errno else type(e).__name__
    except Exception as e:
        R[name] = type(e).__name__

def report():
    print("PROBES " + json.dumps(R, sort_keys=True), flush=True)
`

// advCode returns a probe job's code: the prelude, body, and the report.
func advCode(body string) string {
	return advPrelude + "\ntry:\n" + indent(body) + "finally:\n    report()\n"
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("    ")
		b.WriteString(l)
		b.WriteString("\n")
	}
	return b.String()
}

// advProbes returns the outcomes a probe job printed.
func advProbes(t *testing.T, r *Result) map[string]string {
	t.Helper()
	for _, line := range strings.Split(r.Stdout, "\n") {
		if rest, ok := strings.CutPrefix(line, "PROBES "); ok {
			var m map[string]string
			require.NoError(t, json.Unmarshal([]byte(rest), &m), line)
			return m
		}
	}
	t.Fatalf("the probe job printed no PROBES line; error %+v\nstdout: %s\nstderr: %s", r.Error, r.Stdout, r.Stderr)
	return nil
}

// advExpect checks every probe outcome against its allowed values, one
// subtest per probe, and that the job ran no probe the table does not know.
func advExpect(t *testing.T, got map[string]string, want map[string][]string) {
	t.Helper()
	t.Logf("probe outcomes: %v", got)
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			v, ok := got[name]
			require.True(t, ok, "probe %q did not run; got %v", name, got)
			require.Contains(t, want[name], v, "probe %q: got %s, want one of %v", name, v, want[name])
		})
	}
	for name := range got {
		_, ok := want[name]
		require.True(t, ok, "probe %q ran but has no expectation (got %s)", name, got[name])
	}
}

// advServes asserts that the pool still serves a normal job correctly.
func advServes(t *testing.T, p *Pool) {
	t.Helper()
	r := run(t, p, Job{ID: "control", Code: "print(6 * 7)"})
	requireOK(t, r)
	require.Equal(t, "42\n", r.Stdout)
}

// advFile is what the host sees of a path.
type advFile struct {
	Exists bool
	Mode   os.FileMode
	Size   int64
	MTime  time.Time
	Nlink  uint64
	Sum    [32]byte
	Xattrs string
}

func advStat(t *testing.T, path string) advFile {
	t.Helper()
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return advFile{}
	}
	require.NoError(t, err)
	f := advFile{Exists: true, Mode: st.Mode(), Size: st.Size(), MTime: st.ModTime()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		f.Nlink = uint64(sys.Nlink)
	}
	if st.Mode().IsRegular() {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		f.Sum = sha256.Sum256(b)
	}
	buf := make([]byte, 4096)
	if n, err := unix.Llistxattr(path, buf); err == nil {
		f.Xattrs = string(buf[:n])
	}
	return f
}

func requireUnchanged(t *testing.T, before advFile, path string) {
	t.Helper()
	require.Equal(t, before, advStat(t, path), "%s changed on the host", path)
}

// advSecret writes a file that must stay unread and unchanged.
func advSecret(t *testing.T, path, content string) advFile {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o640))
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	require.NoError(t, os.Chtimes(path, old, old))
	return advStat(t, path)
}

// requireDenied asserts the job failed with one of the given exception
// types and leaked nothing of secret on stdout or stderr.
func requireDenied(t *testing.T, r *Result, secret string, types ...string) {
	t.Helper()
	if len(types) == 0 {
		types = []string{"PermissionError"}
	}
	require.NotNil(t, r.Error, "the job succeeded; stdout: %s", r.Stdout)
	require.Contains(t, types, r.Error.Type, "message: %s\nstderr: %s", r.Error.Message, r.Stderr)
	require.Equal(t, 1, r.Exit)
	if secret != "" {
		require.NotContains(t, r.Stdout, secret)
		require.NotContains(t, r.Stderr, secret)
	}
}

// advWarm runs a job on every worker at once, so that each template has
// its next spare (whose descriptors the host holds) in hand, and returns
// the host's descriptor count once it is steady.
func advWarm(t testing.TB, p *Pool) int {
	t.Helper()
	var wg sync.WaitGroup
	for i := 0; i < p.Workers(); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := run(t, p, Job{Code: "import time; time.sleep(0.05)"})
			requireOK(t, r)
		}()
	}
	wg.Wait()
	return advSteadyFDs(t)
}
