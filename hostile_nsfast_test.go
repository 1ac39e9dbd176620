package pynox

import (
	"context"
	"github.com/pynox/pynox/internal/mountns"
	"github.com/pynox/pynox/internal/testenv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Leased namespaces (issue 13's latency point): each ready ns spare
// enters a prepared namespace the pool's mounter leases to it before any
// job, drops its capabilities and attaches its seccomp job layer there,
// off its job's path; at the job, the mounter attaches the job's mounts
// to that namespace, and only then does the spare get its job.

// nsLeased counts the mount namespaces the mounter pid holds that a
// process other than it is in: those leased to ready ns spares (its own
// is not counted; its stock's have no process).
func nsLeased(pid int) int {
	held := map[string]bool{}
	dir := "/proc/" + strconv.Itoa(pid)
	own, _ := os.Readlink(dir + "/ns/mnt")
	ents, _ := os.ReadDir(dir + "/fd")
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "mnt:[") && l != own &&
			e.Name() != strconv.Itoa(mountns.SeedFD) {
			held[l] = true
		}
	}
	n := 0
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		q, err := strconv.Atoi(e.Name())
		if err != nil || q == pid {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/mnt"); err == nil && held[l] {
			n++
			delete(held, l)
		}
	}
	return n
}

// nsEnteredSpare waits for the template's ready ns spare to have entered
// the namespace leased to it (see nsSparePid) and returns its pid.
func nsEnteredSpare(t *testing.T, p *Pool, except ...int) int {
	t.Helper()
	return nsSparePid(t, p.workers[0].live.Load(), except...)
}

// Probe: a ready ns spare's leased namespace, before its job's mounts
// are attached, shows the pool's base and nothing of any earlier job
// (no mount, no mountpoint), and its root is not read-only yet; once
// its job comes, the job sees exactly its own mounts and a read-only
// root, and the next spare's namespace again shows nothing of it.
func TestHostileNSFastLeasedShowsNoOtherJob(t *testing.T) {
	p, data, _ := nsPool(t)
	secret := "/nsfast-secret-" + strconv.Itoa(os.Getpid())
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: secret}}, Code: `print(open("` + secret + `/f.txt").read())`}))
	spare := nsEnteredSpare(t, p)
	look := func(pid int) (mounts string, root []string) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
		require.NoError(t, err)
		ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/root/")
		require.NoError(t, err)
		for _, e := range ents {
			root = append(root, e.Name())
		}
		return string(b), root
	}
	mounts, root := look(spare)
	t.Logf("leased namespace: %v", root)
	require.NotContains(t, mounts, secret, "a leased namespace holds an earlier job's mount")
	require.NotContains(t, root, strings.TrimPrefix(secret, "/"), "a leased namespace shows an earlier job's mountpoint")
	require.NotContains(t, root, "data")
	// Its root: not read-only before the attach (the first mountinfo line
	// is the root's mount).
	require.NotContains(t, strings.Fields(strings.SplitN(mounts, "\n", 2)[0])[5], "ro")

	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `import os
print(open("/data/f.txt").read(), os.path.exists("` + secret + `"), bool(os.statvfs("/").f_flag & os.ST_RDONLY), os.readlink("/proc/self"))
try:
    os.mkdir("/nsfast-new")
except OSError as e:
    print(e.errno)`})
	requireOK(t, res)
	require.Equal(t, "hello False True "+strconv.Itoa(spare)+"\n30\n", res.Stdout, "the job ran elsewhere than in the leased spare, or saw more")
	next := nsEnteredSpare(t, p, spare)
	mounts, root = look(next)
	require.NotContains(t, mounts, "/data ")
	require.NotContains(t, root, "data")
	require.NotContains(t, root, "nsfast-new")
}

// Probe: a job whose mounts cannot be attached to the namespace its
// ready ns spare entered (a path beneath one of the host's top-level
// links, which the namespace holds as a link) gets a SandboxSetupError
// and runs nothing: the spare, which has entered the namespace and waits
// for its job, never gets it and is ended; the next job runs in a new
// spare.
func TestHostileNSFastAttachFailsNoCode(t *testing.T) {
	testenv.Slow(t)
	p, data, out := nsPool(t)
	var link string
	for _, l := range []string{"/lib", "/bin", "/lib64", "/sbin"} {
		if fi, err := os.Lstat(l); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			link = l
			break
		}
	}
	if link == "" {
		t.Skip("the host has no top-level symbolic link")
	}
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `print(1)`}))
	marker := filepath.Join(out, "ran")
	for range 3 {
		spare := nsEnteredSpare(t, p)
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/ok"}, {HostPath: data, Path: link + "/pynox-nsfast"},
			{HostPath: out, Path: out, Mode: ReadWrite}},
			Code: `open("` + marker + `", "w").write("ran"); print("ran")`})
		require.NotNil(t, res.Error, "stdout: %s", res.Stdout)
		t.Log(res.Error.Message)
		require.Equal(t, "SandboxSetupError", res.Error.Type)
		require.Contains(t, res.Error.Message, "no code ran")
		require.Empty(t, res.Stdout)
		require.NoFileExists(t, marker)
		require.True(t, eventually(func() bool { return !processAlive(spare) }), "the spare whose attach failed lives on")
	}
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `import os
print(open("/data/f.txt").read(), os.path.exists("/ok"))`})
	requireOK(t, res)
	require.Equal(t, "hello False\n", res.Stdout)
}

// Probe: a ready ns spare that dies in its leased namespace costs the
// next mount job only a retry in a fresh spare; after the mounter dies,
// a spare that still holds a lease gets no job (the attach fails: a
// SandboxSetupError, no code ran), nothing hangs, and plain jobs run on.
func TestHostileNSFastSpareOrMounterDies(t *testing.T) {
	testenv.Slow(t)
	before := mounterPids(t)
	p, data, out := nsPool(t)
	job := Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `import os; print(open("/data/f.txt").read(), os.readlink("/proc/self"))`}
	requireOK(t, run(t, p, job))
	dead := nsEnteredSpare(t, p)
	require.NoError(t, unix.Kill(dead, unix.SIGKILL))
	res := run(t, p, job)
	requireOK(t, res)
	require.NotEqual(t, "hello "+strconv.Itoa(dead)+"\n", res.Stdout)

	nsEnteredSpare(t, p, dead)
	mounter := newMounter(t, before)
	require.NoError(t, unix.Kill(mounter, unix.SIGKILL))
	require.True(t, eventually(func() bool { return !processAlive(mounter) }))
	marker := filepath.Join(out, "ran")
	for range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		res, err := p.Run(ctx, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}, {HostPath: out, Path: out, Mode: ReadWrite}},
			Code: `open("` + marker + `", "w").write("ran")`})
		cancel()
		require.NoError(t, err, "a mount job after the mounter's death did not answer")
		require.NotNil(t, res.Error)
		t.Log(res.Error.Message)
		require.Equal(t, "SandboxSetupError", res.Error.Type)
		require.Contains(t, res.Error.Message, "no code ran")
		require.NoFileExists(t, marker)
	}
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
}

// Probe: concurrent mount jobs on two workers, each with its own
// directory at the same path and one at a path of its own, see their own
// files and never the other's path, round after round.
func TestHostileNSFastConcurrentJobs(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 2})
	requireNS(t, p)
	dir := p.Config().Dir
	var specs [2][]MountSpec
	for i := range 2 {
		d := filepath.Join(dir, "d"+strconv.Itoa(i))
		require.NoError(t, os.Mkdir(d, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, "f.txt"), []byte("job"+strconv.Itoa(i)), 0o644))
		specs[i] = []MountSpec{{HostPath: d, Path: "/data"}, {HostPath: d, Path: "/only" + strconv.Itoa(i)}}
	}
	for round := range 8 {
		var wg sync.WaitGroup
		var got [2]*Result
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i] = run(t, p, Job{Mounts: specs[i], Code: `import os
print(open("/data/f.txt").read(), open("/only` + strconv.Itoa(i) + `/f.txt").read(), os.path.exists("/only` + strconv.Itoa(1-i) + `"))`})
			}()
		}
		wg.Wait()
		for i := range 2 {
			requireOK(t, got[i])
			want := "job" + strconv.Itoa(i)
			require.Equal(t, want+" "+want+" False\n", got[i].Stdout, "round %d job %d", round, i)
		}
	}
}
