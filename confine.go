package pynox

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/worker"
)

// SelfConfinement says how the pool's own process is confined (see
// Config.ConfineSelf). `pynox pool` reports it in its ready event.
type SelfConfinement struct {
	// Landlock is the Landlock ABI at which the pool process's own domain
	// was enforced. Zero means the pool process is not confined; Reason
	// says why.
	Landlock int `json:"landlock"`
	// TCP is "deny" when the pool's domain denies TCP bind and connect
	// (Landlock ABI 4 or newer and a ceiling without the network), and
	// "allow" otherwise.
	TCP string `json:"tcp"`
	// Signals is "scoped" when nothing in the pool's domain can signal a
	// process outside it (Landlock ABI 8 or newer), and "allow"
	// otherwise. Before ABI 8 each thread of the process enters a domain
	// of its own, and a domain scoped for signals would stop the pool
	// from signalling a job whose template another thread started.
	Signals string `json:"signals"`
	// Reason says why Landlock is zero: confinement was not asked for, or
	// the kernel lacks Landlock.
	Reason string `json:"reason,omitempty"`
	// TCPConnect lists the ports the domain lets the process connect to
	// although TCP is "deny" (Config.ConfineSelfConnectTCP).
	TCPConnect []uint16 `json:"tcp_connect,omitempty"`
}

// maxSelfABI is the newest Landlock ABI the go-landlock version pynox is
// built with knows; a newer kernel is used at this ABI.
const maxSelfABI = 11

// selfPolicy is the Landlock domain a pool puts its own process in, as
// data: built by [Pool.selfPolicy], rendered by String, applied by apply.
// Templates and every job inherit the domain (Landlock domains are kept
// across fork and exec and only ever stack), so it must allow everything
// any job may ever be granted — and, so that code escaping into a template
// still finds only the ceiling, nothing more, with one exception: /proc,
// read-only, because each template inspects its own /proc/self and its
// process id is not known when the domain is made.
type selfPolicy struct {
	ABI     int            // the ABI the masks were computed at
	DenyNet bool           // handle (deny) TCP and UDP bind and connect
	Connect []uint16       // TCP ports connect is allowed to when DenyNet
	Rules   []sandbox.Rule // sorted by path, one per path
	// NSRoots are the slot directories of the tmpfs every job mount
	// namespace's root is a clone of one of (/proc/self/fd paths; see
	// mountns.Plan.Slots), or none. Landlock's path walk in a job's
	// namespace ends at that root, not at the ancestors of the host
	// directories bound there, so the rule on it is what lets a job use
	// its namespace; the namespace holds only what the domain allows
	// anyway (runtime and system paths, grants within the ceiling, the
	// job's scratch, /proc and device files, and the job's overlays).
	NSRoots      []string
	NSRootAccess uint64
}

// String renders the policy, one rule per line.
func (s selfPolicy) String() string {
	var b strings.Builder
	tcp := "allow"
	if s.DenyNet && s.ABI >= 4 {
		tcp = "deny"
	}
	scoped := "none"
	switch {
	case s.ABI >= 8:
		scoped = "abstract_unix_socket|signal"
	case s.ABI >= 6:
		scoped = "abstract_unix_socket"
	}
	fmt.Fprintf(&b, "pool landlock abi=%d tcp=%s scoped=%s\n", s.ABI, tcp, scoped)
	for _, r := range s.Rules {
		fmt.Fprintf(&b, "  %s %s\n", r.Path, sandbox.FSRights(r.Access))
	}
	if s.DenyNet && s.ABI >= 4 {
		for _, port := range s.Connect {
			fmt.Fprintf(&b, "  tcp port %d connect_tcp\n", port)
		}
	}
	if len(s.NSRoots) > 0 {
		fmt.Fprintf(&b, "  (job namespaces' roots: %d slots) %s\n", len(s.NSRoots), sandbox.FSRights(s.NSRootAccess))
	}
	return b.String()
}

// runtimeProbe prints the interpreter's own paths, computed exactly as the
// template computes them at start (same flags), before any preload.
const runtimeProbe = `import json, sys
print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix] + [p for p in sys.path if p]))`

// runtimePaths asks the interpreter (once, in a throw-away process started
// like a template) for its prefixes and sys.path, since the templates that
// would report them must start inside the domain.
func (p *Pool) runtimePaths() ([]string, error) {
	cmd := exec.Command(p.python, "-I", "-B", "-c", runtimeProbe)
	cmd.Dir = p.cfg.Dir
	cmd.Env = p.env
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(ee.Stderr) > 0 {
			return nil, fmt.Errorf("%s could not report its paths: %v: %s", p.python, err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Errorf("%s could not report its paths: %w", p.python, err)
	}
	var paths []string
	if err := json.Unmarshal(out, &paths); err != nil {
		return nil, fmt.Errorf("%s reported its paths as %q: %w", p.python, out, err)
	}
	return append(paths, p.python), nil
}

// selfPolicy builds the pool's domain at abi: read and execute on the
// interpreter's runtime paths and the system paths jobs get, read on the
// package dirs, the read ceiling and /proc, read and write (never execute)
// on the write ceiling and extraWrite (and remove_dir alone on the parent
// of each extraWrite directory, which the pool removes when it closes),
// and the device files jobs use. TCP
// is denied unless the ceiling grants the network. The configuration file
// is not in it: it was read before, and no job may read it.
func (p *Pool) selfPolicy(abi int, runtime, extraWrite []string) selfPolicy {
	access := map[string]uint64{}
	add := func(path string, a uint64) {
		real, err := filepath.EvalSymlinks(path)
		if err != nil {
			return // a runtime path that does not exist (python3X.zip)
		}
		st, err := os.Stat(real)
		if err != nil {
			return
		}
		if !st.IsDir() {
			a = sandbox.ForFile(a)
		}
		access[real] |= a
	}
	rt := sandbox.RuntimeAccess(abi)
	for _, path := range runtime {
		add(path, rt)
	}
	for _, path := range worker.SystemPaths() {
		add(path, rt)
	}
	rd := sandbox.ReadAccess(abi)
	for _, path := range p.cfg.PackageDirs {
		add(path, rd)
	}
	for _, path := range p.cfg.Limits.AllowRead {
		add(path, rd)
	}
	add("/proc", rd)
	wr := sandbox.WriteAccess(abi)
	for _, path := range p.cfg.Limits.AllowWrite {
		add(path, wr)
	}
	for _, path := range extraWrite {
		add(path, wr)
		// The pool removes them when it closes, which takes remove_dir on
		// their parent (and only that: no read, no other change there).
		add(filepath.Dir(path), sandbox.RemoveDirAccess(abi))
	}
	add("/dev/null", sandbox.DeviceAccess(abi, true))
	for _, path := range []string{"/dev/zero", "/dev/urandom", "/dev/random"} {
		add(path, sandbox.DeviceAccess(abi, false))
	}
	s := selfPolicy{ABI: abi, DenyNet: !p.cfg.Limits.AllowNetwork}
	if s.DenyNet {
		s.Connect = slices.Clone(p.cfg.ConfineSelfConnectTCP)
	}
	for _, path := range slices.Sorted(maps.Keys(access)) {
		s.Rules = append(s.Rules, sandbox.Rule{Path: path, Access: access[path]})
	}
	return s
}

// apply enforces the policy on every thread of the calling process, for
// good, through go-landlock, which downgrades it to what the kernel
// offers (best effort).
func (s selfPolicy) apply() error {
	cfg := landlock.V11.BestEffort()
	if !s.DenyNet {
		cfg.HandledAccessNet = 0
	}
	if s.ABI < 8 {
		// Without LANDLOCK_RESTRICT_SELF_TSYNC, go-landlock enforces the
		// ruleset thread by thread (psx), which makes one domain per
		// thread: a template forked by one thread would be outside the
		// signal scope of every other.
		cfg.Scoped &^= landlock.ScopedSet(unix.LANDLOCK_SCOPE_SIGNAL)
	}
	rules := make([]landlock.Rule, 0, len(s.Rules))
	for _, r := range s.Rules {
		rules = append(rules, landlock.PathAccess(landlock.AccessFSSet(r.Access), r.Path))
	}
	if s.DenyNet {
		for _, port := range s.Connect {
			rules = append(rules, landlock.ConnectTCP(port))
		}
	}
	if len(s.NSRoots) > 0 {
		rules = append(rules, landlock.PathAccess(landlock.AccessFSSet(s.NSRootAccess), s.NSRoots...))
	}
	return cfg.Restrict(rules...)
}

// confineSelf puts the calling process in its Landlock domain (see
// selfPolicy), before any template starts, so that every template and job
// inherits it. extraWrite lists directories the pool itself keeps writing
// to besides the write ceiling. Without Landlock in the kernel it confines
// nothing and says why (best effort); a domain that cannot be built or
// enforced is an error.
func (p *Pool) confineSelf(extraWrite []string) (SelfConfinement, error) {
	abi, err := sandbox.ABI()
	if err != nil {
		return SelfConfinement{TCP: "allow", Signals: "allow", Reason: err.Error()}, nil
	}
	abi = min(abi, maxSelfABI)
	if abi < 8 && psxFindsThreadsInProc && !procIsOurs() {
		// libpsx would look for this process's threads under another
		// process's /proc entry and wait for them forever.
		return SelfConfinement{TCP: "allow", Signals: "allow", Reason: fmt.Sprintf(
			"the pool runs in a PID namespace whose /proc is another namespace's (it is pid %d, /proc/self is not), where go-landlock cannot find its threads before Landlock ABI 8: mount /proc for the namespace, or build with CGO_ENABLED=0",
			os.Getpid())}, nil
	}
	runtime, err := p.runtimePaths()
	if err != nil {
		return SelfConfinement{}, fmt.Errorf("confining the pool: %w", err)
	}
	pol := p.selfPolicy(abi, runtime, extraWrite)
	if roots := p.ns.rootRules(); len(roots) > 0 {
		pol.NSRoots = roots
		pol.NSRootAccess = sandbox.RuntimeAccess(abi) | sandbox.WriteAccess(abi) | sandbox.DeviceAccess(abi, true)
	}
	if err := pol.apply(); err != nil {
		return SelfConfinement{}, fmt.Errorf("confining the pool: %w", err)
	}
	sc := SelfConfinement{Landlock: abi, TCP: "allow", Signals: "allow"}
	if pol.DenyNet && abi >= 4 {
		sc.TCP = "deny"
		sc.TCPConnect = pol.Connect
	}
	if abi >= 8 {
		sc.Signals = "scoped"
	}
	return sc, nil
}

// procIsOurs reports whether /proc shows this process under its own pid,
// which it does not in a PID namespace that kept its parent's /proc.
func procIsOurs() bool {
	self, err := os.Readlink("/proc/self")
	return err == nil && self == strconv.Itoa(os.Getpid())
}
