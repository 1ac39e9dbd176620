package pynox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// A job that takes a ready ns spare's lease and then never reaches its
// attach (the spare was killed just before the job took it, so the job
// went to another process) ends that lease: after many such jobs the
// mounter holds no more namespaces than its stock, its own and one
// lease per ready ns spare. Before the fix each such job left the
// mounter one namespace for good.
func TestHostileLeaseOfDeadSpareEnds(t *testing.T) {
	testenv.Slow(t)
	before := mounterPids(t)
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	mounter := newMounter(t, before)
	// Namespaces the mounter holds that no process is in, past its
	// own: its stock (at most nsStock) and any lease that was never
	// ended (no process is in it either).
	idle := func() int { return r13MounterNS(mounter) - nsLeased(mounter) - 1 }
	for range 16 {
		spare := r13Leased(t, p)
		// Killed, and the job sent at once: it may take the dead spare
		// (and its lease) before the template reports its exit.
		require.NoError(t, unix.Kill(spare, unix.SIGKILL))
		res := run(t, p, Job{Mounts: mounts, Code: `print(open("/data/f.txt").read())`})
		requireOK(t, res)
		require.Equal(t, "hello\n", res.Stdout)
	}
	// Read once the count holds still for half a second (the stock refills
	// in the background, a build at a time; a wait, not a timing
	// assertion): a lease never ended stays on top of a full stock.
	last, same := -1, 0
	for i := 0; i < 400 && same < 5; i++ {
		if n := idle(); n == last {
			same++
		} else {
			last, same = n, 0
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the mounter holds %d namespaces no process is in; its stock is at most %d", last, p.nsStock())
	require.LessOrEqual(t, last, p.nsStock(), "leases of jobs that never reached their attach were not ended")
	advServes(t, p)
}

// A request whose mounts cannot be (two of them overlap) is refused
// before it takes a process: the template's ready ns spare, which has
// entered a namespace leased for it, stays ready for the next job
// instead of being closed with its namespace.
func TestNSRefusedMountsKeepReadySpare(t *testing.T) {
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	tpl := p.workers[0].live.Load()
	spare := nsSparePid(t, tpl)
	for range 3 {
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/ff"}, {HostPath: data, Path: "/ff/x"}},
			Code: "print('ran')"})
		require.NotNil(t, res.Error)
		require.Contains(t, res.Error.Message, "overlap")
		require.NotContains(t, res.Stdout, "ran")
	}
	require.True(t, processAlive(spare), "the ready ns spare was closed for a refused request")
	require.Equal(t, spare, nsSparePid(t, tpl), "the ready ns spare was replaced for a refused request")
	res := run(t, p, Job{Mounts: mounts, Code: `print(open("/data/f.txt").read())`})
	requireOK(t, res)
	require.Equal(t, "hello\n", res.Stdout)
}
