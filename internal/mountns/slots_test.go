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
