package mountns

import (
	"encoding/json"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/pynox/pynox/internal/testenv"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestMountNamespaceUnderSlotRule shows what a self-confined pool's slots
// rest on: a namespace whose root is a clone of a slot directory of the
// shared tmpfs (Plan.Slots) gives the job its mounts when the pool's
// domain holds a rule on that slot, and not when it holds one on another
// slot only (the path walk stops at the namespace's root, the slot, and
// never reaches the tmpfs's root). Two live namespaces get different
// slots, so one's mountpoint names are not the other's.
func TestMountNamespaceUnderSlotRule(t *testing.T) {
	ns0, data, python := buildSimple(t)
	ns0.Close()
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.FsconfigSetString(fsfd, "size", "1m"))
	require.NoError(t, unix.FsconfigCreate(fsfd))
	base, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	unix.Close(fsfd)
	require.NoError(t, err)
	baseF := os.NewFile(uintptr(base), "base")
	defer baseF.Close()
	paths, err := MakeSlots(base, 2)
	require.NoError(t, err)
	require.Len(t, paths, 2)
	var files []*os.File
	for _, p := range []string{"/usr", "/proc", data} {
		f, err := os.OpenFile(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		defer f.Close()
		files = append(files, f)
	}
	m, err := Start(python)
	require.NoError(t, err)
	defer m.Close()
	build := func(dataPath string) *Namespace {
		ns, err := m.Build(Plan{
			Binds: []Bind{{Source: fd(files[0]), Path: "/usr", ReadOnly: true}, {Source: fd(files[1]), Path: "/proc", ReadOnly: true},
				{Source: fd(files[2]), Path: dataPath, ReadOnly: true}},
			Links: HostLinks(), Root: base, RootSet: true, Slots: 2,
		})
		require.NoError(t, err)
		return ns
	}
	enter := func(ns *Namespace) map[string]any {
		// fd 5 in the entering process is the base tmpfs (ExtraFiles[2]);
		// the pool's rule is on slot s0 only.
		cmd := exec.Command(python, "-I", "-S", "-c", enterScript,
			"poolrw:/usr,/proc,/proc/self/fd/5/s0", "/usr=r", "/proc=r", data+"=r")
		cmd.ExtraFiles = []*os.File{ns.User, ns.Mount, baseF}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		b, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("entering process: %v: %s", err, ee.Stderr)
		}
		require.NoError(t, err)
		var got map[string]any
		require.NoError(t, json.Unmarshal(b, &got), string(b))
		return got
	}
	// The first namespace takes s0; a second one, while the first lives,
	// s1, and a file there at the first one's directory mountpoint.
	a := build("/data")
	defer a.Close()
	got := enter(a)
	require.Equal(t, "hello", got["read_data"], "a rule on the namespace's slot reaches its mounts")
	require.Equal(t, "[1]", got["import_json"])
	b := build("/data/f.txt")
	defer b.Close()
	got = enter(b)
	require.Equal(t, "EACCES", got["read_data"], "a rule on another slot reaches this namespace's mounts")
	ents, err := os.ReadDir(paths[1])
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	require.Contains(t, names, "data", "the second namespace's mountpoints are in s1")
	// Once the first is gone, its slot is emptied at the next request
	// and used again.
	a.Close()
	c := build("/data")
	defer c.Close()
	got = enter(c)
	require.Equal(t, "hello", got["read_data"], "the freed slot s0 is used again")
}

// TestSlotsNeverShared: with every slot used by a live namespace, a build
// waits a few seconds for one to be freed and then fails, naming the
// slots; it never shares a slot. Once the live one is gone, a build gets
// its slot, emptied.
func TestSlotsNeverShared(t *testing.T) {
	testenv.RequireLong(t, "a build waits for a free slot before it fails")
	ns0, data, python := buildSimple(t)
	ns0.Close()
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.FsconfigCreate(fsfd))
	base, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	unix.Close(fsfd)
	require.NoError(t, err)
	defer unix.Close(base)
	paths, err := MakeSlots(base, 1)
	require.NoError(t, err)
	f, err := os.OpenFile(data, unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer f.Close()
	m, err := Start(python)
	require.NoError(t, err)
	defer m.Close()
	plan := Plan{Binds: []Bind{{Source: fd(f), Path: "/a/data", ReadOnly: true}}, Root: base, RootSet: true, Slots: 1}
	a, err := m.Build(plan)
	require.NoError(t, err)
	_, err = m.Build(plan)
	require.ErrorContains(t, err, "no free namespace slot")
	a.Close()
	plan.Binds[0].Path = "/b"
	b, err := m.Build(plan)
	require.NoError(t, err)
	defer b.Close()
	ents, err := os.ReadDir(paths[0])
	require.NoError(t, err)
	require.Len(t, ents, 1, "the freed slot holds the last namespace's mountpoint only")
	require.Equal(t, "b", ents[0].Name())
}

// slottedMounter starts a mounter prepared like preparedMounter on a
// shared root with n slots; it returns the mounter and the slots' paths.
func slottedMounter(t *testing.T, stock, n int) (*Mounter, []string) {
	t.Helper()
	requireMounter(t)
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.FsconfigCreate(fsfd))
	base, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	unix.Close(fsfd)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(base) })
	paths, err := MakeSlots(base, n)
	require.NoError(t, err)
	m, err := Start("/usr/bin/python3")
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	require.NoError(t, m.Prepare(Plan{
		Binds: []Bind{{Source: openPath(t, "/usr"), Path: "/usr", ReadOnly: true},
			{Source: openPath(t, "/proc"), Path: "/proc", ReadOnly: true}},
		Links: HostLinks(), Dirs: []string{"/srv/app"}, Root: base, RootSet: true, Slots: n,
	}, stock))
	return m, paths
}

// The slot layout of TestPreparedSharedRootCollect and
// TestPreparedSharedRootBaseKept: a live namespace's mountpoints (its
// base's and its job's) are never removed while it lives, a gone or
// failed one's slot is emptied and used again, the base's mountpoints are
// never removed under a build, and no two live namespaces share a slot.
func TestPreparedSlots(t *testing.T) {
	m, paths := slottedMounter(t, 2, 5)
	src := openPath(t, dataDir(t, "A"))
	has := func(rel string) int {
		n := 0
		for _, p := range paths {
			if _, err := os.Lstat(p + "/" + rel); err == nil {
				n++
			}
		}
		return n
	}
	keep, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/keep/x", ReadOnly: true}}})
	require.NoError(t, err)
	gone, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/gone/x", ReadOnly: true}}})
	require.NoError(t, err)
	require.Equal(t, 1, has("gone/x"))
	gone.Close()
	_, err = m.Build(Plan{Binds: []Bind{{Source: src, Path: "/failed/x", ReadOnly: true}, {Source: src, Path: "/usr/y", ReadOnly: true}}})
	require.Error(t, err)
	// More builds than slots, each closed: slots are freed and reused.
	for i := range 8 {
		ns, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/data", ReadOnly: true}}})
		require.NoError(t, err, "build %d", i)
		got := look(t, ns, "/data/f.txt")
		ns.Close()
		require.Equal(t, "A", got["read /data/f.txt"], "build %d", i)
		require.ElementsMatch(t, []any{"/", "/usr", "/proc", "/data"}, got["mounts"], "build %d", i)
		require.NotContains(t, got["root"], "keep", "build %d sees a live namespace's mountpoint", i)
	}
	other, err := m.Build(Plan{Binds: []Bind{{Source: src, Path: "/other", ReadOnly: true}}})
	require.NoError(t, err)
	defer other.Close()
	require.Equal(t, "A", look(t, other, "/other/f.txt")["read /other/f.txt"])
	require.Equal(t, 1, has("keep/x"), "a live namespace's mountpoint was removed")
	require.Equal(t, 0, has("gone"), "a gone namespace's mountpoint stayed")
	require.Equal(t, 0, has("failed"), "a failed attach's mountpoint stayed")
	got := look(t, keep, "/keep/x/f.txt")
	require.Equal(t, "A", got["read /keep/x/f.txt"], "the kept namespace's mount is still there")
	keep.Close()
}
