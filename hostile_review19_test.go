package pynox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// Review 19: the session step's outputs watch (outputs_watch.go). A full
// check opens $PYNOX_OUTPUTS, then arms the watch on the directory it
// opened. A rename of that directory away between the open and the
// arming queues nothing on the watch (it is not armed yet), so the watch
// sits on a directory no longer at the path, quiet for good, and every
// later step's check says "empty" without looking: whatever the job puts
// at $PYNOX_OUTPUTS afterwards is never attached. A job reaches that
// window with a thread whose rename is still under way when its step's
// SIGSTOP is sent (a rename waiting on the parent's lock, held by another
// of its threads in a long getdents, completes before the thread stops).
// The hook plays that thread at the worst moment, deterministically.
func TestHostileReview19OutputsMovedBeforeArming(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	requireOK(t, feed(t, co, "import os\nd = os.environ['PYNOX_OUTPUTS']"))
	moved := false
	outputsCheckHook = func(pl *plan, opened bool) {
		if moved || !opened {
			return
		}
		moved = true
		dir := pl.scratchDir()
		require.NoError(t, os.Rename(filepath.Join(dir, OutputsDir), filepath.Join(dir, "old")))
	}
	t.Cleanup(func() { outputsCheckHook = nil })
	// A file made and removed: the watch saw it, so this step's check is
	// a full one (and the hook moves the directory in it).
	r := feed(t, co, "open(os.path.join(d, 't'), 'w').close()\nos.unlink(os.path.join(d, 't'))")
	requireOK(t, r)
	require.True(t, moved, "the step's check was not a full one")
	require.Empty(t, r.Files)
	// The job makes the directory anew and writes a file in it.
	r = feed(t, co, "os.mkdir(d)\nopen(os.path.join(d, 'z.txt'), 'w').write('z')")
	requireOK(t, r)
	require.Len(t, r.Files, 1, "a file at $PYNOX_OUTPUTS after the directory was moved during a full check was not attached")
	require.Equal(t, "z.txt", filepath.Base(r.Files[0].Path))
	// And the watch works on afterwards: quiet steps, then a new file.
	for range 2 {
		r = feed(t, co, "x = 1")
		requireOK(t, r)
		require.Empty(t, r.Files)
	}
	r = feed(t, co, "open(os.path.join(d, 'y.txt'), 'w').write('y')")
	requireOK(t, r)
	require.Len(t, r.Files, 1)
}

// Review 19: two sessions' watches on one directory. inotify gives the
// same watch descriptor for a directory an instance watches already, and
// the pool's watches are one instance's, kept by descriptor. A directory
// that session B's watch is on, moved (through a writable grant both
// jobs share on the scratch root's file system) to session A's
// $PYNOX_OUTPUTS after A's check drained the queue and before it opened
// the path: A's arming takes B's descriptor over, the events of the
// moves go to A, and B's watch stays "quiet" while B's path holds another
// directory, so B's files are never attached. The hook plays the two
// jobs' moves at that moment.
func TestHostileReview19SharedWatchDescriptor(t *testing.T) {
	p := newTestPool(t, Config{Workers: 2})
	b := checkout(t, p, Job{})
	for range 2 {
		r := feed(t, b, "import os\nd = os.environ['PYNOX_OUTPUTS']")
		requireOK(t, r)
		require.Empty(t, r.Files)
	}
	a := checkout(t, p, Job{})
	moved := false
	outputsCheckHook = func(pl *plan, opened bool) {
		if moved || opened || pl != a.pl {
			return
		}
		moved = true
		ad, bd := filepath.Join(pl.scratchDir(), OutputsDir), filepath.Join(b.pl.scratchDir(), OutputsDir)
		require.NoError(t, os.Remove(ad))
		require.NoError(t, os.Rename(bd, ad))
	}
	t.Cleanup(func() { outputsCheckHook = nil })
	requireOK(t, feed(t, a, "x = 1"))
	require.True(t, moved, "session A's step made no full check")
	outputsCheckHook = nil
	r := feed(t, b, "os.mkdir(d)\nopen(os.path.join(d, 'z.txt'), 'w').write('z')")
	requireOK(t, r)
	require.Len(t, r.Files, 1, "session B's file was not attached after its watched directory moved to session A's outputs")
	require.Equal(t, "z.txt", filepath.Base(r.Files[0].Path))
	r = feed(t, a, "import os\nopen(os.path.join(os.environ['PYNOX_OUTPUTS'], 'a.txt'), 'w').write('a')")
	requireOK(t, r)
	require.Len(t, r.Files, 1, "session A's file")
}

// Review 19 probes that hold: more ways for an entry to appear in an
// empty, watched $PYNOX_OUTPUTS, each attached at its step: an O_TMPFILE
// file given a name there with linkat (where the job may), a file
// renamed in from the scratch directory, and a file
// written through a descriptor of the directory opened in an earlier
// step (openat relative to it).
func TestHostileReview19OutputsWatchHolds(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	quiet := func(what string) {
		t.Helper()
		for range 2 {
			r := feed(t, co, "x = 1")
			requireOK(t, r)
			require.Empty(t, r.Files, "%s: a step that wrote nothing attached files", what)
		}
	}
	requireOK(t, feed(t, co, "import os\nd = os.environ['PYNOX_OUTPUTS']\nup = os.path.dirname(d)"))

	quiet("before O_TMPFILE")
	r := feed(t, co, `
try:
    fd = os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o600)
except OSError as e:
    print("refused", e.errno)
else:
    os.write(fd, b"t")
    try:
        os.link("/proc/self/fd/%d" % fd, os.path.join(d, "t.txt"), follow_symlinks=True)
        print("linked")
    except OSError as e:
        print("refused", e.errno)
    os.close(fd)
`)
	requireOK(t, r)
	if r.Stdout == "linked\n" {
		require.Len(t, r.Files, 1, "an O_TMPFILE file linked in")
		require.Equal(t, "t.txt", filepath.Base(r.Files[0].Path))
	} else {
		t.Logf("O_TMPFILE + linkat not probed: %q", r.Stdout)
		require.Empty(t, r.Files)
	}

	quiet("before a file renamed in")
	r = feed(t, co, "open(os.path.join(up, 'r.txt'), 'w').write('r')\nos.rename(os.path.join(up, 'r.txt'), os.path.join(d, 'r.txt'))")
	requireOK(t, r)
	require.Len(t, r.Files, 1, "a file renamed in")
	require.Equal(t, "r.txt", filepath.Base(r.Files[0].Path))

	quiet("before a write through an old descriptor")
	requireOK(t, feed(t, co, "dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)"))
	quiet("with the descriptor open")
	r = feed(t, co, "f = os.open('o.txt', os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=dfd)\nos.write(f, b'o')\nos.close(f)")
	requireOK(t, r)
	require.Len(t, r.Files, 1, "a file made through a descriptor of the directory")
	require.Equal(t, "o.txt", filepath.Base(r.Files[0].Path))
}

// Review 19 probe that holds: the ns spare's capability drop reads the
// ambient and bounding sets from /proc/self/status in the job's mount
// namespace, where a client's mount could put a file of its own making
// (one that says every set is empty). A mount at /proc, or beneath it, is
// refused before any code runs; a mount job elsewhere holds no
// capability by capget.
func TestHostileReview19FakeProcStatus(t *testing.T) {
	p, data, _ := nsPool(t)
	fake := filepath.Join(data, "self")
	require.NoError(t, os.Mkdir(fake, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(fake, "status"), []byte("Name:\tfake\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n"), 0o644))
	code := `
import ctypes
class H(ctypes.Structure):
    _fields_ = [("v", ctypes.c_uint32), ("pid", ctypes.c_int)]
class D(ctypes.Structure):
    _fields_ = [("e", ctypes.c_uint32), ("p", ctypes.c_uint32), ("i", ctypes.c_uint32)]
h, d = H(0x20080522, 0), (D * 2)()
libc = ctypes.CDLL(None, use_errno=True)
print("capget", libc.capget(ctypes.byref(h), ctypes.byref(d)), [(x.e, x.p, x.i) for x in d])
`
	// The control: a mount job elsewhere runs, with no capability.
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: code})
	requireOK(t, res)
	require.Contains(t, res.Stdout, "capget 0 [(0, 0, 0), (0, 0, 0)]", res.Stdout)
	for _, target := range []string{"/proc", "/proc/self", "/proc/1"} {
		res, err := p.Run(context.Background(), Job{Mounts: []MountSpec{{HostPath: data, Path: target}}, Code: code})
		if err != nil {
			t.Logf("a mount at %s refused: %v", target, err)
			continue
		}
		if res.Error != nil {
			t.Logf("a mount at %s: %s: %s", target, res.Error.Type, res.Error.Message)
			require.NotContains(t, res.Stdout, "capget", "code ran after an error")
			continue
		}
		require.Contains(t, res.Stdout, "capget 0 [(0, 0, 0), (0, 0, 0)]", "a mount at %s: %s", target, res.Stdout)
	}
}

// Review 19 probe that holds: the runner reads host-call replies with one
// read of up to 64 KiB of what the channel holds, hands on the whole
// frames in it and keeps a frame's start for the next read. 64 calls in
// flight at once, whose replies range from a few bytes to near the 1 MiB
// limit (so frames straddle every read, several arrive in one read, and
// one needs many), each get their own answer, whole, in a one-shot job
// and in session steps one after another.
func TestHostileReview19ReplyFraming(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 1})
	host := func(ctx context.Context, c *Call) (any, error) {
		var args []int
		if err := json.Unmarshal(c.Args, &args); err != nil || len(args) != 1 {
			return nil, fmt.Errorf("args %s", c.Args)
		}
		i := args[0]
		n := (i * 65521) % 70000
		if i%16 == 15 {
			n = MaxCallBytes - 64 - i
		}
		return fmt.Sprintf("%d:%s", i, strings.Repeat(string(rune('a'+i%26)), n)), nil
	}
	code := `import asyncio
from pynox_host import aio
async def main():
    rs = await asyncio.gather(*[aio.big(i) for i in range(64)])
    bad = []
    for i, r in enumerate(rs):
        n = (i * 65521) % 70000
        if i % 16 == 15:
            n = (1 << 20) - 64 - i
        if r != "%d:%s" % (i, chr(ord("a") + i % 26) * n):
            bad.append(i)
    print("bad", bad)
asyncio.run(main())
`
	res, err := p.Run(context.Background(), Job{Functions: []string{"big"}, Host: host, Code: code})
	require.NoError(t, err)
	requireOK(t, res)
	require.Equal(t, "bad []\n", res.Stdout)

	co := checkout(t, p, Job{Functions: []string{"big"}, Host: host})
	for range 3 {
		r := feed(t, co, code)
		requireOK(t, r)
		require.Equal(t, "bad []\n", r.Stdout)
	}
}

// Review 19: a Go host function's result that Python's json module cannot
// decode (a json.RawMessage with bytes that are not UTF-8 in a string, or
// nested 5,000 deep) made the job's call raise (UnicodeDecodeError,
// RecursionError) and the job then hang until its timeout; the job's
// call now fails with a HostError and the job goes on.
func TestHostileReview19UndecodableHostResult(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	for _, raw := range []string{"\"\xff\"", strings.Repeat("[", 5000) + strings.Repeat("]", 5000)} {
		host := func(ctx context.Context, c *Call) (any, error) { return json.RawMessage(raw), nil }
		res, err := p.Run(context.Background(), Job{Functions: []string{"f"}, Host: host, Timeout: 20 * time.Second,
			Code: "from pynox_host import f, HostError\ntry:\n    f()\nexcept HostError as e:\n    print('HostError', e)"})
		require.NoError(t, err)
		requireOK(t, res)
		require.Contains(t, res.Stdout, "HostError the host's reply could not be encoded: its result: ", "%.20q", raw)
	}
}
