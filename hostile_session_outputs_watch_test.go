package pynox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHostileSessionOutputsWatch probes the inotify watch that lets a
// session step skip the full empty-outputs check (outputs_watch.go):
// after steps that left the outputs directory empty (the watch armed and
// quiet), every way a step can make an entry appear at $PYNOX_OUTPUTS
// still attaches it: a new file, a directory swapped in by rename (away,
// then a new one made; or renamed over the empty one), an exchange of
// the directory with a full one, a hard link, a file written by a thread
// of an earlier step while a later one runs, and a file in the next
// process of the session after its first one exited.
func TestHostileSessionOutputsWatch(t *testing.T) {
	t.Parallel()
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
	attached := func(what, code, name string) {
		t.Helper()
		quiet("before " + what)
		r := feed(t, co, code)
		requireOK(t, r)
		require.Len(t, r.Files, 1, "%s: stdout %q stderr %q", what, r.Stdout, r.Stderr)
		require.Equal(t, name, filepath.Base(r.Files[0].Path), what)
	}
	requireOK(t, feed(t, co, "import os, threading, time, ctypes\nd = os.environ['PYNOX_OUTPUTS']\nup = os.path.dirname(d)"))

	attached("a new file", "open(os.path.join(d, 'a.txt'), 'w').write('a')", "a.txt")
	attached("a directory moved away and a new one made",
		"os.rename(d, os.path.join(up, 'old1'))\nos.mkdir(d)\nopen(os.path.join(d, 'b.txt'), 'w').write('b')", "b.txt")
	attached("a full directory renamed over the empty one",
		"n = os.path.join(up, 'new2')\nos.mkdir(n)\nopen(os.path.join(n, 'c.txt'), 'w').write('c')\nos.rename(n, d)", "c.txt")
	attached("a hard link made in it",
		"open(os.path.join(up, 'e.txt'), 'w').write('e')\nos.link(os.path.join(up, 'e.txt'), os.path.join(d, 'e.txt'))", "e.txt")
	// A linked file is skipped, not removed: the job removes it.
	requireOK(t, feed(t, co, "os.unlink(os.path.join(d, 'e.txt'))"))

	// An exchange (renameat2 RENAME_EXCHANGE), where the job's seccomp
	// filter lets it through.
	quiet("before an exchange")
	r := feed(t, co, `
n = os.path.join(up, 'new3')
os.mkdir(n)
open(os.path.join(n, 'f.txt'), 'w').write('f')
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.renameat2(-100, n.encode(), -100, d.encode(), 2)
print(rc, ctypes.get_errno())
`)
	requireOK(t, r)
	if strings.HasPrefix(r.Stdout, "0 ") {
		require.Len(t, r.Files, 1, "an exchanged directory: stdout %q", r.Stdout)
		require.Equal(t, "f.txt", filepath.Base(r.Files[0].Path))
	} else {
		t.Logf("renameat2(RENAME_EXCHANGE) refused in the job (%q): not probed", r.Stdout)
		require.Empty(t, r.Files)
	}

	// A thread of one step writes while a later step runs.
	quiet("before a late thread")
	r = feed(t, co, "def late():\n    time.sleep(0.05)\n    open(os.path.join(d, 'g.txt'), 'w').write('g')\nthreading.Thread(target=late).start()")
	requireOK(t, r)
	require.Empty(t, r.Files, "the thread wrote before its step reported")
	r = feed(t, co, "time.sleep(0.3)")
	requireOK(t, r)
	require.Len(t, r.Files, 1, "the file a thread wrote while this step ran")
	require.Equal(t, "g.txt", filepath.Base(r.Files[0].Path))

	// The pool's instance is there: the steps above went through it.
	require.True(t, holdsInotify(t), "the pool holds no inotify instance: the watched check was not exercised")

	// The session's next process, after its first exited.
	quiet("before an exit")
	r = feed(t, co, "import os\nos._exit(0)")
	require.True(t, r.SessionEnded, "the step ended the process")
	requireOK(t, feed(t, co, "import os\nd = os.environ['PYNOX_OUTPUTS']"))
	attached("a file in the next process", "open(os.path.join(d, 'h.txt'), 'w').write('h')", "h.txt")
}

// holdsInotify reports whether this process holds an inotify instance.
func holdsInotify(t *testing.T) bool {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l == "anon_inode:inotify" {
			return true
		}
	}
	return false
}
