package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/mountns"
	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/testenv"
)

// poolMounter returns the pid of the mounter (python3 running the
// mount-namespace builder) that the pool process pool started, or 0.
func poolMounter(t *testing.T, pool int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(pool) || f[0] == "Z" {
			continue
		}
		if cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline"); bytes.Contains(cmd, []byte("pynox mount-namespace builder")) {
			return pid
		}
	}
	return 0
}

// mounterHolds returns the mounter's live children (builders) and its
// mount namespace descriptors (its own and its prepared stock; not its
// seed namespace, at mountns.SeedFD).
func mounterHolds(t *testing.T, pid int) (children, mntFDs int) {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid)
	ents, err := os.ReadDir(dir + "/fd")
	require.NoError(t, err)
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "mnt:[") &&
			e.Name() != strconv.Itoa(mountns.SeedFD) {
			mntFDs++
		}
	}
	kids, _ := os.ReadFile(dir + "/task/" + strconv.Itoa(pid) + "/children")
	return len(strings.Fields(string(kids))), mntFDs
}

// mounterSettles waits until the mounter has no builder child and holds
// want mount namespace descriptors; a wait, not a timing assertion.
func mounterSettles(t *testing.T, pid, want int) {
	t.Helper()
	var kids, fds int
	for range 400 {
		// The namespaces leased to ready ns spares (hostile_nsfast_test.go
		// in package pynox) are the mounter's too until their job's
		// mounts are attached.
		if kids, fds = mounterHolds(t, pid); kids == 0 && fds == want+leasedBy(pid) {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("the mounter holds %d children and %d mount namespaces; expected none and %d (and %d leased)", kids, fds, want, leasedBy(pid))
}

// In a pool that confines itself (the CLI's default), whose namespaces'
// roots are clones of one tmpfs: the host's top-level links are there
// (read before the pool confined itself); the mounter runs from the start but
// prepares no namespace until the first job with a mount; then it keeps
// its stock (two for one worker) and no builder. The mountpoints a job's
// attach made in the shared root are removed once its namespace is gone
// (a later job no longer sees them), and so are those of an attach that
// failed (the job got SandboxSetupError and ran nothing); the stock comes
// back to its size each time.
func TestHostileNSPrepConfinedPool(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandboxOrSkip(t)
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock: %v", err)
	}
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "data"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "f"), []byte("hi"), 0o644))
	p := startPoolIn(t, dir, "--workers=1")
	if m, _ := p.ready["mounts"].(map[string]any); m["virtual_paths"] != true {
		t.Skipf("the pool builds no mount namespaces here: %v", p.ready["mounts"])
	}
	if sc, _ := p.ready["self_confinement"].(map[string]any); sc["landlock"] == float64(0) {
		t.Skipf("the pool did not confine itself: %v", sc)
	}
	mounter := poolMounter(t, p.cmd.Process.Pid)
	require.NotZero(t, mounter, "a confined pool starts its mounter before it confines itself")
	id := 0
	job := func(code, mounts string) map[string]any {
		id++
		p.send(t, fmt.Sprintf(`{"id": %d, "code": %q, "mounts": %s}`, id, code, mounts))
		return p.next(t)
	}
	for range 3 {
		r := job("print(1)", "[]")
		require.Nil(t, r["error"], "%v", r)
	}
	mounterSettles(t, mounter, 1) // its own namespace only: no stock
	const exists = `import os; print([q for q in ("/alpha", "/failed", "/beta") if os.path.exists(q)])`
	r := job(exists, `[{"host": "data", "path": "/alpha/deep/x"}]`)
	require.Nil(t, r["error"], "%v", r)
	require.Equal(t, "['/alpha']\n", r["stdout"])
	// The host's top-level links are in the namespace (they were missing
	// in a pool that confines itself: it listed "/" once confined).
	if target, err := os.Readlink("/lib"); err == nil {
		r = job(`import os; print(os.readlink("/lib"))`, `[{"host": "data", "path": "/alpha/deep/x"}]`)
		require.Nil(t, r["error"], "%v", r)
		require.Equal(t, target+"\n", r["stdout"])
	}
	mounterSettles(t, mounter, 1+2)
	if fi, err := os.Lstat("/lib"); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		r = job(`print("ran")`, `[{"host": "data", "path": "/failed/x"}, {"host": "data", "path": "/lib/pynox-x"}]`)
		e, _ := r["error"].(map[string]any)
		require.Equal(t, "SandboxSetupError", e["type"], "%v", r)
		require.Empty(t, r["stdout"])
	}
	got := ""
	for range 20 {
		r = job(exists, `[{"host": "data", "path": "/beta"}]`)
		require.Nil(t, r["error"], "%v", r)
		if got = r["stdout"].(string); got == "['/beta']\n" {
			break
		}
		time.Sleep(50 * time.Millisecond) // the kernel frees a namespace after its last process
	}
	require.Equal(t, "['/beta']\n", got, "another job's or a failed attach's mountpoint stayed in the shared root")
	mounterSettles(t, mounter, 1+2)
}

// leasedBy counts the mount namespaces the mounter pid holds that a
// process other than it is in: those leased to ready ns spares (its own
// is not counted; its stock's have no process).
func leasedBy(pid int) int {
	held := map[string]bool{}
	dir := "/proc/" + strconv.Itoa(pid)
	own, _ := os.Readlink(dir + "/ns/mnt")
	ents, _ := os.ReadDir(dir + "/fd")
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "mnt:[") && l != own {
			held[l] = true
		}
	}
	n := 0
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		if q, err := strconv.Atoi(e.Name()); err != nil || q == pid {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/mnt"); err == nil && held[l] {
			n++
			delete(held, l)
		}
	}
	return n
}
