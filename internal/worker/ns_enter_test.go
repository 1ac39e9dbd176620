package worker

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/mountns"
)

// TestNSEnteredSpareFailsClosed: an ns spare that entered a leased
// namespace ahead of its job (an "enter" frame) refuses, before any code
// of the job runs, a job whose mounts were never attached (the
// namespace's root is still writable: the attach makes it read-only
// last), and a job that brings namespace descriptors of its own; an ns
// spare that entered none refuses a job that says it did.
func TestNSEnteredSpareFailsClosed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the mounter needs root")
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("user namespaces are disabled")
	}
	m, err := mountns.Start("/usr/bin/python3")
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	usr, err := os.Open("/usr")
	require.NoError(t, err)
	defer usr.Close()
	proc, err := os.Open("/proc")
	require.NoError(t, err)
	defer proc.Close()
	require.NoError(t, m.Prepare(mountns.Plan{Binds: []mountns.Bind{{Source: int(usr.Fd()), Path: "/usr", ReadOnly: true},
		{Source: int(proc.Fd()), Path: "/proc", ReadOnly: true}}, Links: mountns.HostLinks()}, 2))
	lease := func() *mountns.Lease {
		var l *mountns.Lease
		require.Eventually(t, func() bool {
			l, err = m.Lease()
			return err == nil
		}, time.Minute, 10*time.Millisecond, "no lease: %v", err)
		return l
	}
	tpl := startTestTemplate(t, false)
	_, err = tpl.TakeNS(false, closedChan) // the first asks for the ready one
	require.ErrorIs(t, err, errCanceled)
	take := func() *Child {
		require.Eventually(t, func() bool { return tpl.HasNSSpare(false) }, time.Minute, time.Millisecond)
		c, err := tpl.TakeNS(false, nil)
		require.NoError(t, err)
		return c
	}
	enter := func(c *Child) {
		l := lease()
		defer l.Namespace.Close()
		require.NoError(t, c.sendRaw(enterFrame, []int{int(l.Namespace.User.Fd()), int(l.Namespace.Mount.Fd())}))
	}

	// Entered, but the job's mounts were never attached.
	job, flag := nsTestJob(t)
	job.Namespace = &Namespace{Entered: true}
	c := take()
	enter(c)
	requireNeverRan(t, c.Run(&job, nil), flag, "root is writable")

	// Entered, and the job brings namespace descriptors of its own.
	l := lease()
	defer l.Namespace.Close()
	job, flag = nsTestJob(t)
	job.Namespace = &Namespace{User: int(l.Namespace.User.Fd()), Mount: int(l.Namespace.Mount.Fd())}
	c = take()
	enter(c)
	requireNeverRan(t, c.Run(&job, nil), flag, "disagree")

	// Not entered, and the job says it was.
	job, flag = nsTestJob(t)
	job.Namespace = &Namespace{Entered: true}
	requireNeverRan(t, take().Run(&job, nil), flag, "disagree")

	// An enter frame with other descriptors than namespaces: setns
	// refuses them, and the job is refused.
	dir, err := unix.Open(t.TempDir(), unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(dir)
	c = take()
	require.NoError(t, c.sendRaw(enterFrame, []int{dir, dir}))
	job, flag = nsTestJob(t)
	job.Namespace = &Namespace{Entered: true}
	requireNeverRan(t, c.Run(&job, nil), flag, "setns(user namespace)")

	// The attach runs once the job is sent (the job frame has a grant's
	// descriptor: "ns_wait"), while the spare confines itself. An attach
	// that fails kills the spare before any code; one that succeeds
	// without attaching anything (the root still writable) is refused by
	// the spare.
	grant, err := unix.Open(t.TempDir(), unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(grant)
	c = take()
	enter(c)
	job, flag = nsTestJob(t)
	job.Grants = []Grant{{Fd: grant, Access: 1}}
	job.Namespace = &Namespace{Entered: true, Attach: func() error { return errors.New("the attach failed") }}
	requireNeverRan(t, c.Run(&job, nil), flag, "the attach failed")
	c = take()
	enter(c)
	job, flag = nsTestJob(t)
	job.Grants = []Grant{{Fd: grant, Access: 1}}
	job.Namespace = &Namespace{Entered: true, Attach: func() error { return nil }}
	requireNeverRan(t, c.Run(&job, nil), flag, "root is writable")
	// Without descriptors in the job frame, the attach comes first, and
	// its failure too stops the job.
	c = take()
	enter(c)
	job, flag = nsTestJob(t)
	job.Namespace = &Namespace{Entered: true, Attach: func() error { return errors.New("the attach failed") }}
	requireNeverRan(t, c.Run(&job, nil), flag, "the attach failed")
	require.False(t, isClosed(tpl.Done()), "template failed: %v", tpl.Err())
}
