package pynox

// Adversarial suite (helpers in hostile_test.go): the file system, reads,
// writes, links and renames outside the grants.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

func TestHostileFiles(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
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
