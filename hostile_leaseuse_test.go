package pynox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A job that takes a ready ns spare's lease and then never reaches its
// attach (the spare was killed just before the job took it, so the job
// went to another process) ends that lease: after many such jobs the
// mounter holds no more namespaces than its stock, its own and one
// lease per ready ns spare. Before the fix each such job left the
// mounter one namespace for good.
func TestHostileLeaseOfDeadSpareEnds(t *testing.T) {
	before := mounterPids(t)
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	mounter := newMounter(t, before)
	settled := func() int {
		// The count the mounter settles at: two equal reads in a row
		// after the background stock builds are done (a wait, not a
		// timing assertion).
		prev := -1
		for range 200 {
			r13Leased(t, p)
			n := r13MounterNS(mounter)
			if n == prev {
				return n
			}
			prev = n
			time.Sleep(50 * time.Millisecond)
		}
		return prev
	}
	ns0 := settled()
	for range 8 {
		spare := r13Leased(t, p)
		// Killed, and the job sent at once: it may take the dead spare
		// (and its lease) before the template reports its exit.
		require.NoError(t, unix.Kill(spare, unix.SIGKILL))
		res := run(t, p, Job{Mounts: mounts, Code: `print(open("/data/f.txt").read())`})
		requireOK(t, res)
		require.Equal(t, "hello\n", res.Stdout)
	}
	ns1 := settled()
	t.Logf("mounter namespaces %d -> %d", ns0, ns1)
	require.LessOrEqual(t, ns1, ns0, "leases of jobs that never reached their attach were not ended")
	advServes(t, p)
}
