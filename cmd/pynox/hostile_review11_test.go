package main

// Review 11, through the CLI: a pool that confines itself, whose job
// namespaces are rooted at slot directories emptied and reused once their
// namespace is gone, and whose runner is read by a boot from stdin.

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// r11Flood is more mount jobs than a two-worker CLI pool has slot
// directories (3*2 workers + 16 sessions + 16 stock + 1 = 39), so every
// slot is emptied and reused at least once.
const r11Flood = 45

// r11Send sends a job whose code is code with the given mounts JSON.
func r11Send(t *testing.T, p *poolProc, id int, code, mounts string) {
	t.Helper()
	c, err := json.Marshal(code)
	require.NoError(t, err)
	p.send(t, fmt.Sprintf(`{"id": %d, "code": %s, "mounts": %s}`, id, c, mounts))
}

// Probe: a job cannot write its namespace's root (its slot directory) nor
// the directories made for its mountpoints, so it leaves nothing there for
// the next namespace in that slot; after a flood that reuses every slot,
// no job sees a name the first job tried to plant, and the pool serves.
func TestHostileReview11SlotRootUnwritable(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := r10ConfinedPool(t)
	plant := `import errno, os
def t(name, f):
    try:
        f()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode[e.errno])
t("file", lambda: open("/planted-f", "w").write("x"))
t("dir", lambda: os.mkdir("/planted-d"))
t("link", lambda: os.symlink("/etc/passwd", "/planted-l"))
t("fifo", lambda: os.mkfifo("/planted-p"))
t("subfile", lambda: open("/a/planted-f", "w").write("x"))
t("subdir", lambda: os.mkdir("/a/planted-d"))
t("rename", lambda: os.rename("/a/b", "/a/planted-r"))
t("rmdir", lambda: os.rmdir("/a"))
t("chmod", lambda: os.chmod("/a", 0o777))
t("utime", lambda: os.utime("/a"))
t("xattr", lambda: os.setxattr("/a", "user.x", b"1"))
`
	r11Send(t, p, 1, plant, `[{"host": "data", "path": "/a/b"}]`)
	r := p.next(t)
	require.Nil(t, r["error"], "%v", r)
	out, _ := r["stdout"].(string)
	t.Log(out)
	require.Equal(t, 11, strings.Count(out, "\n"), "%v", r)
	require.NotContains(t, out, " ok", "the job wrote its namespace's root")
	look := `import os
names = ["/planted-" + c for c in "fdlp"] + ["/a/planted-" + c for c in "fdr"]
seen = [n for n in names if os.path.lexists(n)]  # stat: Landlock does not mediate it
print(open("/a/b/f").read(), seen)
`
	for i := range r11Flood {
		r11Send(t, p, 100+i, look, `[{"host": "data", "path": "/a/b"}]`)
	}
	for id, r := range r10Replies(t, p, r11Flood) {
		require.Nil(t, r["error"], "job %v: %v", id, r)
		require.Equal(t, "hi []\n", r["stdout"], "job %v", id)
	}
}

// Probe: a mount job whose namespace build fails half way (a directory
// mount beneath a file mount) leaves the mountpoints it made in its slot;
// the slot is emptied before it is used again, so a flood of jobs that
// need those names with the other type (a directory at /m/f) all run.
func TestHostileReview11SlotFailedBuild(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := r10ConfinedPool(t)
	for i := range 4 {
		r11Send(t, p, i, "print('ran')", `[{"host": "data/f", "path": "/m/f"}, {"host": "data", "path": "/m/f/sub"}]`)
	}
	for id, r := range r10Replies(t, p, 4) {
		e, _ := r["error"].(map[string]any)
		require.NotNil(t, e, "job %v: %v", id, r)
		require.Equal(t, "SandboxSetupError", e["type"], "job %v: %v", id, r)
		require.Empty(t, r["stdout"], "job %v", id)
	}
	for i := range r11Flood {
		r11Send(t, p, 100+i, "print(open('/m/f/sub/f').read())", `[{"host": "data", "path": "/m/f/sub"}]`)
	}
	for id, r := range r10Replies(t, p, r11Flood) {
		require.Nil(t, r["error"], "job %v: %v", id, r)
		require.Equal(t, "hi\n", r["stdout"], "job %v", id)
	}
}

// Probe: the runner's source reaches the template on its stdin; a job's
// descriptor 0 is /dev/null (reading it gives nothing), with and without a
// mount namespace and at each step of a session; its parent's, pid 1's
// and its neighbour's fd 0 are unreadable to it or /dev/null too.
func TestHostileReview11Stdin(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := r10ConfinedPool(t)
	code := `import os, sys
st = os.fstat(0)
print(os.readlink("/proc/self/fd/0"), repr(os.read(0, 4096)), repr(sys.stdin.read()), st.st_rdev == os.stat("/dev/null").st_rdev if os.path.exists("/dev/null") else "nodev")
others = []
for q in (os.getppid(), 1, os.getpid() - 1):
    try:
        others.append(os.readlink("/proc/%d/fd/0" % q))
    except OSError:
        pass
print([o for o in others if not o.startswith("/dev/null")])
`
	r11Send(t, p, 1, code, `[]`)
	r11Send(t, p, 2, code, `[{"host": "data", "path": "/data"}]`)
	c, err := json.Marshal(code)
	require.NoError(t, err)
	p.send(t, fmt.Sprintf(`{"id": 3, "session": "in", "code": %s}`, c))
	p.send(t, fmt.Sprintf(`{"id": 4, "session": "in", "code": %s}`, c))
	for id, r := range r10Replies(t, p, 4) {
		require.Nil(t, r["error"], "job %v: %v", id, r)
		out, _ := r["stdout"].(string)
		t.Log(id, out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2, "job %v: %v", id, r)
		require.True(t, strings.HasPrefix(lines[0], "/dev/null b'' '' "), "job %v: %q", id, lines[0])
		require.NotContains(t, lines[0], "False", "job %v", id)
		require.Equal(t, "[]", lines[1], "job %v", id)
	}
}

// Probe (PYNOX_LONG): a flood of short mount jobs, each of whose
// namespaces dies after its answer (the process is killed, then torn
// down, while the worker already runs the next job), never runs the pool
// out of slot directories: every job runs.
func TestHostileReview11SlotFlood(t *testing.T) {
	if os.Getenv("PYNOX_LONG") == "" {
		t.Skip("long: set PYNOX_LONG=1")
	}
	t.Parallel()
	p := r10ConfinedPool(t)
	const n = 400
	for i := range n {
		r11Send(t, p, i, "print(open('/d%d/f' % 1).read())", fmt.Sprintf(`[{"host": "data", "path": "/d1"}, {"host": "data/f", "path": "/x%d"}]`, i%7))
	}
	for id, r := range r10Replies(t, p, n) {
		require.Nil(t, r["error"], "job %v: %v", id, r)
		require.Equal(t, "hi\n", r["stdout"], "job %v", id)
	}
}

// Probe (PYNOX_LONG): every session the pool allows (16) holds a mount
// namespace, the last of them ends its process at each step (a new namespace
// for each next step, the previous one dying meanwhile), and one-shot
// mount jobs run alongside: no request runs short of a slot directory.
func TestHostileReview11SlotSessionChurn(t *testing.T) {
	if os.Getenv("PYNOX_LONG") == "" {
		t.Skip("long: set PYNOX_LONG=1")
	}
	t.Parallel()
	p := r10ConfinedPool(t)
	m := `"mounts": [{"host": "data", "path": "/s"}]`
	for i := range 15 {
		p.send(t, fmt.Sprintf(`{"id": %d, "session": "s%d", "code": "print(open('/s/f').read())", %s}`, i, i, m))
	}
	for id, r := range r10Replies(t, p, 15) {
		require.Nil(t, r["error"], "session open %v: %v", id, r)
		require.Equal(t, "hi\n", r["stdout"], "session open %v", id)
	}
	const n = 30
	for i := range n {
		// The 16th session's previous step ended it: this step starts a
		// new process, bringing its mount again.
		p.send(t, fmt.Sprintf(`{"id": %d, "session": "c", "code": "import os; print(open('/s/f').read(), flush=True); os._exit(3)", %s}`, 100+i, m))
		r11Send(t, p, 200+i, "print(open('/s/f').read())", `[{"host": "data", "path": "/s"}]`)
		for id, r := range r10Replies(t, p, 2) {
			require.Equal(t, "hi\n", r["stdout"], "request %v: %v", id, r)
		}
	}
}
