package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestReaperTellsOursFromOrphans checks, on real processes, the rule that
// keeps `pynox pool`'s reaper off the statuses os/exec waits for while it
// reaps every orphan: a child started like a template (own process group)
// or like a probe (our group) is ours, also as a zombie; a process in a
// template's group that has not yet started its own session (a spare
// orphaned in the instant after its fork, which CI once caught as a
// zombie that was never reaped) and one in a session of its own are not.
func TestReaperTellsOursFromOrphans(t *testing.T) {
	sid, err := unix.Getsid(0)
	require.NoError(t, err)
	pgrp := unix.Getpgrp()
	start := func(attr *syscall.SysProcAttr, args ...string) *exec.Cmd {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.SysProcAttr = attr
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	probe := start(nil, "sleep", "30")
	require.True(t, ours(probe.Process.Pid, sid, pgrp), "a child in our process group")

	// A template: its own group; its child stays in that group.
	r, w, err := os.Pipe()
	require.NoError(t, err)
	tpl := exec.Command("sh", "-c", "sleep 30 & echo $!; wait")
	tpl.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	tpl.Stdout = w
	require.NoError(t, tpl.Start())
	w.Close()
	t.Cleanup(func() { _ = syscall.Kill(-tpl.Process.Pid, syscall.SIGKILL); _ = tpl.Wait() })
	b := make([]byte, 32)
	n, err := r.Read(b)
	require.NoError(t, err)
	spare, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	require.NoError(t, err)
	require.True(t, ours(tpl.Process.Pid, sid, pgrp), "a template leads its own group")
	require.False(t, ours(spare, sid, pgrp), "a template's child before its setsid")

	leader := start(&syscall.SysProcAttr{Setsid: true}, "sleep", "30")
	require.False(t, ours(leader.Process.Pid, sid, pgrp), "a process in a session of its own")

	// A zombie keeps its session and group until it is reaped.
	z := exec.Command("true")
	z.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, z.Start())
	require.Eventually(t, func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(z.Process.Pid) + "/stat")
		if err != nil {
			return false
		}
		s := string(b)
		return strings.Fields(s[strings.LastIndexByte(s, ')')+2:])[0] == "Z"
	}, 5*time.Second, 5*time.Millisecond)
	require.True(t, ours(z.Process.Pid, sid, pgrp), "an exited template not yet collected by os/exec")
	require.NoError(t, z.Wait())
}
