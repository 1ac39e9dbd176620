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

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"

	"os"
	"os/exec"
	"path/filepath"

	"sort"
	"strconv"

	"strings"
	"sync"

	"syscall"
	"testing"
	"time"
	"unsafe"

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

func TestHostileFiles(t *testing.T) {
	p := newTestPool(t, Config{Workers: 2})
	dir := p.cfg.Dir
	outside := t.TempDir() // not beneath the pool's directory, so never granted
	outsideSecret := filepath.Join(outside, "secret.txt")
	cwdSecret := filepath.Join(dir, "secret.txt")
	require.NoError(t, os.Mkdir(filepath.Join(dir, "data"), 0o755))
	dataFile := filepath.Join(dir, "data", "in.txt")

	// The stdlib's real location, as the job sees it.
	r := run(t, p, Job{Code: "import os; print(os.__file__)"})
	requireOK(t, r)
	stdlibOS := strings.TrimSpace(r.Stdout)
	require.True(t, filepath.IsAbs(stdlibOS), stdlibOS)
	stdlibDir := filepath.Dir(stdlibOS)

	unique := fmt.Sprintf("pynox-hostile-%d-%d", os.Getpid(), time.Now().UnixNano())
	tmpTarget := filepath.Join(os.TempDir(), unique)
	shmTarget := filepath.Join("/dev/shm", unique)
	cwdTarget := filepath.Join(dir, "escape.txt")
	evilModule := filepath.Join(stdlibDir, "pynox_hostile_evil.py")

	type probe struct {
		name string
		code string   // inline code; %[1]q is the outside secret, %[2]q the outside dir
		read []string // extra read grants
		// watch lists host paths that must not change (or appear).
		watch []string
		check func(t *testing.T, r *Result)
	}
	denied := func(types ...string) func(t *testing.T, r *Result) {
		return func(t *testing.T, r *Result) {
			requireDenied(t, r, "", types...)
			require.Equal(t, "", r.Stdout)
		}
	}
	probesOK := func(want map[string][]string) func(t *testing.T, r *Result) {
		return func(t *testing.T, r *Result) {
			requireOK(t, r)
			advExpect(t, advProbes(t, r), want)
		}
	}
	noLeak := []string{"outside-secret", "cwd-secret", "root:"}
	probes := []probe{
		// Reads outside every grant.
		{name: "read /etc/shadow", code: "print(open('/etc/shadow').read())", check: denied()},
		{name: "list /root", code: "import os; print(os.listdir('/root'))", check: denied()},
		{name: "read /proc/1/environ", code: "print(open('/proc/1/environ', 'rb').read())", check: denied()},
		{name: "read the pool's environ", code: fmt.Sprintf("print(open('/proc/%d/environ', 'rb').read())", os.Getpid()), check: denied()},
		{name: "read the pool's memory", code: fmt.Sprintf("f = open('/proc/%d/mem', 'rb')\nprint(f.read(16))", os.Getpid()), check: denied()},
		{name: "list /proc", code: "import os; print(os.listdir('/proc'))", check: denied()},
		{name: "read ungranted file in the working dir", code: "print(open('secret.txt').read())", check: denied(), watch: []string{cwdSecret}},
		{name: "read outside file by absolute path", code: "print(open(%[1]q).read())", check: denied(), watch: []string{outsideSecret}},
		// Writes outside every grant.
		{name: "write /tmp", code: fmt.Sprintf("open(%q, 'w').write('x')", tmpTarget), check: denied(), watch: []string{tmpTarget}},
		{name: "write /dev/shm", code: fmt.Sprintf("open(%q, 'w').write('x')", shmTarget), check: denied(), watch: []string{shmTarget}},
		{name: "write the working dir", code: fmt.Sprintf("open(%q, 'w').write('x')", cwdTarget), check: denied(), watch: []string{cwdTarget}},
		{name: "append to the stdlib", code: "import os\nopen(os.__file__, 'a').write('#pwned')", check: denied(), watch: []string{stdlibOS}},
		{name: "create a module in the stdlib", code: fmt.Sprintf("open(%q, 'w').write('print(1)')", evilModule), check: denied(), watch: []string{evilModule}},
		{name: "overwrite an outside file", code: "open(%[1]q, 'w').write('pwned')", check: denied(), watch: []string{outsideSecret}},
		{name: "truncate an outside file", code: "import os\nos.truncate(%[1]q, 0)", check: denied(), watch: []string{outsideSecret}},
		{name: "unlink an outside file", code: "import os\nos.unlink(%[1]q)", check: denied(), watch: []string{outsideSecret}},
		{name: "unlink a file in the working dir", code: "import os\nos.unlink('secret.txt')", check: denied(), watch: []string{cwdSecret}},
		// Inside a write grant, reaching out of it.
		{name: "symlink in the grant to an outside file", code: `import os
os.symlink(%[1]q, 'out/link')
attempt("read through symlink", lambda: open('out/link').read())
attempt("write through symlink", lambda: open('out/link', 'w').write('pwned'))
attempt("append through symlink", lambda: open('out/link', 'a').write('pwned'))
os.symlink(%[2]q, 'out/dirlink')
attempt("list through dir symlink", lambda: os.listdir('out/dirlink'))
attempt("create through dir symlink", lambda: open('out/dirlink/new.txt', 'w').write('pwned'))
os.symlink('../secret.txt', 'out/rellink')
attempt("read relative symlink to the working dir", lambda: open('out/rellink').read())
`, check: probesOK(map[string][]string{
			"read through symlink":                     {"EACCES"},
			"write through symlink":                    {"EACCES"},
			"append through symlink":                   {"EACCES"},
			"list through dir symlink":                 {"EACCES"},
			"create through dir symlink":               {"EACCES"},
			"read relative symlink to the working dir": {"EACCES"},
		}), watch: []string{outsideSecret, filepath.Join(outside, "new.txt"), cwdSecret}},
		{name: "hard link an outside file into the grant", code: `import os
attempt("link outside secret", lambda: os.link(%[1]q, 'out/hl'))
attempt("link /etc/shadow", lambda: os.link('/etc/shadow', 'out/shadow'))
attempt("link working dir secret", lambda: os.link('secret.txt', 'out/cwd'))
attempt("linkat follow", lambda: os.link(%[1]q, 'out/hl2', follow_symlinks=True))
`, check: probesOK(map[string][]string{
			"link outside secret":     {"EXDEV", "EACCES", "EPERM"},
			"link /etc/shadow":        {"EXDEV", "EACCES", "EPERM"},
			"link working dir secret": {"EXDEV", "EACCES", "EPERM"},
			"linkat follow":           {"EXDEV", "EACCES", "EPERM"},
		}), watch: []string{outsideSecret, "/etc/shadow", cwdSecret}},
		{name: "dotdot out of the grant", code: `import os
attempt("read out/../secret.txt", lambda: open('out/../secret.txt').read())
attempt("write out/../escape.txt", lambda: open('out/../escape.txt', 'w').write('x'))
os.chdir('out')
attempt("read ../secret.txt from inside", lambda: open('../secret.txt').read())
attempt("write ../escape.txt from inside", lambda: open('../escape.txt', 'w').write('x'))
attempt("mkdir ../escape-dir", lambda: os.mkdir('../escape-dir'))
`, check: probesOK(map[string][]string{
			"read out/../secret.txt":          {"EACCES"},
			"write out/../escape.txt":         {"EACCES"},
			"read ../secret.txt from inside":  {"EACCES"},
			"write ../escape.txt from inside": {"EACCES"},
			"mkdir ../escape-dir":             {"EACCES"},
		}), watch: []string{cwdSecret, filepath.Join(dir, "escape.txt"), filepath.Join(dir, "escape-dir")}},
		{name: "rename across the grant boundary", code: `import os
open('out/moveme', 'w').write('inside')
attempt("rename out to the outside dir", lambda: os.rename('out/moveme', os.path.join(%[2]q, 'moved')))
attempt("rename out to the working dir", lambda: os.rename('out/moveme', 'moved'))
attempt("rename over the working dir secret", lambda: os.rename('out/moveme', 'secret.txt'))
attempt("rename outside file into the grant", lambda: os.rename(%[1]q, 'out/stolen'))
attempt("rename working dir secret into the grant", lambda: os.rename('secret.txt', 'out/stolen2'))
attempt("rename the grant itself", lambda: os.rename('out', 'out2'))
`, check: func(t *testing.T, r *Result) {
			probesOK(map[string][]string{
				"rename out to the outside dir":            {"EXDEV", "EACCES"},
				"rename out to the working dir":            {"EXDEV", "EACCES"},
				"rename over the working dir secret":       {"EXDEV", "EACCES"},
				"rename outside file into the grant":       {"EXDEV", "EACCES"},
				"rename working dir secret into the grant": {"EXDEV", "EACCES"},
				"rename the grant itself":                  {"EXDEV", "EACCES", "EBUSY"},
			})(t, r)
			b, err := os.ReadFile(filepath.Join(dir, "out", "moveme"))
			require.NoError(t, err, "the file renamed out of the grant must stay in it")
			require.Equal(t, "inside", string(b))
		}, watch: []string{outsideSecret, cwdSecret, filepath.Join(outside, "moved"), filepath.Join(dir, "moved"),
			filepath.Join(dir, "out", "stolen"), filepath.Join(dir, "out", "stolen2"), filepath.Join(dir, "out2")}},
		// Metadata of files outside the grants.
		{name: "chmod chown xattr utime on an outside file", code: `import os
attempt("chmod", lambda: os.chmod(%[1]q, 0o777))
attempt("chmod nofollow", lambda: os.chmod(%[1]q, 0o777, follow_symlinks=False))
attempt("chown", lambda: os.chown(%[1]q, 1000, 1000))
attempt("lchown", lambda: os.lchown(%[1]q, 1000, 1000))
attempt("setxattr", lambda: os.setxattr(%[1]q, 'user.pynox', b'pwned'))
attempt("removexattr", lambda: os.removexattr(%[1]q, 'user.keep'))
attempt("utime", lambda: os.utime(%[1]q, (0, 0)))
attempt("utime now", lambda: os.utime(%[1]q))
attempt("utime nofollow", lambda: os.utime(%[1]q, (0, 0), follow_symlinks=False))
fd = os.open(%[1]q, os.O_PATH)
attempt("fchmod O_PATH", lambda: os.chmod(fd, 0o777))
attempt("fchown O_PATH", lambda: os.chown(fd, 1000, 1000))
attempt("futimens O_PATH", lambda: os.utime(fd, (0, 0)))
attempt("fsetxattr O_PATH", lambda: os.setxattr(fd, 'user.pynox', b'pwned'))
attempt("ftruncate O_PATH", lambda: os.truncate(fd, 0))
attempt("reopen O_PATH via /proc", lambda: open('/proc/self/fd/%%d' %% fd).read())
d = os.open(%[2]q, os.O_PATH | os.O_DIRECTORY)
attempt("openat beneath O_PATH dir", lambda: os.open('secret.txt', os.O_RDONLY, dir_fd=d))
attempt("creat beneath O_PATH dir", lambda: os.open('new.txt', os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=d))
`, check: probesOK(map[string][]string{
			"chmod":                     {"EPERM"},
			"chmod nofollow":            {"EPERM", "EOPNOTSUPP"},
			"chown":                     {"EPERM"},
			"lchown":                    {"EPERM"},
			"setxattr":                  {"EPERM"},
			"removexattr":               {"EPERM"},
			"utime":                     {"EPERM"},
			"utime now":                 {"EPERM"},
			"utime nofollow":            {"EPERM"},
			"fchmod O_PATH":             {"EBADF", "EPERM"},
			"fchown O_PATH":             {"EBADF", "EPERM"},
			"futimens O_PATH":           {"EBADF", "EPERM"},
			"fsetxattr O_PATH":          {"EBADF", "EPERM"},
			"ftruncate O_PATH":          {"EBADF", "EINVAL", "EACCES"},
			"reopen O_PATH via /proc":   {"EACCES"},
			"openat beneath O_PATH dir": {"EACCES"},
			"creat beneath O_PATH dir":  {"EACCES"},
		}), watch: []string{outsideSecret, filepath.Join(outside, "new.txt")}},
		// Metadata of a file the job may only read, through a read-only
		// descriptor. Landlock has no right for chmod/utime, so seccomp
		// denies every form of them (found by this suite: fchmod could make
		// a read-only file setuid when the pool's uid owned it).
		{name: "metadata of a read-only granted file", read: []string{"data"}, code: `import os
fd = os.open('data/in.txt', os.O_RDONLY)
attempt("fchmod read-only fd", lambda: os.chmod(fd, 0o777))
attempt("fchmod setuid read-only fd", lambda: os.chmod(fd, 0o6755))
attempt("fchown read-only fd", lambda: os.chown(fd, 1000, 1000))
attempt("futimens read-only fd", lambda: os.utime(fd, (0, 0)))
attempt("futimens now read-only fd", lambda: os.utime(fd))
attempt("fsetxattr read-only fd", lambda: os.setxattr(fd, 'user.pynox', b'pwned'))
attempt("ftruncate read-only fd", lambda: os.truncate(fd, 0))
d = os.open('data', os.O_RDONLY | os.O_DIRECTORY)
attempt("fchmod read-only dir fd", lambda: os.chmod(d, 0o777))
attempt("futimens read-only dir fd", lambda: os.utime(d, (0, 0)))
`, check: probesOK(map[string][]string{
			"fchmod read-only fd":        {"EPERM", "EACCES"},
			"fchmod setuid read-only fd": {"EPERM", "EACCES"},
			"fchown read-only fd":        {"EPERM", "EACCES"},
			"futimens read-only fd":      {"EPERM", "EACCES"},
			"futimens now read-only fd":  {"EPERM", "EACCES"},
			"fsetxattr read-only fd":     {"EPERM", "EACCES"},
			"ftruncate read-only fd":     {"EINVAL", "EBADF", "EACCES"},
			"fchmod read-only dir fd":    {"EPERM", "EACCES"},
			"futimens read-only dir fd":  {"EPERM", "EACCES"},
		}), watch: []string{dataFile, filepath.Join(dir, "data")}},
	}

	for _, pr := range probes {
		t.Run(pr.name, func(t *testing.T) {
			// Fresh state for every probe.
			out := filepath.Join(dir, "out")
			require.NoError(t, os.RemoveAll(out))
			require.NoError(t, os.Mkdir(out, 0o755))
			for _, junk := range []string{"moved", "escape.txt", "escape-dir", "out2"} {
				require.NoError(t, os.RemoveAll(filepath.Join(dir, junk)))
			}
			advSecret(t, outsideSecret, "outside-secret")
			require.NoError(t, unix.Setxattr(outsideSecret, "user.keep", []byte("v"), 0))
			advSecret(t, cwdSecret, "cwd-secret")
			advSecret(t, dataFile, "data")
			before := map[string]advFile{}
			for _, w := range pr.watch {
				before[w] = advStat(t, w)
			}
			code := pr.code
			if strings.Contains(code, "%[") {
				code = fmt.Sprintf(code, outsideSecret, outside)
			}
			if strings.Contains(code, "attempt(") {
				code = advCode(code)
			}
			r := run(t, p, Job{Code: code, AllowWrite: []string{"out"}, AllowRead: pr.read})
			pr.check(t, r)
			for _, s := range noLeak {
				require.NotContains(t, r.Stdout, s)
				require.NotContains(t, r.Stderr, s)
			}
			for _, w := range pr.watch {
				requireUnchanged(t, before[w], w)
			}
		})
	}
	advServes(t, p)
}

func TestHostileProcesses(t *testing.T) {
	p := newTestPool(t, Config{Workers: 2})
	dir := p.cfg.Dir
	marker := filepath.Join(dir, "out", "marker")
	// Each command, if it ever ran, would leave the marker behind.
	sh := "echo pwned > " + marker

	tests := []struct {
		name  string
		code  string
		check func(t *testing.T, r *Result)
	}{
		{"os.system", fmt.Sprintf("import os\nrc = os.system(%q)\nprint('rc', rc)", sh), func(t *testing.T, r *Result) {
			requireOK(t, r)
			require.NotEqual(t, "rc 0\n", r.Stdout)
			require.Regexp(t, `^rc -?\d+\n$`, r.Stdout)
		}},
		{"subprocess.run", fmt.Sprintf("import subprocess\nsubprocess.run(['/bin/sh', '-c', %q])", sh), func(t *testing.T, r *Result) {
			requireDenied(t, r, "", "PermissionError")
		}},
		{"os.fork", "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint('forked', pid)", func(t *testing.T, r *Result) {
			requireDenied(t, r, "", "PermissionError")
			require.Empty(t, r.Stdout)
		}},
		{"os.execv", fmt.Sprintf("import os\ntry:\n    os.execv('/bin/sh', ['sh', '-c', %q])\nfinally:\n    print('still here')", sh), func(t *testing.T, r *Result) {
			requireDenied(t, r, "", "PermissionError")
			require.Equal(t, "still here\n", r.Stdout)
		}},
		{"os.posix_spawn", fmt.Sprintf("import os\nos.posix_spawn('/bin/sh', ['sh', '-c', %q], {})", sh), func(t *testing.T, r *Result) {
			requireDenied(t, r, "", "PermissionError")
		}},
		{"multiprocessing fork", fmt.Sprintf("import multiprocessing as mp, os\nctx = mp.get_context('fork')\npr = ctx.Process(target=os.system, args=(%q,))\npr.start()\npr.join()", sh), func(t *testing.T, r *Result) {
			requireDenied(t, r, "", "PermissionError", "OSError")
		}},
		{"multiprocessing spawn", fmt.Sprintf("import multiprocessing as mp, os\nctx = mp.get_context('spawn')\npr = ctx.Process(target=os.system, args=(%q,))\npr.start()\npr.join()", sh), func(t *testing.T, r *Result) {
			requireDenied(t, r, "", "PermissionError", "OSError")
		}},
		{"raw process creation via ctypes", advCode(`import signal, struct
SIGCHLD = int(signal.SIGCHLD)
sc("fork", 57, child_exits=True)
sc("vfork", 58, child_exits=True)
sc("clone SIGCHLD", 56, SIGCHLD, 0, 0, 0, 0, child_exits=True)
sc("clone VM|VFORK (posix_spawn)", 56, 0x4000 | 0x100 | SIGCHLD, 0, 0, 0, 0, child_exits=True)
sc("clone NEWUSER", 56, 0x10000000 | SIGCHLD, 0, 0, 0, 0, child_exits=True)
args = ctypes.create_string_buffer(struct.pack("<11Q", 0, 0, 0, 0, SIGCHLD, 0, 0, 0, 0, 0, 0))
sc("clone3", 435, args, 88, child_exits=True)
sc("execve /bin/true", 59, b"/bin/true", 0, 0)
sc("execveat /bin/true", 322, -100, b"/bin/true", 0, 0, 0)
sc("control getpid", 39)
`), func(t *testing.T, r *Result) {
			requireOK(t, r)
			advExpect(t, advProbes(t, r), map[string][]string{
				"fork":                         {"EPERM"},
				"vfork":                        {"EPERM"},
				"clone SIGCHLD":                {"EPERM"},
				"clone VM|VFORK (posix_spawn)": {"EPERM"},
				"clone NEWUSER":                {"EPERM"},
				"clone3":                       {"ENOSYS"},
				"execve /bin/true":             {"EPERM"},
				"execveat /bin/true":           {"EPERM"},
				"control getpid":               {"ok"},
			})
		}},
		{"memfd_create and exec", advCode(fmt.Sprintf(`fd = os.memfd_create("payload", 0)
with open("/bin/sh", "rb") as f:
    os.write(fd, f.read())
R["memfd_create"] = "ok"
attempt("fexecve", lambda: os.execve(fd, ["sh", "-c", %q], {}))
sc("execveat AT_EMPTY_PATH", 322, fd, b"", 0, 0, 0x1000)
attempt("execve /proc/self/fd", lambda: os.execv("/proc/self/fd/%%d" %% fd, ["sh"]))
`, sh)), func(t *testing.T, r *Result) {
			requireOK(t, r)
			advExpect(t, advProbes(t, r), map[string][]string{
				"memfd_create":           {"ok"},
				"fexecve":                {"EPERM"},
				"execveat AT_EMPTY_PATH": {"EPERM"},
				"execve /proc/self/fd":   {"EPERM", "EACCES"},
			})
		}},
		{"x32 system call numbers", advCode(`X32 = 0x40000000
sc("x32 getpid", 39 | X32)
sc("x32 fork", 57 | X32, child_exits=True)
sc("x32 vfork", 58 | X32, child_exits=True)
sc("x32 execve", 520 | X32, b"/bin/true", 0, 0)
sc("x32 execveat", 545 | X32, -100, b"/bin/true", 0, 0, 0)
sc("x32 ptrace", 521 | X32, 16, os.getppid(), 0, 0)
sc("x32 socket", 41 | X32, 2, 1, 0)
sc("x32 unshare", 272 | X32, 0x10000000)
sc("x32 mount", 165 | X32, b"none", b"/tmp", b"tmpfs", 0, 0)
`), func(t *testing.T, r *Result) {
			requireOK(t, r)
			advExpect(t, advProbes(t, r), map[string][]string{
				"x32 getpid":   {"EPERM"},
				"x32 fork":     {"EPERM"},
				"x32 vfork":    {"EPERM"},
				"x32 execve":   {"EPERM"},
				"x32 execveat": {"EPERM"},
				"x32 ptrace":   {"EPERM"},
				"x32 socket":   {"EPERM"},
				"x32 unshare":  {"EPERM"},
				"x32 mount":    {"EPERM"},
			})
		}},
		{"i386 int 0x80 kills the job", `import ctypes, mmap
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")  # mov eax, 20 (i386 getpid); int 0x80; ret
f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
print("i386 getpid returned", f(), flush=True)
`, func(t *testing.T, r *Result) {
			requireErrorType(t, r, "SignalError")
			require.Contains(t, r.Error.Message, "SIGSYS", "a foreign-architecture call must kill the process")
			require.Empty(t, r.Stdout)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "out")
			require.NoError(t, os.RemoveAll(out))
			require.NoError(t, os.Mkdir(out, 0o755))
			r := run(t, p, Job{Code: tc.code, AllowWrite: []string{"out"}})
			tc.check(t, r)
			require.NotContains(t, r.Stdout, "pwned")
			// Give a process that escaped a moment to write its marker.
			time.Sleep(20 * time.Millisecond)
			require.NoFileExists(t, marker, "a command ran")
		})
	}
	advServes(t, p)

	t.Run("thread bomb", func(t *testing.T) {
		start := time.Now()
		r := run(t, p, Job{Code: `import threading, time
ev = threading.Event()
n = 0
try:
    while True:
        threading.Thread(target=ev.wait, daemon=True).start()
        n += 1
finally:
    print("threads", n, flush=True)
`, Timeout: 20 * time.Second})
		took := time.Since(start)
		t.Logf("thread bomb: %s after %d threads in %s", r.Error.Type, advThreads(r.Stdout), took)
		require.NotNil(t, r.Error, "stdout: %s", r.Stdout)
		require.Contains(t, []string{"RuntimeError", "MemoryError"}, r.Error.Type, "%s\n%s", r.Error.Message, r.Stderr)
		require.Less(t, took, 15*time.Second)
		require.Greater(t, advThreads(r.Stdout), 0)
		advServes(t, p)
	})
	t.Run("thread bomb with small stacks", func(t *testing.T) {
		// Small stacks buy more threads per MiB of allowance (observed: about
		// 650 threads at 64 KiB stacks whatever the allowance, about 1,200 at
		// 32 KiB under the default 1 GiB: far from the host's pid_max). Under
		// memory pressure CPython's Thread.start() can also wait forever for
		// a thread that died of MemoryError before it signalled that it
		// started, so the timeout may be what ends the job: still contained.
		start := time.Now()
		r := run(t, p, Job{Code: `import os, threading
threading.stack_size(64 * 1024)
ev = threading.Event()
n = 0
try:
    while True:
        threading.Thread(target=ev.wait, daemon=True).start()
        n += 1
        if n % 16 == 0:
            os.write(1, b"threads %d\n" % n)
finally:
    os.write(1, b"threads %d\n" % n)
`, Memory: 64 << 20, Timeout: 2 * time.Second})
		took := time.Since(start)
		t.Logf("small-stack thread bomb (64 MiB allowance): %s after %d threads in %s", r.Error.Type, advThreads(r.Stdout), took)
		require.NotNil(t, r.Error, "stdout: %s", r.Stdout)
		require.Contains(t, []string{"RuntimeError", "MemoryError", "TimeoutError"}, r.Error.Type, "%s\n%s", r.Error.Message, r.Stderr)
		require.Less(t, took, 15*time.Second)
		if p.Cgroups() == "none" {
			require.Greater(t, advThreads(r.Stdout), 100)
		} else {
			// The job's cgroup stops it first (pids.max).
			require.Greater(t, advThreads(r.Stdout), 0)
			require.Less(t, advThreads(r.Stdout), DefaultThreads)
		}
		advServes(t, p)
	})
}

func advThreads(stdout string) int {
	var n int
	for _, l := range strings.Split(stdout, "\n") {
		if rest, ok := strings.CutPrefix(l, "threads "); ok {
			n, _ = strconv.Atoi(strings.TrimSpace(rest))
		}
	}
	return n
}

// advListener records whether anything reached a host endpoint a job must
// not reach.
type advListener struct {
	name    string
	target  string // what the job connects to, as Python source
	family  string // Python socket family expression
	kind    string // Python socket type expression
	stream  bool
	ln      net.Listener
	pc      net.PacketConn
	mu      sync.Mutex
	reached []string
}

func (l *advListener) serve() {
	if l.ln != nil {
		for {
			c, err := l.ln.Accept()
			if err != nil {
				return
			}
			l.mu.Lock()
			l.reached = append(l.reached, "connection from "+c.RemoteAddr().String())
			l.mu.Unlock()
			c.Close()
		}
	}
	buf := make([]byte, 2048)
	for {
		n, addr, err := l.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		l.mu.Lock()
		l.reached = append(l.reached, fmt.Sprintf("%d bytes from %v", n, addr))
		l.mu.Unlock()
	}
}

// quiet asserts that nothing reached the endpoint, waiting a moment for
// stragglers.
func (l *advListener) quiet(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(300 * time.Millisecond)
	if l.ln != nil {
		_ = l.ln.(interface{ SetDeadline(time.Time) error }).SetDeadline(deadline)
	} else {
		_ = l.pc.SetReadDeadline(deadline)
	}
	time.Sleep(time.Until(deadline) + 50*time.Millisecond)
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Empty(t, l.reached, "%s: a job reached the host", l.name)
}

func (l *advListener) close() {
	if l.ln != nil {
		l.ln.Close()
	} else {
		l.pc.Close()
	}
}

// advListeners starts one listener per reachable kind of host endpoint.
func advListeners(t *testing.T, sockDir string) []*advListener {
	t.Helper()
	var ls []*advListener
	add := func(l *advListener) {
		ls = append(ls, l)
		go l.serve()
		t.Cleanup(l.close)
	}
	tcp, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	add(&advListener{name: "tcp loopback", ln: tcp, stream: true, family: "socket.AF_INET", kind: "socket.SOCK_STREAM",
		target: fmt.Sprintf("('127.0.0.1', %d)", tcp.Addr().(*net.TCPAddr).Port)})
	udp, err := net.ListenPacket("udp4", "127.0.0.1:0")
	require.NoError(t, err)
	add(&advListener{name: "udp loopback", pc: udp, family: "socket.AF_INET", kind: "socket.SOCK_DGRAM",
		target: fmt.Sprintf("('127.0.0.1', %d)", udp.LocalAddr().(*net.UDPAddr).Port)})
	if tcp6, err := net.Listen("tcp6", "[::1]:0"); err == nil {
		add(&advListener{name: "tcp6 loopback", ln: tcp6, stream: true, family: "socket.AF_INET6", kind: "socket.SOCK_STREAM",
			target: fmt.Sprintf("('::1', %d)", tcp6.Addr().(*net.TCPAddr).Port)})
	} else {
		t.Logf("no IPv6 loopback (%v): IPv6 probes skipped", err)
	}
	if udp6, err := net.ListenPacket("udp6", "[::1]:0"); err == nil {
		add(&advListener{name: "udp6 loopback", pc: udp6, family: "socket.AF_INET6", kind: "socket.SOCK_DGRAM",
			target: fmt.Sprintf("('::1', %d)", udp6.LocalAddr().(*net.UDPAddr).Port)})
	}
	path := filepath.Join(sockDir, "s.sock")
	us, err := net.Listen("unix", path)
	require.NoError(t, err)
	add(&advListener{name: "unix pathname stream", ln: us, stream: true, family: "socket.AF_UNIX", kind: "socket.SOCK_STREAM",
		target: fmt.Sprintf("%q", path)})
	dpath := filepath.Join(sockDir, "d.sock")
	ud, err := net.ListenPacket("unixgram", dpath)
	require.NoError(t, err)
	add(&advListener{name: "unix pathname datagram", pc: ud, family: "socket.AF_UNIX", kind: "socket.SOCK_DGRAM",
		target: fmt.Sprintf("%q", dpath)})
	abstract := fmt.Sprintf("pynox-hostile-%d-%d", os.Getpid(), time.Now().UnixNano())
	ua, err := net.Listen("unix", "@"+abstract)
	require.NoError(t, err)
	add(&advListener{name: "unix abstract stream", ln: ua, stream: true, family: "socket.AF_UNIX", kind: "socket.SOCK_STREAM",
		target: fmt.Sprintf("'\\0%s'", abstract)})
	return ls
}

// advConnect is a job that tries to reach l and reports how far it got.
func advConnect(l *advListener) string {
	send := "s.sendto(b'pwned', " + l.target + ")"
	if l.stream {
		send = "s.settimeout(2)\n    s.connect(" + l.target + ")\n    s.sendall(b'pwned')"
	}
	return advCode(`import socket
def go():
    s = socket.socket(` + l.family + `, ` + l.kind + `)
    ` + send + `
attempt("reach", go)
`)
}

func TestHostileNetwork(t *testing.T) {
	p := newTestPool(t, Config{Workers: 2})
	sockDir := filepath.Join(p.cfg.Dir, "sock")
	require.NoError(t, os.Mkdir(sockDir, 0o755))
	ls := advListeners(t, sockDir)

	// Without the network, nothing reaches any endpoint: socket() itself
	// fails. The unix sockets' directory is even granted for reading.
	for _, l := range ls {
		t.Run("denied/"+l.name, func(t *testing.T) {
			r := run(t, p, Job{Code: advConnect(l), AllowRead: []string{"sock"}})
			requireOK(t, r)
			advExpect(t, advProbes(t, r), map[string][]string{"reach": {"EPERM"}})
			l.quiet(t)
		})
	}
	families := advCode(`import socket
attempt("netlink route", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
attempt("netlink audit", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9))
attempt("packet raw", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)))
attempt("packet dgram", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(3)))
attempt("vsock stream", lambda: socket.socket(40, socket.SOCK_STREAM))
attempt("vsock dgram", lambda: socket.socket(40, socket.SOCK_DGRAM))
attempt("unix stream", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("inet raw icmp", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("alg", lambda: socket.socket(38, socket.SOCK_SEQPACKET))
attempt("bluetooth", lambda: socket.socket(31, socket.SOCK_STREAM))
sc("raw syscall socket AF_NETLINK", 41, 16, 3, 0)
def pair():
    a, b = socket.socketpair()
    a.sendall(b"x")
    assert b.recv(1) == b"x"
attempt("control socketpair", pair)
`)
	t.Run("denied/other families", func(t *testing.T) {
		r := run(t, p, Job{Code: families})
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			"netlink route": {"EPERM"}, "netlink audit": {"EPERM"}, "packet raw": {"EPERM"}, "packet dgram": {"EPERM"},
			"vsock stream": {"EPERM"}, "vsock dgram": {"EPERM"}, "unix stream": {"EPERM"}, "inet raw icmp": {"EPERM"},
			"alg": {"EPERM"}, "bluetooth": {"EPERM"}, "raw syscall socket AF_NETLINK": {"EPERM"},
			"control socketpair": {"ok"},
		})
	})
	advServes(t, p)

	// Granted the network, a job reaches TCP and UDP (the positive control
	// that shows the denials above are the sandbox's), but still no unix,
	// netlink, packet or vsock endpoint.
	pn := newTestPool(t, Config{Workers: 1, Limits: Limits{AllowNetwork: true}})
	psock := filepath.Join(pn.cfg.Dir, "sock")
	require.NoError(t, os.Mkdir(psock, 0o755))
	for _, l := range advListeners(t, psock) {
		t.Run("network granted/"+l.name, func(t *testing.T) {
			r := run(t, pn, Job{Code: advConnect(l), AllowRead: []string{"sock"}, AllowNetwork: true})
			requireOK(t, r)
			if strings.Contains(l.family, "AF_UNIX") {
				advExpect(t, advProbes(t, r), map[string][]string{"reach": {"EPERM"}})
				l.quiet(t)
				return
			}
			advExpect(t, advProbes(t, r), map[string][]string{"reach": {"ok"}})
			require.Eventually(t, func() bool {
				l.mu.Lock()
				defer l.mu.Unlock()
				return len(l.reached) > 0
			}, 5*time.Second, 10*time.Millisecond, "%s: the granted job's traffic never arrived", l.name)
		})
	}
	t.Run("network granted/other families", func(t *testing.T) {
		r := run(t, pn, Job{Code: families, AllowNetwork: true})
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			"netlink route": {"EPERM"}, "netlink audit": {"EPERM"}, "packet raw": {"EPERM"}, "packet dgram": {"EPERM"},
			"vsock stream": {"EPERM"}, "vsock dgram": {"EPERM"}, "unix stream": {"EPERM"},
			// AF_INET is allowed by the filter; a raw socket still needs CAP_NET_RAW.
			"inet raw icmp": {"EPERM"},
			"alg":           {"EPERM"}, "bluetooth": {"EPERM"}, "raw syscall socket AF_NETLINK": {"EPERM"},
			"control socketpair": {"ok"},
		})
	})
	advServes(t, pn)
}

func TestHostileKernelSurface(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	dir := p.cfg.Dir
	require.NoError(t, os.Mkdir(filepath.Join(dir, "out"), 0o755))
	node := filepath.Join(dir, "out", "node")
	code := advCode(`import resource, struct, signal
ppid = os.getppid()
AT_FDCWD = -100
buf = ctypes.create_string_buffer(4096)

# Other processes: the template is the parent.
sc("ptrace attach parent", 101, 16, ppid, 0, 0)
sc("ptrace seize parent", 101, 0x4206, ppid, 0, 0)
sc("ptrace traceme", 101, 0, 0, 0, 0)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local = iovec(ctypes.addressof(buf), 16)
remote = iovec(id(None), 16)  # the same address in the parent: fork keeps the layout
sc("process_vm_readv parent", 310, ppid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
empty = iovec(ctypes.addressof(buf), 0)
sc("process_vm_writev parent", 311, ppid, ctypes.byref(empty), 1, ctypes.byref(empty), 1, 0)
sc("pidfd_open parent", 434, ppid, 0)
sc("pidfd_getfd", 438, 0, 0, 0)
sc("pidfd_send_signal", 424, 0, 0, 0, 0)
sc("kcmp", 312, os.getpid(), ppid, 0, 0, 0)
sc("process_madvise", 440, 0, ctypes.byref(local), 1, 0, 0)
sc("process_mrelease", 448, 0, 0)
sc("migrate_pages parent", 256, ppid, 64, buf, buf)
sc("move_pages parent", 279, ppid, 0, 0, 0, 0, 0)
old = (ctypes.c_ulong * 2)()
sc("prlimit64 parent get", 302, ppid, 9, 0, ctypes.byref(old))
sc("prlimit64 parent pid with high bits", 302, (1 << 32) | ppid, 9, 0, ctypes.byref(old))
sc("prlimit64 own pid by number", 302, os.getpid(), 9, 0, ctypes.byref(old))
sc("control prlimit64 self get", 302, 0, 9, 0, ctypes.byref(old))
inf = (ctypes.c_ulong * 2)(2**64 - 1, 2**64 - 1)
sc("prlimit64 self raise RLIMIT_AS", 302, 0, 9, ctypes.byref(inf), 0)

# Kernel attack surface.
sc("bpf prog load", 321, 5, buf, 128)
sc("bpf map create", 321, 0, buf, 72)
pattr = ctypes.create_string_buffer(128)
struct.pack_into("<II", pattr, 0, 1, 128)  # PERF_TYPE_SOFTWARE, size
sc("perf_event_open", 298, pattr, 0, -1, -1, 0)
sc("userfaultfd", 323, 0)
sc("io_uring_setup", 425, 4, ctypes.create_string_buffer(120))
sc("io_uring_enter", 426, 0, 0, 0, 0, 0, 0)
sc("io_uring_register", 427, 0, 0, 0, 0)
sc("keyctl get session keyring", 250, 0, -3, 1)
sc("add_key", 248, b"user", b"pynox", b"secret", 6, -2)
sc("request_key", 249, b"user", b"pynox", 0, 0)
sc("memfd_secret", 447, 0)
sc("fanotify_init", 300, 0, 0)

# Namespaces, mounts, root.
sc("unshare CLONE_NEWUSER", 272, 0x10000000)
sc("unshare CLONE_NEWNET", 272, 0x40000000)
sc("unshare CLONE_NEWNS", 272, 0x00020000)
sc("setns", 308, 0, 0)
sc("mount tmpfs", 165, b"none", b"/tmp", b"tmpfs", 0, 0)
sc("umount2", 166, b"/tmp", 2)
sc("fsopen", 430, b"tmpfs", 0)
sc("fspick", 433, AT_FDCWD, b"/", 0)
sc("open_tree", 428, AT_FDCWD, b"/", 1)
sc("move_mount", 429, AT_FDCWD, b"/", AT_FDCWD, b"/tmp", 0)
sc("mount_setattr", 442, AT_FDCWD, b"/", 0, buf, 32)
sc("chroot", 161, b"/")
sc("pivot_root", 155, b"/", b"/")
handle = ctypes.create_string_buffer(136)
struct.pack_into("<Ii", handle, 0, 128, 0)
mnt = ctypes.c_int(0)
sc("name_to_handle_at", 303, AT_FDCWD, b"/etc/shadow", handle, ctypes.byref(mnt), 0)
sc("open_by_handle_at", 304, AT_FDCWD, handle, 0)

# Kernel, modules, logs, clocks, hardware.
sc("init_module", 175, buf, 16, b"")
sc("finit_module", 313, 0, b"", 0)
sc("delete_module", 176, b"pynox", 0)
sc("kexec_load", 246, 0, 0, 0, 0)
sc("kexec_file_load", 320, -1, -1, 0, b"", 0)
sc("syslog read all", 103, 3, buf, 4096)
sc("syslog size", 103, 10, 0, 0)
sc("reboot cad off", 169, 0xfee1dead, 0x28121969, 0, 0)
sc("swapon", 167, b"/nonexistent", 0)
sc("acct", 163, 0)
ts = (ctypes.c_long * 2)()
_libc.clock_gettime(0, ts)
sc("clock_settime", 227, 0, ts)
sc("settimeofday", 164, 0, 0)
sc("adjtimex read", 159, ctypes.create_string_buffer(208))
sc("clock_adjtime read", 305, 0, ctypes.create_string_buffer(208))
sc("iopl", 172, 3)
sc("ioperm", 173, 0x80, 1, 1)
sc("modify_ldt read", 154, 0, buf, 16)
sc("sethostname", 170, b"pynox", 5)
sc("vhangup", 153)
sc("uselib", 134, b"/nonexistent")
sc("mknod fifo in write grant", 133, b"out/node", 0o010600, 0)
sc("mknodat char device in write grant", 259, AT_FDCWD, b"out/node", 0o020600, 0x0103)

# personality: only the query is allowed.
sc("personality 0x0008", 135, 0x0008)
sc("personality READ_IMPLIES_EXEC", 135, 0x0400000)
sc("personality ADDR_NO_RANDOMIZE", 135, 0x0040000)
sc("control personality query", 135, 0xffffffff)

# Terminal injection.
ch = ctypes.c_char(b"x")
sc("ioctl TIOCSTI fd 0", 16, 0, 0x5412, ctypes.byref(ch))
sc("ioctl TIOCSTI high bits", 16, 0, 0x5412 | (1 << 32), ctypes.byref(ch))
sc("ioctl TIOCSTI fd 2", 16, 2, 0x5412, ctypes.byref(ch))
sc("ioctl TIOCLINUX", 16, 0, 0x541C, buf)
sc("ioctl TIOCLINUX high bits", 16, 0, 0x541C | (7 << 40), buf)
try:
    tty = os.open("/dev/tty", os.O_RDWR)
    R["open /dev/tty"] = "ok"
    sc("ioctl TIOCSTI /dev/tty", 16, tty, 0x5412, ctypes.byref(ch))
except OSError as e:
    R["open /dev/tty"] = _name(e.errno)
attempt("open /dev/console", lambda: os.open("/dev/console", os.O_RDWR))
attempt("open /dev/ptmx", lambda: os.open("/dev/ptmx", os.O_RDWR))

# Credentials and limits.
class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
hdr = CapHeader(0x20080522, 0)
caps = (CapData * 2)(CapData(0xffffffff, 0xffffffff, 0xffffffff), CapData(0xffffffff, 0xffffffff, 0xffffffff))
sc("capset all", 126, ctypes.byref(hdr), ctypes.byref(caps))
got = (CapData * 2)()
sc("control capget", 125, ctypes.byref(CapHeader(0x20080522, 0)), ctypes.byref(got))
R["capabilities held"] = "none" if not any(d.effective or d.permitted or d.inheritable for d in got) else "SOME"
sc("setuid 0", 105, 0)
sc("setresuid", 117, 0, 0, 0)
sc("setgroups", 116, 0, 0)
sc("prctl set no_new_privs 0", 157, 38, 0, 0, 0, 0)
R["no_new_privs"] = str(_libc.prctl(39, 0, 0, 0, 0))
before = {n: resource.getrlimit(getattr(resource, n)) for n in ("RLIMIT_AS", "RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CPU", "RLIMIT_CORE")}
for n, (soft, hard) in before.items():
    new = resource.RLIM_INFINITY if hard != resource.RLIM_INFINITY else hard
    if hard == resource.RLIM_INFINITY:
        R["raise " + n + " hard limit"] = "unlimited already"
        continue
    attempt("raise " + n + " hard limit", lambda n=n: resource.setrlimit(getattr(resource, n), (new, new)))
after = {n: resource.getrlimit(getattr(resource, n)) for n in before}
R["rlimits unchanged"] = "yes" if after == before else "NO: %r -> %r" % (before, after)
`)
	r := run(t, p, Job{Code: code, AllowWrite: []string{"out"}})
	requireOK(t, r)
	eperm := []string{"EPERM"}
	advExpect(t, advProbes(t, r), map[string][]string{
		"ptrace attach parent":                eperm,
		"ptrace seize parent":                 eperm,
		"ptrace traceme":                      eperm,
		"process_vm_readv parent":             eperm,
		"process_vm_writev parent":            eperm,
		"pidfd_open parent":                   eperm,
		"pidfd_getfd":                         eperm,
		"pidfd_send_signal":                   eperm,
		"kcmp":                                eperm,
		"process_madvise":                     eperm,
		"process_mrelease":                    eperm,
		"migrate_pages parent":                eperm,
		"move_pages parent":                   eperm,
		"prlimit64 parent get":                eperm,
		"prlimit64 parent pid with high bits": eperm,
		"prlimit64 own pid by number":         eperm,
		"control prlimit64 self get":          {"ok"},
		"prlimit64 self raise RLIMIT_AS":      eperm,
		"bpf prog load":                       eperm,
		"bpf map create":                      eperm,
		"perf_event_open":                     eperm,
		"userfaultfd":                         eperm,
		"io_uring_setup":                      eperm,
		"io_uring_enter":                      eperm,
		"io_uring_register":                   eperm,
		"keyctl get session keyring":          eperm,
		"add_key":                             eperm,
		"request_key":                         eperm,
		"memfd_secret":                        eperm,
		"fanotify_init":                       eperm,
		"unshare CLONE_NEWUSER":               eperm,
		"unshare CLONE_NEWNET":                eperm,
		"unshare CLONE_NEWNS":                 eperm,
		"setns":                               eperm,
		"mount tmpfs":                         eperm,
		"umount2":                             eperm,
		"fsopen":                              eperm,
		"fspick":                              eperm,
		"open_tree":                           eperm,
		"move_mount":                          eperm,
		"mount_setattr":                       eperm,
		"chroot":                              eperm,
		"pivot_root":                          eperm,
		"name_to_handle_at":                   eperm,
		"open_by_handle_at":                   eperm,
		"init_module":                         eperm,
		"finit_module":                        eperm,
		"delete_module":                       eperm,
		"kexec_load":                          eperm,
		"kexec_file_load":                     eperm,
		"syslog read all":                     eperm,
		"syslog size":                         eperm,
		"reboot cad off":                      eperm,
		"swapon":                              eperm,
		"acct":                                eperm,
		"clock_settime":                       eperm,
		"settimeofday":                        eperm,
		"adjtimex read":                       eperm,
		"clock_adjtime read":                  eperm,
		"iopl":                                eperm,
		"ioperm":                              eperm,
		"modify_ldt read":                     eperm,
		"sethostname":                         eperm,
		"vhangup":                             eperm,
		"uselib":                              eperm,
		"mknod fifo in write grant":           eperm,
		"mknodat char device in write grant":  eperm,
		"personality 0x0008":                  eperm,
		"personality READ_IMPLIES_EXEC":       eperm,
		"personality ADDR_NO_RANDOMIZE":       eperm,
		"control personality query":           {"ok"},
		"ioctl TIOCSTI fd 0":                  eperm,
		"ioctl TIOCSTI high bits":             eperm,
		"ioctl TIOCSTI fd 2":                  eperm,
		"ioctl TIOCLINUX":                     eperm,
		"ioctl TIOCLINUX high bits":           eperm,
		// The job has no controlling terminal and /dev/tty is not granted.
		"open /dev/tty":                  {"EACCES", "ENXIO"},
		"open /dev/console":              {"EACCES"},
		"open /dev/ptmx":                 {"EACCES"},
		"capset all":                     eperm,
		"control capget":                 {"ok"},
		"capabilities held":              {"none"},
		"setuid 0":                       eperm,
		"setresuid":                      eperm,
		"setgroups":                      eperm,
		"prctl set no_new_privs 0":       {"EINVAL", "EPERM"},
		"no_new_privs":                   {"1"},
		"raise RLIMIT_AS hard limit":     {"ValueError"}, // Python's word for EPERM from setrlimit
		"raise RLIMIT_NOFILE hard limit": {"ValueError"},
		"raise RLIMIT_FSIZE hard limit":  {"ValueError"},
		"raise RLIMIT_CPU hard limit":    {"ValueError"},
		"raise RLIMIT_CORE hard limit":   {"ValueError"},
		"rlimits unchanged":              {"yes"},
	})
	require.NoFileExists(t, node)
	advServes(t, p)
}

func TestHostileSignals(t *testing.T) {
	p := newTestPool(t, Config{Workers: 2})
	dir := p.cfg.Dir
	shared := filepath.Join(dir, "shared")
	require.NoError(t, os.Mkdir(shared, 0o755))
	templates := p.templatePIDs()
	require.Len(t, templates, 2)
	// A process unrelated to the pool, as a witness for the broadcast kills.
	sentinel := exec.Command("sleep", "300")
	require.NoError(t, sentinel.Start())
	t.Cleanup(func() { _ = sentinel.Process.Kill(); _ = sentinel.Wait() })

	// A victim job runs concurrently on the other worker until the host
	// tells it to stop; it publishes its pid for the attackers.
	victimDone := make(chan *Result, 1)
	go func() {
		victimDone <- run(t, p, Job{ID: "victim", Code: `import os, time
open('shared/victim.pid', 'w').write(os.readlink('/proc/self'))
deadline = time.time() + 60
while not os.path.exists('shared/stop') and time.time() < deadline:
    time.sleep(0.02)
print('victim survived')
`, AllowWrite: []string{"shared"}})
	}()
	var victim int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(shared, "victim.pid"))
		if err != nil {
			return false
		}
		victim, err = strconv.Atoi(string(b))
		return err == nil && victim > 0
	}, 30*time.Second, 10*time.Millisecond)
	require.True(t, processAlive(victim))

	env := map[string]string{
		"POOL_PID":   strconv.Itoa(os.Getpid()),
		"VICTIM_PID": strconv.Itoa(victim),
	}
	attack := func(t *testing.T, body string) *Result {
		t.Helper()
		return run(t, p, Job{Code: advCode("import signal, time\npool = int(os.environ['POOL_PID'])\nvictim = int(os.environ['VICTIM_PID'])\ntpl = os.getppid()\n" + body),
			Env: env, AllowRead: []string{"shared"}})
	}
	survivors := func(t *testing.T) {
		t.Helper()
		time.Sleep(50 * time.Millisecond) // let a signal that was sent land
		require.True(t, processAlive(victim), "the concurrent job was killed")
		require.True(t, processAlive(sentinel.Process.Pid), "an unrelated process was killed")
		require.Equal(t, templates, p.templatePIDs(), "a template died")
		for _, pid := range templates {
			require.True(t, processAlive(pid), "template %d died", pid)
		}
	}

	// Harmless probes first: if signal scoping failed here, the lethal
	// probes below would kill the test run, so they are skipped.
	scoped := t.Run("existence probes", func(t *testing.T) {
		r := attack(t, `attempt("kill pool 0", lambda: os.kill(pool, 0))
attempt("kill template 0", lambda: os.kill(tpl, 0))
attempt("kill victim 0", lambda: os.kill(victim, 0))
attempt("kill pool SIGCONT", lambda: os.kill(pool, signal.SIGCONT))
attempt("control kill self 0", lambda: os.kill(os.getpid(), 0))
`)
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			// ESRCH: with templates in PID namespaces of their own, the
			// pool and the other template's job are not even visible.
			"kill pool 0":         {"EPERM", "ESRCH"},
			"kill template 0":     {"EPERM"},
			"kill victim 0":       {"EPERM", "ESRCH"},
			"kill pool SIGCONT":   {"EPERM", "ESRCH"},
			"control kill self 0": {"ok"},
		})
		survivors(t)
	})
	lethal := func(name, body string, check func(t *testing.T, r *Result)) {
		t.Run(name, func(t *testing.T) {
			if !scoped {
				t.Skip("signal scoping failed the harmless probes; a lethal probe would kill the test run")
			}
			check(t, attack(t, body))
			survivors(t)
		})
	}
	lethal("kill pool, template and victim", `attempt("kill pool SIGKILL", lambda: os.kill(pool, signal.SIGKILL))
attempt("kill template SIGKILL", lambda: os.kill(tpl, signal.SIGKILL))
attempt("kill victim SIGKILL", lambda: os.kill(victim, signal.SIGKILL))
attempt("killpg template group", lambda: os.killpg(tpl, signal.SIGKILL))
attempt("killpg pool group", lambda: os.killpg(os.getpgid(pool), signal.SIGKILL))
attempt("killpg victim group", lambda: os.killpg(victim, signal.SIGKILL))
sc("tgkill template", 234, tpl, tpl, 9)
sc("tkill victim", 200, victim, 9)
info = ctypes.create_string_buffer(128)
sc("rt_sigqueueinfo template", 129, tpl, 9, info)
sc("rt_tgsigqueueinfo pool", 297, pool, pool, 9, info)
`, func(t *testing.T, r *Result) {
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			// ESRCH: in a PID namespace of its own the job cannot see
			// the pool nor the other job, and killpg(1) is kill(-1).
			"kill pool SIGKILL":        {"EPERM", "ESRCH"},
			"kill template SIGKILL":    {"EPERM"},
			"kill victim SIGKILL":      {"EPERM", "ESRCH"},
			"killpg template group":    {"EPERM", "ESRCH"},
			"killpg pool group":        {"EPERM", "ESRCH"},
			"killpg victim group":      {"EPERM", "ESRCH"},
			"tgkill template":          {"EPERM"},
			"tkill victim":             {"EPERM", "ESRCH"},
			"rt_sigqueueinfo template": {"EPERM"},
			"rt_tgsigqueueinfo pool":   {"EPERM"},
		})
	})
	lethal("kill every pid", `me = os.getpid()
hit = []
for pid in range(2, 1 << 15):
    if pid == me:
        continue
    try:
        os.kill(pid, signal.SIGKILL)
        hit.append(pid)
    except OSError:
        pass
R["pids killed"] = str(hit)
`, func(t *testing.T, r *Result) {
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{"pids killed": {"[]"}})
	})
	lethal("kill(-1, SIGKILL)", `attempt("kill -1", lambda: os.kill(-1, signal.SIGKILL))
`, func(t *testing.T, r *Result) {
		requireOK(t, r)
		// Linux's kill(-1) returns 0 even when every target refused the
		// signal with EPERM (kernel/signal.c, kill_something_info), so
		// success says nothing: survivors is the check.
		advExpect(t, advProbes(t, r), map[string][]string{"kill -1": {"ok", "EPERM", "ESRCH"}})
	})
	lethal("kill(0, SIGKILL) kills only the job", `os.kill(0, signal.SIGKILL)
time.sleep(5)
R["survived its own group kill"] = "yes"
`, func(t *testing.T, r *Result) {
		requireErrorType(t, r, "SignalError")
		require.Contains(t, r.Error.Message, "SIGKILL")
		require.NotContains(t, r.Stdout, "survived")
	})
	// SIGIO/SIGURG delivery chosen by F_SETOWN is a signal too; Landlock
	// scopes it by the domain of the process that set the owner.
	lethal("F_SETOWN signal delivery", `import fcntl
F_SETSIG = 10
def owner(target, sig):
    r, w = os.pipe()
    fcntl.fcntl(r, fcntl.F_SETOWN, target)
    if sig:
        fcntl.fcntl(r, F_SETSIG, sig)
    fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)
    os.write(w, b"x")
    time.sleep(0.05)
for name, target, sig in (("template SIGIO", tpl, 0), ("template group SIGIO", -tpl, 0),
                          ("template SIGKILL", tpl, signal.SIGKILL), ("victim SIGKILL", victim, signal.SIGKILL),
                          ("pool SIGKILL", pool, signal.SIGKILL)):
    attempt("F_SETOWN " + name, lambda: owner(target, sig))
`, func(t *testing.T, r *Result) {
		requireOK(t, r)
		// Setting the owner succeeds; what matters is that no signal was
		// delivered, which survivors checks (and this test still running).
		advExpect(t, advProbes(t, r), map[string][]string{
			"F_SETOWN template SIGIO":       {"ok", "EPERM"},
			"F_SETOWN template group SIGIO": {"ok", "EPERM"},
			"F_SETOWN template SIGKILL":     {"ok", "EPERM"},
			"F_SETOWN victim SIGKILL":       {"ok", "EPERM", "ESRCH"},
			"F_SETOWN pool SIGKILL":         {"ok", "EPERM", "ESRCH"},
		})
	})

	require.NoError(t, os.WriteFile(filepath.Join(shared, "stop"), nil, 0o644))
	vr := <-victimDone
	requireOK(t, vr)
	require.Equal(t, "victim survived\n", vr.Stdout)
	require.Equal(t, templates, p.templatePIDs())
	advServes(t, p)
}

func TestHostileCrossJob(t *testing.T) {
	t.Run("another job's process", func(t *testing.T) {
		p := newTestPool(t, Config{Workers: 2})
		shared := filepath.Join(p.cfg.Dir, "shared")
		require.NoError(t, os.Mkdir(shared, 0o755))
		const secret = "hunter2-cross-job-secret"
		aDone := make(chan *Result, 1)
		go func() {
			aDone <- run(t, p, Job{ID: "A", Env: map[string]string{"A_SECRET": secret}, AllowWrite: []string{"shared"}, Code: `import os, time
token = os.environ["A_SECRET"] * 3  # also on A's heap
open("shared/a.pid", "w").write(os.readlink("/proc/self"))
deadline = time.time() + 60
while not os.path.exists("shared/stop") and time.time() < deadline:
    time.sleep(0.02)
print("A done", len(token))
`})
		}()
		require.Eventually(t, func() bool {
			b, err := os.ReadFile(filepath.Join(shared, "a.pid"))
			return err == nil && len(b) > 0
		}, 30*time.Second, 10*time.Millisecond)

		r := run(t, p, Job{ID: "B", AllowRead: []string{"shared"}, Code: advCode(`import signal
a = int(open("shared/a.pid").read())
proc = "/proc/%d/" % a
def read(name, n=4096):
    with open(proc + name, "rb") as f:
        return f.read(n)
def mem():
    with open(proc + "mem", "rb") as f:
        f.seek(id(None))
        return f.read(64)
attempt("read mem", mem)
attempt("read environ", lambda: read("environ"))
attempt("read cmdline", lambda: read("cmdline"))
attempt("read status", lambda: read("status"))
attempt("read maps", lambda: read("maps"))
attempt("read stack", lambda: read("stack"))
attempt("read io", lambda: read("io"))
attempt("list fd", lambda: os.listdir(proc + "fd"))
attempt("list root", lambda: os.listdir(proc + "root"))
attempt("readlink cwd", lambda: os.readlink(proc + "cwd"))
attempt("readlink exe", lambda: os.readlink(proc + "exe"))
attempt("readlink fd 3", lambda: os.readlink(proc + "fd/3"))
attempt("open fd 1", lambda: open(proc + "fd/1", "w").write("forged"))
attempt("list task", lambda: os.listdir(proc + "task"))
attempt("kill 0", lambda: os.kill(a, 0))
sc("ptrace attach", 101, 16, a, 0, 0)
sc("pidfd_open", 434, a, 0)
buf = ctypes.create_string_buffer(64)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
sc("process_vm_readv", 310, a, ctypes.byref(iovec(ctypes.addressof(buf), 64)), 1, ctypes.byref(iovec(id(None), 64)), 1, 0)
`)})
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			"read mem": {"EACCES"}, "read environ": {"EACCES"}, "read cmdline": {"EACCES"}, "read status": {"EACCES"},
			"read maps": {"EACCES"}, "read stack": {"EACCES"}, "read io": {"EACCES"}, "list fd": {"EACCES"},
			"list root": {"EACCES"}, "readlink cwd": {"EACCES"}, "readlink exe": {"EACCES"}, "readlink fd 3": {"EACCES"},
			"open fd 1": {"EACCES"}, "list task": {"EACCES"}, "kill 0": {"EPERM", "ESRCH"},
			"ptrace attach": {"EPERM"}, "pidfd_open": {"EPERM"}, "process_vm_readv": {"EPERM"},
		})
		require.NotContains(t, r.Stdout+r.Stderr, "hunter2")

		require.NoError(t, os.WriteFile(filepath.Join(shared, "stop"), nil, 0o644))
		ra := <-aDone
		requireOK(t, ra)
		require.Equal(t, fmt.Sprintf("A done %d\n", 3*len(secret)), ra.Stdout, "job A was disturbed")
		advServes(t, p)
	})

	t.Run("interpreter state", func(t *testing.T) {
		// One worker: the next job is forked from the same template.
		p := newTestPool(t, Config{Workers: 1})
		dir := p.cfg.Dir
		unique := fmt.Sprintf("pynox-leak-%d-%d", os.Getpid(), time.Now().UnixNano())
		files := []string{filepath.Join("/tmp", unique), filepath.Join("/dev/shm", unique), filepath.Join("/var/tmp", unique),
			filepath.Join(dir, unique), filepath.Join(os.Getenv("HOME")+"/", unique)}
		filesPy := "["
		for _, f := range files {
			filesPy += fmt.Sprintf("%q, ", f)
		}
		filesPy += "]"
		r := run(t, p, Job{Code: advCode(`import atexit, builtins, json, linecache, signal, types
LEAK = "global"
json.LEAK = "module attribute"
builtins.LEAK = "builtin"
sys.modules["pynox_leak"] = types.ModuleType("pynox_leak")
os.environ["LEAK"] = "environ"
os.putenv("LEAK2", "putenv")
sys.path.insert(0, "/leak")
sys.setrecursionlimit(123456)
os.chdir("/")
os.umask(0o777)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
atexit.register(print, "LEAKED atexit")
linecache.cache["leak"] = (1, None, ["leak\n"], "leak")
for f in ` + filesPy + `:
    attempt("write " + f, lambda: open(f, "w").write("leak"))
`)})
		requireOK(t, r)
		got := advProbes(t, r)
		for _, f := range files {
			require.Contains(t, []string{"EACCES", "ENOENT"}, got["write "+f], f)
			require.NoFileExists(t, f)
		}
		require.NotContains(t, r.Stdout, "LEAKED atexit")

		r = run(t, p, Job{Code: `import builtins, json, linecache, os, signal, sys
seen = []
if "LEAK" in globals(): seen.append("global")
if hasattr(json, "LEAK"): seen.append("module attribute")
if hasattr(builtins, "LEAK"): seen.append("builtin")
if "pynox_leak" in sys.modules: seen.append("sys.modules")
if "LEAK" in os.environ or "LEAK2" in os.environ: seen.append("environ")
if "/leak" in sys.path: seen.append("sys.path")
if sys.getrecursionlimit() == 123456: seen.append("recursion limit")
if os.getcwd() == "/": seen.append("cwd")
old = os.umask(0o022)
if old == 0o777: seen.append("umask")
if signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN: seen.append("signal handler")
if "leak" in linecache.cache: seen.append("linecache")
for f in ` + filesPy + `:
    if os.path.exists(f): seen.append(f)
print("seen", seen)
`})
		requireOK(t, r)
		require.Equal(t, "seen []\n", r.Stdout)
		advServes(t, p)
	})

	// System V IPC and POSIX message queues live outside the filesystem
	// and Landlock, in the host's IPC namespace: a channel between jobs
	// (and a persistent leak on the host) unless seccomp denies them.
	t.Run("kernel IPC objects", func(t *testing.T) {
		p := newTestPool(t, Config{Workers: 1})
		key := 0x70790000 | (os.Getpid() & 0xffff)
		mq := fmt.Sprintf("pynox-leak-%d", os.Getpid())
		t.Cleanup(func() { advRemoveIPC(key, mq) })
		common := fmt.Sprintf("KEY = %d\nMQ = %q\nIPC_CREAT = 0o1000\n", key, mq)
		r := run(t, p, Job{Code: advCode(common + `import struct
addr = None
shmid = sc("shmget create", 29, KEY, 4096, IPC_CREAT | 0o666)
if shmid >= 0:
    _libc.shmat.restype = ctypes.c_void_p
    addr = _libc.shmat(shmid, None, 0)
    if addr not in (None, ctypes.c_void_p(-1).value):
        ctypes.memmove(addr, b"hunter2-shm", 11)
        R["shm write"] = "ok"
msq = sc("msgget create", 68, KEY, IPC_CREAT | 0o666)
if msq >= 0:
    msg = ctypes.create_string_buffer(struct.pack("<q", 1) + b"hunter2-msg")
    sc("msgsnd", 69, msq, msg, 11, 0)
sem = sc("semget create", 64, KEY, 1, IPC_CREAT | 0o666)
if sem >= 0:
    sc("semctl setval", 66, sem, 0, 16, 42)
sc("mq_open create", 240, MQ, os.O_CREAT | os.O_RDWR, 0o666, 0)
`)})
		requireOK(t, r)
		t.Logf("first job: %v", advProbes(t, r))
		// The objects must not outlive the job that made them...
		if _, err := unix.SysvShmGet(key, 0, 0); !errors.Is(err, unix.ENOENT) {
			t.Errorf("a job's shared memory segment outlived it on the host (shmget: %v)", err)
		}
		// ...nor be reachable from the next job.
		r = run(t, p, Job{Code: advCode(common + `R["shm content"] = R["msg content"] = "none"
shmid = sc("shmget existing", 29, KEY, 0, 0)
if shmid >= 0:
    _libc.shmat.restype = ctypes.c_void_p
    addr = _libc.shmat(shmid, None, 0)
    R["shm content"] = ctypes.string_at(addr, 11).decode(errors="replace")
msq = sc("msgget existing", 68, KEY, 0)
if msq >= 0:
    buf = ctypes.create_string_buffer(64)
    n = _libc.syscall(ctypes.c_long(70), ctypes.c_long(msq), buf, ctypes.c_long(32), ctypes.c_long(0), ctypes.c_long(0o4000))
    R["msg content"] = buf.raw[8:8 + max(n, 0)].decode(errors="replace")
sc("semget existing", 64, KEY, 0, 0)
sc("mq_open existing", 240, MQ, os.O_RDONLY, 0, 0)
`)})
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			"shmget existing": {"ENOENT", "EPERM"}, "msgget existing": {"ENOENT", "EPERM"},
			"semget existing": {"ENOENT", "EPERM"}, "mq_open existing": {"ENOENT", "EPERM", "EACCES"},
			"shm content": {"none"}, "msg content": {"none"},
		})
		advServes(t, p)
	})
}

// advRemoveIPC removes the IPC objects a hole probe may have left on the
// host.
func advRemoveIPC(key int, mq string) {
	if id, err := unix.SysvShmGet(key, 0, 0); err == nil {
		_, _ = unix.SysvShmCtl(id, unix.IPC_RMID, nil)
	}
	if id, _, errno := unix.Syscall(unix.SYS_MSGGET, uintptr(key), 0, 0); errno == 0 {
		_, _, _ = unix.Syscall(unix.SYS_MSGCTL, id, unix.IPC_RMID, 0)
	}
	if id, _, errno := unix.Syscall(unix.SYS_SEMGET, uintptr(key), 0, 0); errno == 0 {
		_, _, _ = unix.Syscall6(unix.SYS_SEMCTL, id, 0, unix.IPC_RMID, 0, 0, 0)
	}
	if name, err := unix.BytePtrFromString(mq); err == nil {
		_, _, _ = unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(name)), 0, 0)
	}
}

func TestHostileResources(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	dir := p.cfg.Dir

	t.Run("memory bomb", func(t *testing.T) {
		start := time.Now()
		r := run(t, p, Job{Code: "x = []\nwhile True:\n    x.append(' ' * (1 << 20) + str(len(x)))\n", Memory: 256 << 20})
		requireErrorType(t, r, "MemoryError")
		require.Contains(t, r.Error.Hint, "256 MiB")
		require.Less(t, time.Since(start), 20*time.Second)
		advServes(t, p)
	})
	smallObjects := "x = []\nwhile True:\n    x.append([len(x)] * 64)\n"
	t.Run("memory bomb of small objects", func(t *testing.T) {
		r := run(t, p, Job{Code: smallObjects, Memory: 128 << 20})
		requireErrorType(t, r, "MemoryError")
		require.Contains(t, r.Error.Hint, "128 MiB")
		advServes(t, p)
	})
	t.Run("memory bomb of small objects is contained", func(t *testing.T) {
		start := time.Now()
		r := run(t, p, Job{Code: smallObjects, Memory: 128 << 20})
		t.Logf("small-object memory bomb: exit %d, error %+v, stderr %q", r.Exit, r.Error, r.Stderr)
		require.False(t, r.Error == nil && r.Exit == 0, "the job cannot have succeeded")
		require.Less(t, time.Since(start), 20*time.Second)
		advServes(t, p)
	})
	recursion := "import sys\nsys.setrecursionlimit(10**6)\ndef f(n):\n    return f(n + 1) + 1\nf(0)\n"
	t.Run("deep recursion", func(t *testing.T) {
		start := time.Now()
		r := run(t, p, Job{Code: recursion, Timeout: 10 * time.Second})
		require.NotNil(t, r.Error)
		require.Contains(t, []string{"RecursionError", "MemoryError", "SignalError"}, r.Error.Type, r.Error.Message)
		t.Logf("Python recursion: %s in %s", r.Error.Type, time.Since(start))
		advServes(t, p)
	})
	t.Run("deep recursion is contained", func(t *testing.T) {
		start := time.Now()
		r := run(t, p, Job{Code: recursion, Timeout: 3 * time.Second})
		require.NotNil(t, r.Error)
		require.Contains(t, []string{"RecursionError", "MemoryError", "SignalError", "TimeoutError"}, r.Error.Type, r.Error.Message)
		t.Logf("Python recursion under a 3s timeout: %s in %s", r.Error.Type, time.Since(start))
		require.Less(t, time.Since(start), 10*time.Second)
		advServes(t, p)
	})
	t.Run("deep C recursion", func(t *testing.T) {
		// repr of a deeply nested list recurses in C: with the limit raised
		// this overflows the C stack.
		r := run(t, p, Job{Code: "import sys\nsys.setrecursionlimit(10**6)\nx = []\nfor _ in range(10**6):\n    x = [x]\nprint(len(repr(x)))\n"})
		require.NotNil(t, r.Error, "stdout: %s", r.Stdout)
		require.Contains(t, []string{"RecursionError", "MemoryError", "SignalError"}, r.Error.Type, r.Error.Message)
		if r.Error.Type == "SignalError" {
			require.Contains(t, r.Error.Message, "SIGSEGV")
		}
		t.Logf("C recursion: %s %s", r.Error.Type, r.Error.Message)
		advServes(t, p)
	})
	t.Run("100 MB of output", func(t *testing.T) {
		start := time.Now()
		r := run(t, p, Job{Code: `import os
chunk = b"x" * (1 << 20)
for _ in range(100):
    os.write(1, chunk)
    os.write(2, chunk)
print("end", flush=True)
`, MaxOutput: 4096})
		took := time.Since(start)
		t.Logf("200 MB of output captured in %s", took)
		requireOK(t, r)
		require.Len(t, r.Stdout, 4096)
		require.Len(t, r.Stderr, 4096)
		require.True(t, r.StdoutTruncated)
		require.True(t, r.StderrTruncated)
		require.Equal(t, strings.Repeat("x", 4096), r.Stdout)
		require.Less(t, took, 30*time.Second)
		advServes(t, p)
	})
	t.Run("1 GiB file under a 10 MiB limit", func(t *testing.T) {
		require.NoError(t, os.Mkdir(filepath.Join(dir, "out"), 0o755))
		big := filepath.Join(dir, "out", "big")
		r := run(t, p, Job{Code: advCode(`chunk = b"x" * (1 << 20)
def write():
    with open("out/big", "wb") as f:
        for _ in range(1024):
            f.write(chunk)
attempt("write 1 GiB", write)
def sparse():
    with open("out/sparse", "wb") as f:
        f.seek(1 << 30)
        f.write(b"x")
attempt("sparse write at 1 GiB", sparse)
def grow():
    fd = os.open("out/grown", os.O_WRONLY | os.O_CREAT, 0o644)
    os.ftruncate(fd, 1 << 30)
attempt("ftruncate to 1 GiB", grow)
def falloc():
    fd = os.open("out/falloc", os.O_WRONLY | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, 1 << 30)
attempt("fallocate 1 GiB", falloc)
import resource
attempt("raise RLIMIT_FSIZE", lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 40, 1 << 40)))
`), AllowWrite: []string{"out"}, MaxFileSize: 10 << 20})
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			"write 1 GiB":           {"EFBIG"},
			"sparse write at 1 GiB": {"EFBIG"},
			"ftruncate to 1 GiB":    {"EFBIG"},
			"fallocate 1 GiB":       {"EFBIG"},
			"raise RLIMIT_FSIZE":    {"ValueError"},
		})
		for _, name := range []string{"big", "sparse", "grown", "falloc"} {
			st, err := os.Stat(filepath.Join(dir, "out", name))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			require.NoError(t, err)
			require.LessOrEqual(t, st.Size(), int64(10<<20), name)
			require.LessOrEqual(t, st.Sys().(*syscall.Stat_t).Blocks*512, int64(10<<20)+1<<20, name)
		}
		st, err := os.Stat(big)
		require.NoError(t, err)
		require.Equal(t, int64(10<<20), st.Size())
		// The uncaught form reports OSError with the errno's hint.
		r = run(t, p, Job{Code: "open('out/big2', 'wb').write(b'x' * (11 << 20))", AllowWrite: []string{"out"}, MaxFileSize: 10 << 20})
		requireErrorType(t, r, "OSError")
		require.Contains(t, r.Error.Message, "File too large")
		require.Contains(t, r.Error.Hint, "max_file_size")
		advServes(t, p)
	})
	t.Run("CPU spin ignoring signals", func(t *testing.T) {
		start := time.Now()
		r := run(t, p, Job{Code: `import signal
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGXCPU, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1):
    signal.signal(s, lambda *a: None)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT])
print("spinning", flush=True)
while True:
    pass
`, Timeout: 500 * time.Millisecond})
		took := time.Since(start)
		requireErrorType(t, r, "TimeoutError")
		require.Equal(t, -1, r.Exit)
		require.Equal(t, "spinning\n", r.Stdout)
		require.Less(t, took, 5*time.Second)
		t.Logf("CPU spin killed after %s", took)
		advServes(t, p)
	})
	st := p.Stats()
	require.Equal(t, st.Jobs, st.OK+st.Failed+st.Timeouts+st.Signals+st.RequestErrors+st.WorkerErrors)
	require.Zero(t, st.WorkerErrors)
}

// advForger writes forged pool results, host-call events and control
// frames to every descriptor it can reach, raw, newline-delimited and
// length-prefixed, naming the ids of other jobs in the same stream.
const advForger = `import json, os, socket, struct, time
victims = json.loads(os.environ["VICTIMS"])
objs = [{"t": "done", "exit": 0, "error": None}, {"t": "started"}, {"t": "setup_error", "msg": "x"},
        {"t": "spare", "pid": 1}, {"t": "exit", "pid": os.getppid(), "code": 0}, {"t": "fatal", "msg": "x"},
        {"t": "call", "call_id": 1, "function": "rm", "args": ["-rf", "/"]}, {"t": "fork"},
        {"event": "ready", "workers": 99, "runtime": "pynox"},
        {"id": "forged-stats", "event": "stats", "jobs": 0},
        {"event": "call", "id": "forged-call", "call_id": 7, "function": "rm", "args": ["/"], "kwargs": {}}]
for i, v in enumerate(victims):
    objs.append({"id": v, "exit": 0, "stdout": "FORGED", "stderr": "", "error": None})
    objs.append({"event": "call", "id": v, "call_id": i, "function": "exfiltrate", "args": [], "kwargs": {}})
    objs.append({"id": "forged-%d" % i, "exit": 0, "stdout": "FORGED", "error": None})
forgeries = []
for o in objs:
    data = json.dumps(o).encode()
    forgeries += [data, b"\n" + data + b"\n", struct.pack("<I", len(data)) + data]
hit = 0
for fd in range(0, 1024):
    if fd == 3:
        continue  # the control channel last: breaking it ends this job
    for f in forgeries:
        try:
            os.write(fd, f)
            hit += 1
        except OSError:
            pass
mode = os.environ["MODE"]
if mode == "rights":
    s = socket.socket(fileno=3)
    for _ in range(200):
        try:
            socket.send_fds(s, [b"\0\0\0\0"], [0, 1, 2])
        except OSError:
            break
elif mode == "huge":
    os.write(3, b"\xff\xff\xff\x7f" + b"A" * 4096)
elif mode == "frames":
    for f in forgeries:
        try:
            os.write(3, f)
        except OSError:
            break
print("wrote", hit, flush=True)
time.sleep(0.2)
`

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

// advSteadyFDs waits until the descriptor count holds still for 200ms.
func advSteadyFDs(t testing.TB) int {
	t.Helper()
	n, since := advFDs(t), time.Now()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := advFDs(t); m != n {
			n, since = m, time.Now()
		} else if time.Since(since) > 200*time.Millisecond {
			break
		}
	}
	return n
}

// advFDs counts the test process's open descriptors.
func advFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents) - 1 // the directory being read
}

// A job that queues its own pipe ends on its control socket used to wedge
// its worker for good (found by this suite): the host now closes the
// socket once it stops reading it and bounds the wait for the pipes.
func TestHostileProtocolDescriptorPassing(t *testing.T) {
	requireSandbox(t)
	// Not newTestPool: if the hole is open, Close would hang with the
	// wedged job, so the pool is closed only when the job came back.
	p, err := New(Config{Workers: 1, Dir: t.TempDir(), Python: testPython()})
	require.NoError(t, err)
	fds := advWarm(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan *Result, 1)
	go func() {
		r, _ := p.Run(ctx, Job{Code: advForger, Env: map[string]string{"VICTIMS": `["x"]`, "MODE": "rights"}, Timeout: 2 * time.Second})
		done <- r
	}()
	select {
	case r := <-done:
		defer p.Close()
		require.NotNil(t, r, "the caller's context ended first")
		if typ := r.Err(); r.Error != nil {
			require.Equal(t, "PoolWorkerError", r.Error.Type, "%v", typ)
		}
		require.Equal(t, fds, advSteadyFDs(t), "descriptors the job sent landed in the host")
		advServes(t, p)
	case <-time.After(15 * time.Second):
		t.Fatal("Pool.Run did not return 13s after its job's timeout and the caller's context: the worker is wedged")
	}
}
