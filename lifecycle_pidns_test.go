package pynox

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// TestPIDNamespaceReported checks that templates run as PID 1 of PID
// namespaces of their own (as root the kernel always allows it), that the
// ready event says so, and that the pool knows a session's process by its
// pid in the pool's namespace, not the one the process sees.
func TestPIDNamespaceReported(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	if !p.PIDNamespace() {
		require.NotZero(t, os.Geteuid(), "root may always create a PID namespace")
		t.Skip("this kernel or user may not create PID namespaces")
	}
	// (The ready event's pid_namespace is checked in package jsonl.)

	co := checkout(t, p, Job{})
	r := feed(t, co, "import os\nprint(os.getpid(), os.readlink('/proc/self'))")
	requireOK(t, r)
	f := strings.Fields(r.Stdout)
	require.Len(t, f, 2)
	require.NotEqual(t, f[0], f[1], "the process sees its pid in its template's namespace")
	require.Equal(t, strconv.Itoa(co.Pid()), f[1], "Checkout.Pid is its pid in the pool's namespace")
	_, ppid, ok := procStat(co.Pid())
	require.True(t, ok)
	require.Equal(t, co.tpl.Pid(), ppid)
}

// TestPIDNamespaceConfig checks the pid_namespace setting: "off" starts
// ordinary children, a bad value is refused naming the field.
func TestPIDNamespaceConfig(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 1, PIDNamespace: "off"})
	require.False(t, p.PIDNamespace())
	r := run(t, p, Job{Code: "import os\nprint(os.getpid() == int(os.readlink('/proc/self')))"})
	requireOK(t, r)
	require.Equal(t, "True\n", r.Stdout)

	_, err := New(Config{Workers: 1, Dir: t.TempDir(), Python: testPython(), PIDNamespace: "sometimes"})
	require.ErrorContains(t, err, `pool.pid_namespace: "sometimes": expected "auto", "require" or "off"`)

	if os.Geteuid() == 0 {
		p := newTestPool(t, Config{Workers: 1, PIDNamespace: "require"})
		require.True(t, p.PIDNamespace())
	}
	// (The pid_namespace key of the configuration file is checked in
	// package jsonl.)
}

// becomeSubreaper makes the test process a child subreaper for the rest of
// the test, as a Go program that is PID 1 of a container (or a service
// manager) is: every orphan below it becomes its child, and a zombie of
// its own unless it is reaped.
func becomeSubreaper(t *testing.T) {
	t.Helper()
	require.NoError(t, unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))
	t.Cleanup(func() {
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
		// On a failure, do not leave the zombies to the next tests: reap
		// those in another session (orphans; what the test started itself
		// shares its session).
		sid, _ := unix.Getsid(0)
		for _, pid := range zombieChildren() {
			if f := procStatFields(pid); len(f) > 3 && f[3] != strconv.Itoa(sid) {
				var ws unix.WaitStatus
				_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			}
		}
	})
}

// zombieChildren returns the pids of the test process's children that
// are zombies.
func zombieChildren() []int {
	me := os.Getpid()
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, ppid, ok := procStat(pid); ok && ppid == me && state == "Z" {
			out = append(out, pid)
		}
	}
	return out
}

// requireNoZombies waits a moment for the pool to reap what it is
// reaping, then asserts that the test process has no zombie children.
func requireNoZombies(t *testing.T, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(zombieChildren()) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	require.Empty(t, zombieChildren(), "zombie children of the test process after %s", what)
}

// TestNoZombiesUnderSubreaper is issue 17 item 7: with the Go program a
// subreaper, finished checkouts, one-shot jobs and Close leave it no
// zombie (each finished checkout used to orphan its session process). It
// holds with PID namespaces (the kernel reaps a namespace with its init)
// and without (a template waits for every child it kills).
func TestNoZombiesUnderSubreaper(t *testing.T) {
	testenv.Slow(t)
	requireSandbox(t)
	for _, mode := range []string{"auto", "off"} {
		t.Run(mode, func(t *testing.T) {
			becomeSubreaper(t)
			p := newTestPool(t, Config{Workers: 1, PIDNamespace: mode})
			ctx := context.Background()
			for i := range 10 {
				co := checkout(t, p, Job{})
				requireOK(t, feed(t, co, "x = "+strconv.Itoa(i)))
				requireOK(t, feed(t, co, "print(x)"))
				require.NoError(t, co.Finish(ctx))
			}
			requireNoZombies(t, "10 finished checkouts")
			for range 10 {
				requireOK(t, run(t, p, Job{Code: "print(1)"}))
			}
			// A session whose process ended by itself, then a new one
			// forked from the same template.
			co := checkout(t, p, Job{})
			requireOK(t, feed(t, co, "print(1)"))
			r := feed(t, co, "raise SystemExit(3)")
			require.True(t, r.SessionEnded)
			requireOK(t, feed(t, co, "print(2)"))
			require.NoError(t, co.Finish(ctx))
			requireNoZombies(t, "10 jobs and an ended session")

			co = checkout(t, p, Job{})
			requireOK(t, feed(t, co, "y = 1"))
			require.NoError(t, p.Close())
			requireNoZombies(t, "Close with a session open")
		})
	}
}
