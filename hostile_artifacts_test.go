package pynox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// filesByName maps a result's files by base name.
func filesByName(res *Result) map[string]File {
	m := map[string]File{}
	for _, f := range res.Files {
		m[filepath.Base(f.Path)] = f
	}
	return m
}

// TestCollectGlob: files matching Collect beneath a write grant or the
// scratch directory are attached, with their paths and contents; others
// are not.
func TestCollectGlob(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	out := filepath.Join(p.cfg.Dir, "out")
	require.NoError(t, os.Mkdir(out, 0o755))
	res := run(t, p, Job{AllowWrite: []string{"out"}, Collect: []string{"out/*.csv", "$TMPDIR/sub/*.txt", "out/x..y.dat"}, Code: `
import os
open("out/x..y.dat", "w").write("dots")
for n in ("a.csv", "b.csv", "c.txt"):
    open("out/" + n, "w").write("x,y\n" + n)
os.mkdir(os.environ["TMPDIR"] + "/sub")
open(os.environ["TMPDIR"] + "/sub/t.txt", "w").write("tmp")
open(os.environ["TMPDIR"] + "/other.txt", "w").write("not asked for")
`})
	requireOK(t, res)
	require.False(t, res.FilesTruncated)
	m := filesByName(res)
	require.Len(t, m, 4, "%+v", res.Files)
	require.Equal(t, "dots", string(m["x..y.dat"].Data))
	require.Equal(t, filepath.Join(out, "a.csv"), m["a.csv"].Path)
	require.Equal(t, "x,y\na.csv", string(m["a.csv"].Data))
	require.Equal(t, int64(len("x,y\nb.csv")), m["b.csv"].Size)
	require.Equal(t, "tmp", string(m["t.txt"].Data))
	require.Equal(t, filepath.Join(res.Policy.Scratch, "sub", "t.txt"), m["t.txt"].Path)

	// A job without Collect nor outputs carries no files.
	res = run(t, p, Job{Code: "1"})
	requireOK(t, res)
	require.Empty(t, res.Files)
}

// TestCollectOutputs: what a job writes to $PYNOX_OUTPUTS is attached
// without being asked for, and the directory is the pool's whatever the
// request's env says.
func TestCollectOutputs(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	res := run(t, p, Job{Env: map[string]string{"PYNOX_OUTPUTS": "/etc"}, Code: `
import os
d = os.environ["PYNOX_OUTPUTS"]
open(os.path.join(d, "chart.png"), "wb").write(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
os.mkdir(os.path.join(d, "nested"))
open(os.path.join(d, "nested", "deep.txt"), "w").write("not attached: only files directly in it")
print(d)
`})
	requireOK(t, res)
	require.Equal(t, filepath.Join(res.Policy.Scratch, OutputsDir)+"\n", res.Stdout)
	m := filesByName(res)
	require.Len(t, m, 1, "%+v", res.Files)
	require.Equal(t, append([]byte("\x89PNG\r\n\x1a\n"), func() []byte {
		b := make([]byte, 256)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}()...), m["chart.png"].Data)

	// The next job in the same (reused) scratch directory starts with an
	// empty one.
	res = run(t, p, Job{Code: "import os\nprint(os.listdir(os.environ['PYNOX_OUTPUTS']))"})
	requireOK(t, res)
	require.Equal(t, "[]\n", res.Stdout)
	require.Empty(t, res.Files)
}

// TestCollectHostile: the pool reads no link a job planted, no FIFO, no
// file with other hard links, nothing outside the job's grants and
// scratch; it keeps serving and nothing hangs.
func TestCollectHostile(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	out := filepath.Join(p.cfg.Dir, "out")
	require.NoError(t, os.Mkdir(out, 0o755))
	secretDir := t.TempDir()
	secretPath := filepath.Join(secretDir, "secret")
	const secret = "TOP-SECRET-artifact-7f3a"
	advSecret(t, secretPath, secret)
	// A hard link in the job's write grant to a file outside it (made on
	// the host: the job itself cannot link a file it may not read, which
	// the job below tries too), and a FIFO (the sandbox denies a job
	// mkfifo, which the job tries too; a writable grant may hold one).
	require.NoError(t, os.Link(secretPath, filepath.Join(out, "hardlink.txt")))
	require.NoError(t, unix.Mkfifo(filepath.Join(out, "hostfifo"), 0o666))
	before := advStat(t, secretPath)

	res := run(t, p, Job{AllowWrite: []string{"out"}, Collect: []string{"out/*", "out/dir/*", "$TMPDIR/*"}, Code: `
import os, errno
d = os.environ["PYNOX_OUTPUTS"]
t = os.environ["TMPDIR"]
os.symlink("/etc/shadow", os.path.join(d, "shadow.txt"))
os.symlink(SECRET, os.path.join(d, "secret.txt"))
os.symlink(SECRET, "out/secret.txt")
os.symlink(SECRETDIR, "out/dir")
os.symlink(SECRETDIR, os.path.join(t, "dirlink"))
fifo = "no"
try:
    os.mkfifo(os.path.join(d, "fifo"))
    os.mkfifo("out/fifo")
    fifo = "yes"
except OSError as e:
    fifo = "denied: %s" % e
try:
    os.link(SECRET, os.path.join(d, "link.txt"))
    print("linked")
except OSError as e:
    print("link denied", errno.errorcode[e.errno])
open(os.path.join(d, "a.txt"), "w").write("one")
os.link(os.path.join(d, "a.txt"), os.path.join(d, "b.txt"))
open(os.path.join(d, "ok.txt"), "w").write("fine")
print("fifo", fifo)
`, Inputs: map[string]any{"SECRET": secretPath, "SECRETDIR": secretDir}})
	requireOK(t, res)
	t.Log(res.Stdout)
	require.Contains(t, res.Stdout, "link denied")
	for _, f := range res.Files {
		require.NotContains(t, string(f.Data), secret, f.Path)
		require.NotContains(t, string(f.Data), "root:", f.Path)
		base := filepath.Base(f.Path)
		if base == "ok.txt" {
			require.Equal(t, "fine", string(f.Data))
			continue
		}
		require.Empty(t, f.Data, "%s was read", f.Path)
		require.NotEmpty(t, f.Skipped, f.Path)
	}
	m := filesByName(res)
	require.Contains(t, m["shadow.txt"].Skipped, "symbolic link")
	require.Contains(t, m["secret.txt"].Skipped, "symbolic link")
	require.Contains(t, m["hardlink.txt"].Skipped, "hard links")
	require.Contains(t, m["a.txt"].Skipped, "hard links")
	require.Contains(t, m["b.txt"].Skipped, "hard links")
	require.Contains(t, m["dirlink"].Skipped, "symbolic link")
	require.Contains(t, m["hostfifo"].Skipped, "not a regular file")
	if strings.Contains(res.Stdout, "fifo yes") {
		require.Contains(t, m["fifo"].Skipped, "not a regular file")
	}
	requireUnchanged(t, before, secretPath)

	// The pool keeps serving.
	res = run(t, p, Job{Code: "print('still here')"})
	requireOK(t, res)
	require.Equal(t, "still here\n", res.Stdout)
}

// TestCollectCaps: at most MaxFiles files and MaxFilesBytes of contents;
// beyond them a marker, never a kill.
func TestCollectCaps(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	res := run(t, p, Job{Code: `
import os
d = os.environ["PYNOX_OUTPUTS"]
for i in range(MAX + 6):
    open(os.path.join(d, "f%03d" % i), "w").write(str(i))
`, Inputs: map[string]any{"MAX": MaxFiles}})
	requireOK(t, res)
	require.Len(t, res.Files, MaxFiles)
	require.True(t, res.FilesTruncated)
	require.Equal(t, "0", string(res.Files[0].Data))

	half := MaxFilesBytes/2 + 1
	res = run(t, p, Job{Code: `
import os
d = os.environ["PYNOX_OUTPUTS"]
for n in ("a", "b", "c"):
    open(os.path.join(d, n), "wb").write(b"z" * HALF)
open(os.path.join(d, "d"), "wb").write(b"small")
`, Inputs: map[string]any{"HALF": half}})
	requireOK(t, res)
	require.True(t, res.FilesTruncated)
	m := filesByName(res)
	require.Len(t, m, 4)
	require.Len(t, m["a"].Data, half)
	for _, n := range []string{"b", "c"} {
		require.Empty(t, m[n].Data)
		require.Equal(t, int64(half), m[n].Size)
		require.Contains(t, m[n].Skipped, "over the")
	}
	require.Equal(t, "small", string(m["d"].Data))
}

// TestCollectRefused: patterns outside the job's write grants and scratch,
// with "..", malformed, or too many are refused before anything runs,
// naming the field.
func TestCollectRefused(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	for pats, want := range map[*[]string]string{
		{"/etc/*"}:        "collect[0]: /etc/* is not beneath the job's write grants",
		{"x.txt"}:         "collect[0]: " + filepath.Join(p.cfg.Dir, "x.txt") + " is not beneath",
		{"$TMPDIR/../x"}:  `collect[0]: "$TMPDIR/../x" has a "." or ".." component`,
		{"$TMPDIR/[x"}:    "collect[0]: \"$TMPDIR/[x\" is not a valid glob pattern",
		{"$TMPDIR/a", ""}: "collect[1]: expected a non-empty glob pattern",
		{"../*"}:          `collect[0]: "../*" has a "." or ".." component`,
		{"$TMPDIR/" + strings.Repeat("d/", 32) + "x"}: "goes 33 levels beneath",
	} {
		res := run(t, p, Job{Code: "print(1)", Collect: *pats})
		requireErrorType(t, res, "RequestError")
		require.Contains(t, res.Error.Message, want)
	}
	many := make([]string, MaxCollectPatterns+1)
	for i := range many {
		many[i] = "$TMPDIR/x"
	}
	res := run(t, p, Job{Code: "1", Collect: many})
	requireErrorType(t, res, "RequestError")
	require.Contains(t, res.Error.Message, "collect: 17 patterns; the limit is 16")
}

// TestCollectSessionSteps: each step gets the files it names and those it
// wrote to $PYNOX_OUTPUTS (removed once attached, so the next step does
// not return them again).
func TestCollectSessionSteps(t *testing.T) {
	t.Parallel()
	p := sharedTestPool(t, Config{Workers: 1})
	ctx := context.Background()
	_, err := p.Checkout(ctx, Job{Collect: []string{"$TMPDIR/*"}})
	require.ErrorIs(t, err, ErrRequest)
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(ctx)
	step := func(s Step) *Result {
		t.Helper()
		ev, err := co.Feed(ctx, s)
		require.NoError(t, err)
		requireOK(t, ev.Result)
		return ev.Result
	}
	res := step(Step{Code: "import os\nd = os.environ['PYNOX_OUTPUTS']\nopen(d + '/one.txt', 'w').write('1')\nopen(os.environ['TMPDIR'] + '/keep.csv', 'w').write('k')"})
	m := filesByName(res)
	require.Len(t, m, 1)
	require.Equal(t, "1", string(m["one.txt"].Data))
	res = step(Step{Code: "print(sorted(os.listdir(d)))", Collect: []string{"$TMPDIR/*.csv"}})
	require.Equal(t, "[]\n", res.Stdout)
	m = filesByName(res)
	require.Len(t, m, 1)
	require.Equal(t, "k", string(m["keep.csv"].Data))
	res = step(Step{Code: "x = 1"})
	require.Empty(t, res.Files)
	ev, err := co.Feed(ctx, Step{Code: "1", Collect: []string{"/etc/*"}})
	require.ErrorIs(t, err, ErrRequest)
	_ = ev
}
