package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// Finding (outside review): removeStale judges a directory
// pynox-<pid>-… stale when kill(pid, 0) fails, but a pid means something
// only in the caller's PID namespace. A pool that starts in a PID
// namespace of its own (a container sharing the host's cgroup file
// system, or a pool run as PID 1 as lifecycle_pidns_test.go does) sees no
// other pool's pid and removes every empty cgroup of every other pool on
// the machine: their free job groups and, when a pool is idle, its whole
// directory. The live pool's next job then fails closed with
// SandboxSetupError ("cgroup: mkdir /sys/fs/cgroup/pids/pynox-…/j1: no
// such file or directory" — seen during this review while other pools'
// tests ran on the same machine). Fixed: a pool is live while it holds a
// flock on its directories (see removeStale), whatever its pid means here.
func TestHostileReviewStaleAcrossPIDNamespaces(t *testing.T) {
	if dir := os.Getenv("PYNOX_REVIEW_STALE_DIR"); dir != "" {
		// The helper: a pool starting in a PID namespace of its own.
		removeStale(dir)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("a PID namespace needs root here")
	}
	// A plain directory stands for the cgroup root: the live pool's
	// directory, named for this (running) process, with an idle job group.
	dir := t.TempDir()
	live := filepath.Join(dir, fmt.Sprintf("pynox-%d-123", os.Getpid()))
	require.NoError(t, os.MkdirAll(filepath.Join(live, "j1"), 0o700))
	fd, err := lockDir(live) // as the live pool holds it
	require.NoError(t, err)
	defer syscall.Close(fd)

	cmd := exec.Command(os.Args[0], "-test.run=^TestHostileReviewStaleAcrossPIDNamespaces$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PYNOX_REVIEW_STALE_DIR="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	require.DirExists(t, filepath.Join(live, "j1"), "the idle job group of a running pool was removed as stale")
	require.DirExists(t, live)
}
