package pynox

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// TestReview29AheadCollectTmpdir: a one-shot job with a "$TMPDIR/…"
// collect pattern that takes a namespace attached ahead (its scratch
// directory swapped for the namespace's own) gets the files it wrote in
// its own $TMPDIR, and never those of another job: the scratch directory
// the plan made first, which the pattern named, goes back to the pool's
// free list at once and is given to the next job.
func TestReview29AheadCollectTmpdir(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 3})
	requireNS(t, p)
	data := filepath.Join(p.Config().Dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("hello"), 0o644))
	mounts := []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}
	aheadWarm(t, p, mounts)
	took := 0
	for i := 0; i < 20 && took < 3; i++ {
		before := aheadOf(p)
		var wg sync.WaitGroup
		others := make([]*Result, 2)
		for k := range others {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Another tenant's job without mounts, started while the
				// mount job runs: it gets the scratch directory the mount
				// job's plan made first, if that went back to the free list.
				time.Sleep(300 * time.Millisecond)
				others[k] = run(t, p, Job{Code: `import os, time
open(os.path.join(os.environ["TMPDIR"], "secret.txt"), "w").write("other tenant")
time.sleep(1.2)`})
			}()
		}
		res := run(t, p, Job{Mounts: mounts, Collect: []string{"$TMPDIR/*.txt"}, Code: `import os, time
open(os.path.join(os.environ["TMPDIR"], "mine.txt"), "w").write("mine")
time.sleep(0.9)`})
		wg.Wait()
		requireOK(t, res)
		for _, o := range others {
			requireOK(t, o)
		}
		if aheadOf(p).took > before.took {
			took++
		}
		var names []string
		for _, f := range res.Files {
			names = append(names, filepath.Base(f.Path)+"="+string(f.Data))
			require.True(t, strings.HasPrefix(f.Path, res.Policy.Scratch+"/"), "collected %s from outside the job's scratch directory %s", f.Path, res.Policy.Scratch)
		}
		require.Equal(t, []string{"mine.txt=mine"}, names, "job %d (took ahead: %v): files collected from $TMPDIR", i, aheadOf(p).took > before.took)
	}
	if took == 0 {
		t.Skip("no job took a namespace attached ahead: " + strconv.Itoa(took))
	}
}

// TestReview29AheadReattachKeepsCwd: a job whose spare entered a
// namespace attached ahead for a part with a grant beneath the pool's
// working directory, and which asks for other mounts (the mounter's
// reattach), starts in the pool's working directory, as it would in a
// namespace attached for it: the reattach removes the entries made for
// the part it detaches, never the base's working directory (nor its
// parents) beneath which that part's grant sat.
func TestReview29AheadReattachKeepsCwd(t *testing.T) {
	t.Parallel()
	p, data := r13ProcPool(t)
	dir := p.Config().Dir
	real, err := filepath.EvalSymlinks(dir)
	require.NoError(t, err)
	other := filepath.Join(dir, "other")
	require.NoError(t, os.Mkdir(other, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(other, "o.txt"), []byte("other"), 0o644))
	// The part attached ahead: a mount at a virtual path, and a read
	// grant of a directory beneath the working directory.
	ahead := Job{Mounts: []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}, AllowRead: []string{data}, Code: "pass"}
	entered := false
	for range 10 {
		for i := range 30 {
			requireOK(t, run(t, p, ahead))
			if i >= 2 && aheadOf(p).ready > 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if aheadEntered(p, nsSparePid(t, p.workers[0].live.Load())) {
			entered = true
			break
		}
	}
	if !entered {
		t.Skip("the ready ns spare never entered a namespace attached ahead")
	}
	before := aheadOf(p)
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: other, Path: "/other", Mode: ReadOnly}}, Code: `import os
print(os.getcwd(), open("/other/o.txt").read())`})
	requireOK(t, res)
	require.Equal(t, before.reattached+1, aheadOf(p).reattached, "the job did not run in the namespace attached ahead")
	require.Equal(t, real+" other\n", res.Stdout, "the job's working directory after the reattach")
}

// TestReview29AheadNoLeakMixed: a pool whose mount jobs repeat a part,
// then ask for another now and then (the spare that entered a namespace
// attached ahead has the mounter reattach), holds no more descriptors
// and scratch directories after many rounds than after a few (80 rounds:
// a leak of one per round shows).
func TestReview29AheadNoLeakMixed(t *testing.T) {
	testenv.Slow(t)
	p, data := r13ProcPool(t)
	other := filepath.Join(p.Config().Dir, "other")
	require.NoError(t, os.Mkdir(other, 0o755))
	a := Job{Mounts: []MountSpec{{HostPath: data, Path: "/data", Mode: ReadOnly}}, Code: "pass"}
	b := Job{Mounts: []MountSpec{{HostPath: other, Path: "/other", Mode: ReadOnly}}, Code: "pass"}
	count := func() (fds, dirs int) {
		ents, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)

		sd, err := os.ReadDir(p.scratch.path)
		require.NoError(t, err)
		return len(ents), len(sd)
	}
	round := func() {
		for range 3 {
			requireOK(t, run(t, p, a))
		}
		time.Sleep(30 * time.Millisecond)
		requireOK(t, run(t, p, b))
	}
	for range 4 {
		round()
	}
	time.Sleep(500 * time.Millisecond)
	fds0, dirs0 := count()
	before := aheadOf(p)
	for range 80 {
		round()
	}
	time.Sleep(500 * time.Millisecond)
	fds1, dirs1 := count()
	after := aheadOf(p)
	t.Logf("fds %d -> %d, scratch dirs %d -> %d; ahead %+v -> %+v", fds0, fds1, dirs0, dirs1, before, after)
	require.Positive(t, after.reattached-before.reattached, "no job reattached")
	require.LessOrEqual(t, fds1, fds0+24, "descriptors grew (a live spare holds a dozen, which of its cgroups varies)")
	require.LessOrEqual(t, dirs1, dirs0+4, "scratch directories grew")
}

// TestReview29AheadIdleReleasesSources: once a pool stops attaching
// ahead (no mount job for its idle time), nothing it attached ahead
// keeps a source's file system busy: SECURITY.md and nsmount_ahead.go
// say an unmount on the host is busy "at most nsAheadIdle after the last
// mount job". (A ready ns spare that entered a namespace attached ahead
// still holds clones of the sources' mounts, which keep the file system
// alive as a lazy unmount would, but not the host's mount busy.)
func TestReview29AheadIdleReleasesSources(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p, _, _ := nsPool(t)
	p.ns.ahead.mu.Lock()
	p.ns.ahead.idleAfter = 300 * time.Millisecond
	p.ns.ahead.mu.Unlock()
	src := filepath.Join(p.Config().Dir, "vol")
	require.NoError(t, os.Mkdir(src, 0o755))
	if err := unix.Mount("pynox-r29", src, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs for the test: %v", err)
	}
	mounted := true
	defer func() {
		if mounted {
			unix.Unmount(src, unix.MNT_DETACH)
		}
	}()
	require.NoError(t, os.WriteFile(filepath.Join(src, "f.txt"), []byte("hello"), 0o644))
	mounts := []MountSpec{{HostPath: src, Path: "/data", Mode: ReadOnly}}
	pid := aheadSpare(t, p, mounts)
	require.True(t, eventually(func() bool { s := aheadOf(p); return !s.active && s.ready == 0 }), "still attaching ahead: %+v", aheadOf(p))
	time.Sleep(500 * time.Millisecond)
	held := aheadEntered(p, pid) && processAlive(pid)
	err := unix.Unmount(src, 0)
	if err == nil {
		mounted = false
	}
	require.NoError(t, err, "the host's unmount of a source is busy after the pool stopped attaching ahead (the ready ns spare %d still sits in a namespace attached ahead: %v)", pid, held)
}
