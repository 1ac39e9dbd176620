package pynox

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// mountFixture is a pool with a read-only mount "data" (holding in.txt),
// a read-write mount "out", and a secret directory beside them, beneath
// the ceiling but granted to no job.
type mountFixture struct {
	p                    *Pool
	data, out, secretDir string
	secret               advFile
	inFile               advFile
}

func newMountFixture(t *testing.T) *mountFixture {
	t.Helper()
	p := newTestPool(t, Config{Workers: 1})
	dir := p.Config().Dir
	f := &mountFixture{p: p, data: filepath.Join(dir, "data"), out: filepath.Join(dir, "out"), secretDir: filepath.Join(dir, "secret")}
	for _, d := range []string{f.data, f.out, f.secretDir} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	f.secret = advSecret(t, filepath.Join(f.secretDir, "key"), "TOPSECRET-mounts")
	f.inFile = advSecret(t, filepath.Join(f.data, "in.txt"), "input")
	return f
}

func (f *mountFixture) mounts() []MountSpec {
	return []MountSpec{{HostPath: f.data}, {HostPath: f.out, Mode: ReadWrite}}
}

// run runs code with the fixture's mounts; DATA, OUT and SECRET name the
// directories in it.
func (f *mountFixture) run(t *testing.T, code string, timeout time.Duration) *Result {
	t.Helper()
	prefix := "import os, errno\nDATA, OUT, SECRET = " + pyQuote(f.data) + ", " + pyQuote(f.out) + ", " + pyQuote(f.secretDir) + "\n" +
		"def attempt(what, fn):\n" +
		"    try:\n" +
		"        r = fn()\n" +
		"        print(what, 'allowed', repr(r)[:80])\n" +
		"    except OSError as e:\n" +
		"        print(what, 'denied', errno.errorcode.get(e.errno, e.errno))\n"
	return run(t, f.p, Job{Code: prefix + code, Mounts: f.mounts(), Timeout: timeout})
}

// lines maps each printed "what verdict ..." line to its verdict.
func verdicts(t *testing.T, r *Result) map[string]string {
	t.Helper()
	requireOK(t, r)
	out := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		fs := strings.Fields(l)
		require.GreaterOrEqual(t, len(fs), 2, "line %q", l)
		out[fs[0]] = fs[1]
	}
	return out
}

// Symlinks and ".." planted in a writable mount, pointing out of it, lead
// nowhere: Landlock judges the file reached, not the path.
func TestHostileMountsSymlinkAndDotDot(t *testing.T) {
	t.Parallel()
	f := newMountFixture(t)
	r := f.run(t, `
os.symlink(SECRET, OUT + "/dirlink")
os.symlink(SECRET + "/key", OUT + "/filelink")
os.symlink("../secret/key", OUT + "/rellink")
attempt("read_dirlink", lambda: open(OUT + "/dirlink/key").read())
attempt("read_filelink", lambda: open(OUT + "/filelink").read())
attempt("read_rellink", lambda: open(OUT + "/rellink").read())
attempt("write_filelink", lambda: open(OUT + "/filelink", "a").write("x"))
attempt("create_via_dirlink", lambda: open(OUT + "/dirlink/planted", "w"))
attempt("read_dotdot", lambda: open(OUT + "/../secret/key").read())
attempt("read_data_dotdot", lambda: open(DATA + "/../secret/key").read())
attempt("list_dotdot", lambda: os.listdir(OUT + "/.."))
attempt("read_own", lambda: open(DATA + "/in.txt").read())
`, 0)
	require.Equal(t, map[string]string{
		"read_dirlink": "denied", "read_filelink": "denied", "read_rellink": "denied", "write_filelink": "denied",
		"create_via_dirlink": "denied", "read_dotdot": "denied", "read_data_dotdot": "denied", "list_dotdot": "denied",
		"read_own": "allowed",
	}, verdicts(t, r))
	require.NotContains(t, r.Stdout, "TOPSECRET")
	requireUnchanged(t, f.secret, filepath.Join(f.secretDir, "key"))
	require.NoFileExists(t, filepath.Join(f.secretDir, "planted"))
	advServes(t, f.p)
}

// Renaming out of a mount (into an ungranted directory, into scratch
// from a read-only mount, the mount itself) and hard links to files
// outside it fail; nothing on the host changes.
func TestHostileMountsRenameAndHardLinks(t *testing.T) {
	t.Parallel()
	f := newMountFixture(t)
	require.NoError(t, os.WriteFile(filepath.Join(f.out, "mine"), []byte("x"), 0o644))
	r := f.run(t, `
T = os.environ["TMPDIR"]
attempt("rename_out_to_secret", lambda: os.rename(OUT + "/mine", SECRET + "/mine"))
attempt("rename_data_to_scratch", lambda: os.rename(DATA + "/in.txt", T + "/in.txt"))
attempt("rename_data_to_out", lambda: os.rename(DATA + "/in.txt", OUT + "/in.txt"))
attempt("rename_mount_itself", lambda: os.rename(OUT, OUT + ".moved"))
attempt("rename_data_itself", lambda: os.rename(DATA, T + "/data"))
attempt("link_secret_into_out", lambda: os.link(SECRET + "/key", OUT + "/key"))
attempt("link_data_into_out", lambda: os.link(DATA + "/in.txt", OUT + "/in.txt"))
attempt("link_data_into_scratch", lambda: os.link(DATA + "/in.txt", T + "/in.txt"))
attempt("link_out_into_secret", lambda: os.link(OUT + "/mine", SECRET + "/mine"))
`, 0)
	got := verdicts(t, r)
	for what, v := range got {
		require.Equal(t, "denied", v, what)
	}
	require.Len(t, got, 9)
	requireUnchanged(t, f.secret, filepath.Join(f.secretDir, "key"))
	requireUnchanged(t, f.inFile, filepath.Join(f.data, "in.txt"))
	require.FileExists(t, filepath.Join(f.out, "mine"))
	require.NoFileExists(t, filepath.Join(f.secretDir, "mine"))
	require.NoFileExists(t, filepath.Join(f.out, "in.txt"))
	require.NoFileExists(t, filepath.Join(f.out, "key"))
	advServes(t, f.p)
}

// A FIFO in a mount hangs neither the job (a blocking open is ended by
// its timeout; a non-blocking one returns) nor the pool; a unix socket in
// a mount cannot be reached.
func TestHostileMountsFIFOAndSocket(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	f := newMountFixture(t)
	require.NoError(t, unix.Mkfifo(filepath.Join(f.data, "fifo"), 0o666))
	sock := filepath.Join(f.out, "s.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan struct{})
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
			close(accepted)
		}
	}()
	r := f.run(t, `
import socket
attempt("fifo_nonblocking", lambda: os.read(os.open(DATA + "/fifo", os.O_RDONLY | os.O_NONBLOCK), 10))
attempt("socket_connect", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(OUT + "/s.sock"))
attempt("fifo_write_ro", lambda: os.open(DATA + "/fifo", os.O_WRONLY | os.O_NONBLOCK))
`, 0)
	require.Equal(t, map[string]string{"fifo_nonblocking": "allowed", "socket_connect": "denied", "fifo_write_ro": "denied"}, verdicts(t, r))
	r = f.run(t, "open(DATA + '/fifo').read()\n", 2*time.Second)
	requireErrorType(t, r, "TimeoutError")
	select {
	case <-accepted:
		t.Fatal("a job connected to a host socket in its mount")
	default:
	}
	advServes(t, f.p)
}

// The host swapping the mounted directory for a symlink after the
// request was accepted redirects nothing: the job's rule holds the
// directory the pool opened then, not the name.
func TestHostileMountsSwappedForSymlink(t *testing.T) {
	t.Parallel()
	f := newMountFixture(t)
	c, err := f.p.Checkout(t.Context(), Job{Mounts: f.mounts()})
	require.NoError(t, err)
	defer c.Finish(t.Context())
	// Accepted: now the host moves both mounts away and puts symlinks to
	// the secret directory in their place.
	for _, d := range []string{f.data, f.out} {
		require.NoError(t, os.Rename(d, d+".old"))
		require.NoError(t, os.Symlink(f.secretDir, d))
	}
	ev, err := c.Feed(t.Context(), Step{Code: "import os, errno\nDATA, OUT = " + pyQuote(f.data) + ", " + pyQuote(f.out) + `
for what, fn in [("read_data", lambda: open(DATA + "/key").read()),
                 ("read_out", lambda: open(OUT + "/key").read()),
                 ("write_out", lambda: open(OUT + "/planted", "w")),
                 ("read_moved", lambda: open(DATA + ".old/in.txt").read()),
                 ("write_moved", lambda: open(OUT + ".old/new", "w").write("y"))]:
    try:
        fn()
        print(what, "allowed")
    except OSError as e:
        print(what, "denied", errno.errorcode.get(e.errno))
`})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"read_data": "denied", "read_out": "denied", "write_out": "denied",
		"read_moved": "allowed", "write_moved": "allowed"}, verdicts(t, ev.Result))
	require.NotContains(t, ev.Result.Stdout, "TOPSECRET")
	requireUnchanged(t, f.secret, filepath.Join(f.secretDir, "key"))
	require.NoFileExists(t, filepath.Join(f.secretDir, "planted"))
}

// A job cannot get out of its scratch directory or redirect the pool's
// cleanup: it cannot remove or rename the directory itself, plant
// anything beside it, or reach the pool's scratch directory; and a link
// inside it pointing out leads nowhere.
func TestHostileMountsScratchEscape(t *testing.T) {
	t.Parallel()
	f := newMountFixture(t)
	r := f.run(t, `
T = os.environ["TMPDIR"]
ROOT = os.path.dirname(T)
os.symlink(SECRET, T + "/out")
attempt("rmdir_own", lambda: os.rmdir(T))
attempt("rename_own", lambda: os.rename(T, ROOT + "/mine"))
attempt("plant_beside", lambda: open(ROOT + "/planted", "w"))
attempt("symlink_beside", lambda: os.symlink(SECRET, ROOT + "/j999"))
attempt("mkdir_beside", lambda: os.mkdir(ROOT + "/j999"))
attempt("list_root", lambda: os.listdir(ROOT))
attempt("read_through_link", lambda: open(T + "/out/key").read())
attempt("rename_into_out", lambda: os.rename(T + "/out", OUT + "/out"))
`, 0)
	got := verdicts(t, r)
	require.Len(t, got, 8)
	for what, v := range got {
		if what == "rename_into_out" {
			continue // moving its own symlink into a writable mount is allowed; it still leads nowhere
		}
		require.Equal(t, "denied", v, what)
	}
	require.NotContains(t, r.Stdout, "TOPSECRET")
	requireUnchanged(t, f.secret, filepath.Join(f.secretDir, "key"))
	requireScratchEmpty(t, f.p, "scratch left behind")
	ents, err := os.ReadDir(f.p.scratch.path)
	require.NoError(t, err)
	for _, e := range ents {
		require.True(t, e.IsDir() && strings.HasPrefix(e.Name(), "j"), "%s in the pool's scratch directory", e.Name())
	}
}
