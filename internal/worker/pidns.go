package worker

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
)

// ErrNoPIDNamespace is the cause of a start under PIDNamespaceRequire that
// cannot have a PID namespace; it wraps the kernel's refusal.
var ErrNoPIDNamespace = errors.New("pid namespace required but unavailable")

// pidns remembers whether the kernel lets this process start a template
// in a PID namespace of its own: learnt at the first start that tries,
// kept for the process's life.
var pidns struct {
	mu      sync.Mutex
	known   bool
	ok      bool
	refused error // why not, when !ok
}

// testPIDNSHook, set only by this package's tests, may spoil the
// attributes of a start in a PID namespace (to prove the fallback).
var testPIDNSHook func(attr *syscall.SysProcAttr)

// pidnsAttr sets the clone flags and id maps of a template's PID
// namespace: a plain CLONE_NEWPID as root; otherwise a user namespace
// (which an unprivileged process may create) owning the PID namespace,
// with the caller's uid and gid mapped to themselves and setgroups
// denied, so that ids and file ownership are what they were without it.
func pidnsAttr(attr *syscall.SysProcAttr) {
	attr.Cloneflags = syscall.CLONE_NEWPID
	if uid := os.Geteuid(); uid != 0 {
		gid := os.Getegid()
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		attr.GidMappingsEnableSetgroups = false
	}
}

// startProcess starts the template's interpreter with its channel as fd 3,
// in a PID namespace of its own when opts allow and the kernel does (ns
// reports which). Under PIDNamespaceAuto a start that fails only because
// of the namespace is retried without it, and the refusal remembered.
func startProcess(opts Options, channel *os.File, stderr io.Writer) (cmd *exec.Cmd, ns bool, err error) {
	mode := opts.PIDNamespace
	switch mode {
	case "":
		mode = PIDNamespaceAuto
	case PIDNamespaceAuto, PIDNamespaceRequire, PIDNamespaceOff:
	default:
		return nil, false, fmt.Errorf("pid namespace mode %q: want %q, %q or %q", mode,
			PIDNamespaceAuto, PIDNamespaceRequire, PIDNamespaceOff)
	}
	build := func(ns bool) *exec.Cmd {
		c := exec.Command(opts.Python, "-I", "-B", "-c", runnerBoot)
		c.Stdin = strings.NewReader(runnerSource) // see runnerBoot
		c.Dir = opts.Dir
		c.Env = opts.Env
		c.ExtraFiles = []*os.File{channel}
		c.Stderr = stderr
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		if ns {
			pidnsAttr(c.SysProcAttr)
			if testPIDNSHook != nil {
				testPIDNSHook(c.SysProcAttr)
			}
		}
		return c
	}
	pidns.mu.Lock()
	known, ok, refused := pidns.known, pidns.ok, pidns.refused
	pidns.mu.Unlock()
	if mode == PIDNamespaceOff || (known && !ok) {
		if mode == PIDNamespaceRequire {
			return nil, false, fmt.Errorf("%w: %w", ErrNoPIDNamespace, refused)
		}
		cmd = build(false)
		if err := cmd.Start(); err != nil {
			return nil, false, fmt.Errorf("start %s: %w", opts.Python, err)
		}
		return cmd, false, nil
	}
	cmd = build(true)
	nsErr := cmd.Start()
	if nsErr == nil {
		pidns.mu.Lock()
		pidns.known, pidns.ok = true, true
		pidns.mu.Unlock()
		return cmd, true, nil
	}
	if !known && mode == PIDNamespaceRequire {
		return nil, false, fmt.Errorf("%w: start %s in one: %w", ErrNoPIDNamespace, opts.Python, nsErr)
	}
	if known {
		// It worked before: this failure is not the namespace's.
		return nil, false, fmt.Errorf("start %s in a pid namespace: %w", opts.Python, nsErr)
	}
	cmd = build(false)
	if err := cmd.Start(); err != nil {
		// Not the namespace's fault either: learn nothing.
		return nil, false, fmt.Errorf("start %s: %w", opts.Python, err)
	}
	pidns.mu.Lock()
	if !pidns.known {
		pidns.known, pidns.ok, pidns.refused = true, false, nsErr
	}
	pidns.mu.Unlock()
	return cmd, false, nil
}
