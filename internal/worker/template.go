// Package worker runs pynox's template processes and their job children.
//
// A Template is one trusted CPython process running the embedded runner
// (runner.py). It imports the preloads once, then forks "spare" children
// on request; each spare has done every request-independent confinement
// step before a job reaches it. The template hands each spare's own
// channels (control socket, stdout and stderr pipes, pidfd) to Go over its
// socket with SCM_RIGHTS and keeps none of them, so a job never holds the
// template's channel. The template reports each child's exit status.
//
// Each template is PID 1 of a PID namespace of its own where the kernel
// allows it (see PIDNamespaceAuto): its pids, in its frames, are that
// namespace's, and the host knows the template by cmd.Process.Pid and each
// child by its pidfd (PidOfPidfd).
package worker

import (
	"cmp"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/cgroup"
	"github.com/pynox/pynox/internal/frame"
	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/seccomp"
)

//go:embed runner.py
var runnerSource string

// runnerBoot is the template's -c program: it compiles the runner, which
// it reads from its standard input (to its end), and runs it. Python
// frees the syntax tree of a -c program only when the program returns,
// and the runner's never does: given as the -c program itself, its tree
// (~4.5 MiB for runner.py) stayed in the template's heap, where every fork
// copied its page tables and every child's exit tore them down; and as an
// argument, the interpreter keeps wide-character copies of it (~0.9 MiB).
// The runner points descriptor 0 at /dev/null once it has started. (With
// Debian's CPython 3.11 the template's anonymous memory went from 13.2 to
// ~7 MB, and a bare fork and exit of it from ~0.35 to ~0.24 ms of the
// template's CPU and ~0.48 to ~0.36 ms of the child's.)
const runnerBoot = `import sys; exec(compile(sys.stdin.buffer.read(), "<string>", "exec"))`

// Proto is the version of the host↔template protocol; the template checks
// it first and refuses to serve a host that speaks another.
const Proto = 1

// StartTimeout bounds a template's start-up, preloads included.
const StartTimeout = 2 * time.Minute

// Options configure a template.
type Options struct {
	Python      string   // absolute path of a real interpreter binary
	Dir         string   // working directory of the template and its jobs
	Env         []string // the complete environment ("K=V") of the template and base of its jobs'
	Preload     []string // modules imported once, before any fork
	PackageDirs []string // read-only directories put first on sys.path
	// PreloadTmp is a directory the template may write in while it
	// imports its preloads: matplotlib's configuration and font cache go
	// to a private directory beneath it, removed once the preloads are in
	// (a self-confined pool's template can write nowhere else). Empty for
	// $TMPDIR or /tmp.
	PreloadTmp string
	// Network keeps a spare for jobs granted the network, besides the one
	// for jobs without it. Spares install their seccomp filter ahead of
	// time, so each kind needs its own.
	Network bool
	// OnStderr, when set, receives the template's own stderr lines.
	OnStderr func(line string)
	// SpareTimeout is how long Take waits for a spare before declaring the
	// template wedged; zero means DefaultSpareTimeout.
	SpareTimeout time.Duration
	// PIDNamespace says whether the template becomes PID 1 of a PID
	// namespace of its own: PIDNamespaceAuto (also the zero value),
	// PIDNamespaceRequire or PIDNamespaceOff. See PIDNamespaceAuto.
	PIDNamespace string
	// Cgroups, when it uses cgroups, puts each spare into a cgroup of its
	// own (tasks and memory limits) before any job can reach it; see
	// package cgroup. Nil means none.
	Cgroups *cgroup.Manager
	// Memory is the job allowance a spare's cgroup is sized for until its
	// job brings its own (the pool's ceiling); see MemoryMargin.
	Memory int64
	// CPUs, when not empty, is the CPU affinity the template gives itself
	// first thing, before it imports its preloads or could start a
	// thread, so that every spare, job and session it forks inherits it.
	// The caller picks CPUs from its own allowed set: the kernel refuses
	// a CPU outside the cpuset, and the template then keeps the affinity
	// it inherited (Info.CPUs says which it has). Empty leaves the
	// inherited affinity alone.
	CPUs []int
	// NSLease, when set, leases a prepared mount namespace for each ready
	// ns spare (see TakeNS) as it is delivered: the spare enters it,
	// drops the capabilities it regains there and attaches its seccomp
	// job layer while it waits, off its job's path; the job's mounts are
	// attached to it later (see Child.TakeNSLease). When it fails, the
	// spare enters its job's namespace when the job arrives, as without
	// it.
	NSLease func() (*NSLease, error)
}

// PID namespace modes (Options.PIDNamespace).
const (
	// PIDNamespaceAuto starts each template as PID 1 of a PID namespace
	// of its own when the kernel allows it, and as an ordinary child
	// otherwise; Info.PIDNamespace says which. As root the namespace is a
	// plain CLONE_NEWPID; otherwise it is owned by a user namespace that
	// maps the caller's own uid and gid to themselves (and denies
	// setgroups), whose capabilities the template gives up, with its
	// bounding set, before it forks anything. When the template dies the
	// kernel kills and reaps every process in its namespace, so nothing a
	// job does (clearing its parent-death signal, say) lets it outlive the
	// template, which dies with the pool. Whether the kernel allows it is
	// learnt at the first start and remembered.
	PIDNamespaceAuto = "auto"
	// PIDNamespaceRequire fails a template's start when it cannot have
	// a PID namespace.
	PIDNamespaceRequire = "require"
	// PIDNamespaceOff starts templates as ordinary children, as before
	// PID namespaces were used: jobs then die with their template only by
	// their parent-death signal.
	PIDNamespaceOff = "off"
)

// Info describes a started template.
type Info struct {
	// Pid is the template's process id in the host's (the caller's) PID
	// namespace.
	Pid int
	// PIDNamespace is true when the template is PID 1 of a PID namespace
	// of its own (see PIDNamespaceAuto).
	PIDNamespace bool
	Python       string   // "3.11.2"
	Executable   string   // real path of the interpreter
	Preloaded    []string // modules imported by the template
	RuntimePaths []string // paths jobs may read and execute (resolved, deduplicated)
	Landlock     sandbox.Ruleset
	LandlockErr  string // set when Landlock cannot be applied: every job fails closed
	// MemoryMargin is what a job's cgroup allows on top of the job's
	// memory allowance: the template's anonymous memory (the most a job
	// can copy of the pages it shares with the template) plus
	// MemoryOverhead.
	MemoryMargin int64
	// CPUs is the template's CPU affinity once it has applied
	// Options.CPUs (its inherited one when it had none to apply, or the
	// kernel refused them), in ascending order; its children inherit it.
	CPUs []int
	// PinErr is the kernel's refusal of Options.CPUs, when it refused.
	PinErr string
}

// MemoryOverhead is the part of a job cgroup's memory limit that covers
// the kernel's memory for the job (page tables, kernel stacks of its
// threads, its pipes' and sockets' buffers up to their defaults) beyond
// its allowance and its copies of template pages.
const MemoryOverhead = 32 << 20

// Template is a running template process.
type Template struct {
	info Info
	cmd  *exec.Cmd
	conn *net.UnixConn

	wmu sync.Mutex // serialises writes to conn

	spares       [2]chan *Child // by kind: kindDeny, kindAllow
	network      bool
	cg           *cgroup.Manager
	memory       int64 // the allowance a new spare's cgroup is sized for
	spareTimeout time.Duration
	nsLease      func() (*NSLease, error) // Options.NSLease

	mu       sync.Mutex
	children map[int]*Child // by the pid the template reports (its namespace's)
	dead     bool
	deadErr  error
	// toRelease are the cgroups of closed children whose exit the
	// template has not reported yet, released when it does or when the
	// template dies (releaseWhenReaped).
	toRelease map[*Child]*cgroup.Group

	// routes (guarded by mu) holds, per kind, where each spare asked for
	// and not yet received goes, in the order of the requests (the
	// template forks them in that order): nil for the template's own
	// spare (spares), a waiter for one forked for a session
	// (TakeSession). Pushed under wmu with the request's write, so that
	// the order is the wire's.
	routes [2][]*sessionWait
	// held (guarded by mu) is, per kind, a spare a session took whose
	// replacement waits for RefillNow, or for the next Take.
	held [2]*Child
	// taking and nsTaking (guarded by mu) count, per kind, the Take
	// (TakeNS) calls that found no ready spare and wait for one: a
	// session that takes the ready spare while one waits asks for its
	// replacement at once instead of holding it (holdReady), whichever
	// of the two looked first.
	taking   [2]int
	nsTaking [2]int
	// The ready ns spares (mountns.go): nsSpares holds, per kind, the
	// spare for a job with a mount namespace once the first TakeNS of the
	// kind asked for one (nsKept, guarded by mu); nsHeld (guarded by mu)
	// is, per kind, one a session took whose replacement waits for
	// RefillNow, or for the next TakeNS.
	nsSpares [2]chan *Child
	nsKept   [2]bool
	nsHeld   [2]*Child

	done     chan struct{}
	waitDone chan struct{}
	stderr   *tailBuffer

	// bells waits for the children's bells (bell.go); nil when the
	// template has no epoll instance, and each child reads its own.
	bells *bellPoller
}

// systemPaths are read by ordinary Python programs and hold nothing
// private: shared libraries, time zones, certificates and name-service
// configuration. Paths that do not exist are skipped.
var systemPaths = []string{
	"/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib",
	"/usr/share/zoneinfo", "/usr/share/ca-certificates", "/etc/ssl/certs",
	"/etc/localtime", "/etc/ld.so.cache", "/etc/hosts", "/etc/resolv.conf",
	"/etc/nsswitch.conf", "/etc/host.conf", "/etc/gai.conf", "/etc/protocols", "/etc/services",
	// Debian's matplotlib reads its configuration here at import.
	"/etc/matplotlibrc",
}

// testPolicyHook, set only by this package's tests, may change the policy
// a template is sent (to prove that a confinement step the kernel refuses
// fails every job closed).
var testPolicyHook func(policy map[string]any)

// Start launches a template and completes its handshake. It fails with the
// template's own account (a preload that failed, left a thread or an open
// descriptor) when it has one.
func Start(opts Options) (*Template, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	tplEnd := os.NewFile(uintptr(fds[1]), "template-channel")
	hostFile := os.NewFile(uintptr(fds[0]), "host-channel")
	c, err := net.FileConn(hostFile)
	hostFile.Close()
	if err != nil {
		tplEnd.Close()
		return nil, fmt.Errorf("channel: %w", err)
	}
	t := &Template{
		conn:         c.(*net.UnixConn),
		spares:       [2]chan *Child{make(chan *Child, 1), make(chan *Child, 1)},
		nsSpares:     [2]chan *Child{make(chan *Child, 1), make(chan *Child, 1)},
		network:      opts.Network,
		cg:           opts.Cgroups,
		memory:       opts.Memory,
		spareTimeout: cmp.Or(opts.SpareTimeout, DefaultSpareTimeout),
		nsLease:      opts.NSLease,
		children:     make(map[int]*Child),
		done:         make(chan struct{}),
		waitDone:     make(chan struct{}),
		stderr:       &tailBuffer{max: 8 << 10, onLine: opts.OnStderr},
	}
	cmd, ns, err := startProcess(opts, tplEnd, t.stderr)
	tplEnd.Close()
	if err != nil {
		t.conn.Close()
		return nil, err
	}
	t.cmd = cmd
	t.info.Pid = cmd.Process.Pid
	t.info.PIDNamespace = ns
	go func() {
		_ = cmd.Wait()
		close(t.waitDone)
	}()
	if err := t.handshake(opts); err != nil {
		t.kill()
		return nil, err
	}
	t.info.MemoryMargin = anonMemory(cmd.Process.Pid) + MemoryOverhead
	t.bells, _ = newBellPoller() // nil: each child's bell is an os.File of its own
	go t.readLoop()
	kinds := []int{kindDeny}
	if opts.Network {
		kinds = append(kinds, kindAllow)
	}
	for _, k := range kinds {
		if err := t.requestFork(k); err != nil {
			t.kill()
			return nil, err
		}
	}
	return t, nil
}

type hello struct {
	T          string   `json:"t"`
	V          int      `json:"v"`
	Pid        int      `json:"pid"`
	Python     string   `json:"python"`
	Executable string   `json:"executable"`
	Paths      []string `json:"paths"`
	Preloaded  []string `json:"preloaded"`
	Msg        string   `json:"msg"`
	CPUs       []int    `json:"cpus"`
	PinErr     string   `json:"pin_error"`
}

// RefusedError is a template's refusal to start, in the runner's words:
// a preload that fails, starts a thread, leaves a descriptor open or maps writable shared memory
// ("preload numpy failed: ..."), or a confinement step it cannot take.
type RefusedError struct {
	Msg string
}

// Error formats the refusal as "template refused to start: <Msg>".
func (e *RefusedError) Error() string { return "template refused to start: " + e.Msg }

func (t *Template) handshake(opts Options) error {
	deadline := time.Now().Add(StartTimeout)
	_ = t.conn.SetDeadline(deadline)
	defer t.conn.SetDeadline(time.Time{})
	r := frame.NewReader(t.conn, 1<<20)
	if err := t.send(map[string]any{"t": "init", "v": Proto, "preload": nonNil(opts.Preload),
		"package_dirs": nonNil(opts.PackageDirs), "tmp": opts.PreloadTmp, "cpus": nonNilInts(opts.CPUs)}); err != nil {
		return t.startErr("send init", err)
	}
	var h hello
	if err := readJSON(r, &h); err != nil {
		return t.startErr("read hello", err)
	}
	if h.T == "fatal" {
		return &RefusedError{Msg: h.Msg}
	}
	if h.T != "hello" || h.V != Proto {
		return fmt.Errorf("template handshake: got %q version %d, want hello version %d", h.T, h.V, Proto)
	}
	// h.Pid is the template's pid in its own namespace (1 in a PID
	// namespace of its own); the host knows it by cmd.Process.Pid.
	t.info.Python, t.info.Executable, t.info.Preloaded = h.Python, h.Executable, nonNil(h.Preloaded)
	t.info.CPUs, t.info.PinErr = h.CPUs, h.PinErr

	policy, err := t.policy(h, opts)
	if err != nil {
		return err
	}
	if testPolicyHook != nil {
		testPolicyHook(policy)
	}
	if err := t.send(policy); err != nil {
		return t.startErr("send policy", err)
	}
	var ready hello
	if err := readJSON(r, &ready); err != nil {
		return t.startErr("read ready", err)
	}
	if ready.T == "fatal" {
		return &RefusedError{Msg: ready.Msg}
	}
	if ready.T != "ready" {
		return fmt.Errorf("template handshake: got %q, want ready", ready.T)
	}
	return nil
}

func (t *Template) startErr(what string, err error) error {
	// Give the process a moment to finish writing its last words.
	select {
	case <-t.waitDone:
	case <-time.After(200 * time.Millisecond):
	}
	if tail := strings.TrimSpace(t.stderr.String()); tail != "" {
		return fmt.Errorf("template %s: %v; its stderr: %s", what, err, tail)
	}
	return fmt.Errorf("template %s: %w", what, err)
}

// policy builds the template's fixed confinement data: the Landlock
// runtime rules and both seccomp variants.
func (t *Template) policy(h hello, opts Options) (map[string]any, error) {
	abi, abiErr := sandbox.ABI()
	ll := map[string]any{"abi": abi}
	if abiErr != nil {
		ll["error"] = abiErr.Error()
		t.info.LandlockErr = abiErr.Error()
	}
	type rule struct {
		path   string
		access uint64
	}
	var rules []rule
	seen := map[string]bool{}
	add := func(p string, access uint64, runtime bool) {
		real, err := filepath.EvalSymlinks(p)
		if err != nil || seen[real] {
			return
		}
		st, err := os.Stat(real)
		if err != nil {
			return
		}
		if !st.IsDir() {
			access = sandbox.ForFile(access)
		}
		seen[real] = true
		rules = append(rules, rule{real, access})
		if runtime {
			t.info.RuntimePaths = append(t.info.RuntimePaths, real)
		}
	}
	// Package dirs first: they are on the template's sys.path too, and the
	// first rule for a path is the one kept; they are read-only.
	for _, p := range opts.PackageDirs {
		add(p, sandbox.ReadAccess(abi), true)
	}
	rt := sandbox.RuntimeAccess(abi)
	for _, p := range h.Paths {
		add(p, rt, true)
	}
	for _, p := range systemPaths {
		add(p, rt, false)
	}
	add("/dev/null", sandbox.DeviceAccess(abi, true), false)
	for _, p := range []string{"/dev/zero", "/dev/urandom", "/dev/random"} {
		add(p, sandbox.DeviceAccess(abi, false), false)
	}
	// A rule beneath another rule that already grants all its rights adds
	// nothing but work for every spare: drop it.
	var kept []rule
	for _, r := range rules {
		covered := false
		for _, o := range rules {
			if o.path != r.path && o.access&r.access == r.access && pathBeneath(r.path, o.path) {
				covered = true
				break
			}
		}
		if !covered {
			kept = append(kept, r)
		}
	}
	rules = kept
	pairs := make([][2]any, 0, len(rules))
	rs := sandbox.Ruleset{ABI: abi, HandledFS: sandbox.HandledFS(abi),
		HandledNet: sandbox.HandledNet(abi, false), Scoped: sandbox.Scoped(abi)}
	for _, r := range rules {
		pairs = append(pairs, [2]any{r.path, r.access})
		rs.Rules = append(rs.Rules, sandbox.Rule{Path: r.path, Access: r.access})
	}
	t.info.Landlock = rs
	ll["handled_fs"] = rs.HandledFS
	ll["handled_net_deny"] = rs.HandledNet
	ll["scoped"] = rs.Scoped

	// The template attaches the template layer once; each spare attaches
	// the job layer of its kind on top (see seccomp.Layers). The template
	// layer does not depend on the policy. Both are allow lists built for
	// this architecture; a build error (an unsupported architecture) fails
	// every job closed.
	progs := map[string]string{}
	var secErr string
	for key, pol := range map[string]seccomp.Policy{"deny": {}, "allow": {AllowNetwork: true}} {
		l, err := seccomp.Build(pol)
		if err != nil {
			secErr = "seccomp: " + err.Error()
			progs = map[string]string{}
			break
		}
		progs[key] = hex.EncodeToString(l.Job.Bytes())
		progs["template"] = hex.EncodeToString(l.Template.Bytes())
	}
	return map[string]any{
		"t":             "policy",
		"landlock":      ll,
		"runtime_rules": pairs,
		"seccomp":       progs,
		"seccomp_error": secErr,
		"cap_last":      capLast(),
		"syscalls": map[string]int{
			"landlock_create_ruleset": unix.SYS_LANDLOCK_CREATE_RULESET,
			"landlock_add_rule":       unix.SYS_LANDLOCK_ADD_RULE,
			"landlock_restrict_self":  unix.SYS_LANDLOCK_RESTRICT_SELF,
			"capset":                  unix.SYS_CAPSET,
			"capget":                  unix.SYS_CAPGET,
			"setns":                   unix.SYS_SETNS,
		},
	}, nil
}

// pathBeneath reports whether path lies inside base (both clean and
// absolute).
func pathBeneath(path, base string) bool {
	if base == "/" {
		return true
	}
	return strings.HasPrefix(path, base+"/")
}

var (
	capLastOnce sync.Once
	capLastVal  = 63
)

// capLast returns the highest capability number the kernel knows.
func capLast() int {
	capLastOnce.Do(func() {
		b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
		if err == nil {
			if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				capLastVal = v
			}
		}
	})
	return capLastVal
}

// Info returns what the template reported at start.
func (t *Template) Info() Info { return t.info }

// Pid returns the template's process id in the caller's PID namespace.
func (t *Template) Pid() int { return t.info.Pid }

// Done is closed when the template has died or been closed.
func (t *Template) Done() <-chan struct{} { return t.done }

// Err says why the template is gone, once Done is closed.
func (t *Template) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.deadErr
}

func (t *Template) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return t.write(b)
}

// connWrite writes b to the template's control socket with raw writes
// (rawmsg.go), or through the connection when it has no raw one.
func (t *Template) connWrite(b []byte) (int, error) {
	rc, err := t.conn.SyscallConn()
	if err != nil {
		return t.conn.Write(b)
	}
	return rawConnWrite(rc, b)
}

// write sends one frame holding payload to the template.
func (t *Template) write(payload []byte) error {
	buf := frame.Append(make([]byte, 0, len(payload)+frame.HeaderSize), payload)
	t.wmu.Lock()
	defer t.wmu.Unlock()
	_, err := t.connWrite(buf)
	return err
}

// Spare kinds: a spare's seccomp filter, installed ahead of time, either
// denies sockets or allows IPv4/IPv6 ones.
const (
	kindDeny  = 0
	kindAllow = 1
)

var kindNames = [2]string{"deny", "allow"}

// unhold forgets c as a held session spare (its replacement is being
// asked for).
func (t *Template) unhold(c *Child) {
	t.mu.Lock()
	if t.held[c.kind] == c {
		t.held[c.kind] = nil
	}
	if t.nsHeld[c.kind] == c {
		t.nsHeld[c.kind] = nil
	}
	t.mu.Unlock()
}

// refill asks for the next spare of a kind once the previous one is done
// with. A failed request means the channel is gone: the template is dead.
func (t *Template) refill(kind int) {
	if isClosed(t.done) {
		return
	}
	if err := t.requestFork(kind); err != nil {
		t.fail(fmt.Errorf("request fork: %w", err))
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// forkFrames are the payloads of the two fork requests. runner.py knows
// them by their exact bytes (its _FORK_KINDS), so that the template decodes
// no JSON between forks.
var forkFrames = [2][]byte{
	kindDeny:  []byte(`{"t":"fork","kind":"deny"}`),
	kindAllow: []byte(`{"t":"fork","kind":"allow"}`),
}

func (t *Template) requestFork(kind int) error {
	return t.requestForkFor(kind, nil)
}

// requestForkFor asks for a spare of kind that goes to w, or to the
// template's spares when w is nil.
func (t *Template) requestForkFor(kind int, w *sessionWait) error {
	payload := forkFrames[kind]
	buf := frame.Append(make([]byte, 0, len(payload)+frame.HeaderSize), payload)
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.mu.Lock()
	t.routes[kind] = append(t.routes[kind], w)
	t.mu.Unlock()
	_, err := t.connWrite(buf)
	return err
}

// Take returns the template's ready spare of the kind the job needs (with
// or without the network), waiting for it if the template is still
// forking. Closing the child asks for its replacement.
func (t *Template) Take(network bool, cancel <-chan struct{}) (*Child, error) {
	kind, err := t.kindFor(network)
	if err != nil {
		return nil, err
	}
	select {
	case c := <-t.spares[kind]:
		return c, nil
	default:
	}
	// A session took the last spare and holds its replacement back until
	// its first step answers: a job does not wait for that. A session
	// that takes the spare this Take waits for sees it waiting.
	t.mu.Lock()
	t.taking[kind]++
	h := t.held[kind]
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.taking[kind]--
		t.mu.Unlock()
	}()
	if h != nil {
		h.RefillNow()
	}
	if takeWaitHook != nil {
		takeWaitHook(kind, false)
	}
	timer := time.NewTimer(t.spareTimeout)
	defer timer.Stop()
	select {
	case c := <-t.spares[kind]:
		return c, nil
	case <-t.done:
		return nil, t.Err()
	case <-cancel:
		return nil, errCanceled
	case <-timer.C:
		// A template that forks nothing for this long is wedged (stopped by
		// someone, or starved): give up on it so that it is replaced.
		err := fmt.Errorf("template forked no spare in %s", t.spareTimeout)
		t.fail(err)
		return nil, err
	}
}

// HasSpare reports whether the template holds a ready spare for a job
// with (or without) the network: a hint, stale as soon as it returns.
func (t *Template) HasSpare(network bool) bool {
	kind := kindDeny
	if network {
		kind = kindAllow
	}
	return len(t.spares[kind]) > 0
}

// sessionWait is a session waiting for a spare forked for it alone.
type sessionWait struct {
	ch        chan *Child // capacity 1: the one spare
	abandoned bool        // guarded by Template.mu: the waiter left
}

// TakeSession returns a process for a session: the template's ready spare
// of the kind the session needs when there is one, or else a spare forked
// for the session alone, which the template's jobs never wait for. The
// replacement of a ready spare taken is asked for by the child's
// RefillNow — the caller's to call once the session's first step has
// answered, so that the fork does not compete with it for the CPU — or
// by the next Take that finds no spare, whichever comes first, or at
// once when a Take already waits for a spare of the kind (the spare
// taken may be the one it waited for): a job never waits for a
// session's step. Either way the process is the
// session's: closing it asks for no (further) replacement. TakeSession
// fails when the template dies, when cancel closes, and when no spare
// comes within the spare timeout (the template is then declared wedged).
func (t *Template) TakeSession(network bool, cancel <-chan struct{}) (*Child, error) {
	kind, err := t.kindFor(network)
	if err != nil {
		return nil, err
	}
	if c := t.holdReady(t.spares[kind], &t.held[kind], &t.taking[kind]); c != nil {
		return c, nil
	}
	if isClosed(t.done) {
		return nil, t.Err()
	}
	w := &sessionWait{ch: make(chan *Child, 1)}
	if err := t.requestForkFor(kind, w); err != nil {
		t.fail(fmt.Errorf("request fork: %w", err))
		return nil, err
	}
	return t.awaitFork(w, cancel)
}

// holdReady takes the ready spare waiting on ch for a session, if there
// is one, and holds its replacement's request (see TakeSession) in *held
// (a field of t, guarded by t.mu): never more than one spare of a kind
// outstanding, so the one held before has its replacement asked for now.
// When jobs wait for a spare of the kind (*taking, a field of t guarded
// by t.mu, above zero), the spare taken may be the one they waited for:
// its replacement is asked for at once, not held. It returns nil when no
// spare is ready.
func (t *Template) holdReady(ch chan *Child, held **Child, taking *int) *Child {
	select {
	case c := <-ch:
		c.HoldRefill()
		t.mu.Lock()
		prev := *held
		jobs := *taking > 0
		if !jobs {
			*held = c
		}
		t.mu.Unlock()
		if prev != nil {
			prev.RefillNow()
		}
		if jobs {
			c.RefillNow()
		}
		return c
	default:
		return nil
	}
}

// awaitFork waits for the child a fork request routed to w, for at most
// the spare timeout (after which the template is declared wedged), until
// the template dies or cancel closes.
func (t *Template) awaitFork(w *sessionWait, cancel <-chan struct{}) (*Child, error) {
	var err error
	timer := time.NewTimer(t.spareTimeout)
	defer timer.Stop()
	select {
	case c := <-w.ch:
		return c, nil
	case <-t.done:
		err = t.Err()
	case <-cancel:
		err = errCanceled
	case <-timer.C:
		err = fmt.Errorf("template forked no spare in %s", t.spareTimeout)
		t.fail(err)
	}
	// The spare may still come, or have come meanwhile: it is closed.
	t.mu.Lock()
	w.abandoned = true
	t.mu.Unlock()
	select {
	case c := <-w.ch:
		c.Close()
	default:
	}
	return nil, err
}

// takeWaitHook, set only by tests, runs in Take and TakeNS once they
// have found no ready spare, just before they wait for one: a test
// makes a session take the spare that comes in that moment.
var takeWaitHook func(kind int, ns bool)

// DefaultSpareTimeout bounds the wait for a template's next spare unless
// Options say otherwise.
const DefaultSpareTimeout = time.Minute

var errCanceled = errors.New("canceled")

type tplMsg struct {
	T      string `json:"t"`
	Kind   string `json:"kind"`
	Pid    int    `json:"pid"`
	Code   *int   `json:"code"`
	Signal int    `json:"signal"`
	Msg    string `json:"msg"`
	// An exit's rusage, from the template's wait4.
	CPUUS    *int64 `json:"cpu_us"`
	MaxRSSKB int64  `json:"maxrss_kb"`
	MinFlt   int64  `json:"minflt"`
}

func (t *Template) readLoop() {
	var (
		buf  []byte
		fds  []int
		rbuf = make([]byte, 64<<10)
		oob  = make([]byte, unix.CmsgSpace(16*4))
	)
	rc, rcErr := t.conn.SyscallConn()
	// deliveries feeds the goroutine that moves spares into their cgroups
	// (deliverLoop), started at the first spare and ended with this loop.
	var deliveries chan spareDelivery
	// nsDeliveries feeds the goroutine that leases a namespace for each
	// ready ns spare (see preEnter), started at the first one and ended
	// with this loop: a goroutine of its own, as the mounter's round trip
	// must not hold up the other spares' cgroups.
	var nsDeliveries chan spareDelivery
	defer func() {
		if deliveries != nil {
			close(deliveries)
		}
		if nsDeliveries != nil {
			close(nsDeliveries)
		}
	}()
	for {
		var n, oobn, flags int
		var err error
		if rcErr == nil {
			n, oobn, flags, err = rawRecvmsg(rc, rbuf, oob) // rawmsg.go
		} else {
			n, oobn, flags, _, err = t.conn.ReadMsgUnix(rbuf, oob)
		}
		n, oobn = max(n, 0), max(oobn, 0) // a failed read may report -1
		if oobn > 0 {
			got, perr := parseRights(oob[:oobn])
			if flags&unix.MSG_CMSG_CLOEXEC == 0 {
				// The kernel reports MSG_CMSG_CLOEXEC back when it set
				// close-on-exec as it installed the descriptors (Go's
				// ReadMsgUnix asks for it on Linux): otherwise it is set
				// here, before anything can fork and exec.
				for _, fd := range got {
					unix.CloseOnExec(fd)
				}
			}
			fds = append(fds, got...)
			if perr != nil {
				closeAll(fds)
				t.fail(perr)
				return
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			closeAll(fds)
			t.fail(errors.New("template sent more descriptors than expected"))
			return
		}
		buf = append(buf, rbuf[:n]...)
		for {
			payload, rest, ok, ferr := frame.Split(buf, 1<<20)
			if ferr != nil {
				closeAll(fds)
				t.fail(ferr)
				return
			}
			if !ok {
				break
			}
			var m tplMsg
			if jerr := json.Unmarshal(payload, &m); jerr != nil {
				closeAll(fds)
				t.fail(fmt.Errorf("bad template frame: %w", jerr))
				return
			}
			buf = append(buf[:0], rest...)
			switch m.T {
			case "spare":
				if len(fds) < 5 {
					closeAll(fds)
					t.fail(errors.New("spare frame without its descriptors"))
					return
				}
				kind := kindDeny
				if m.Kind == kindNames[kindAllow] {
					kind = kindAllow
				}
				c, cerr := newChild(t, m.Pid, kind, fds[:5])
				fds = fds[5:]
				if cerr != nil {
					t.fail(cerr)
					return
				}
				t.mu.Lock()
				t.children[m.Pid] = c
				var route *sessionWait
				routed := len(t.routes[kind]) > 0
				if routed {
					route = t.routes[kind][0]
					t.routes[kind] = t.routes[kind][1:]
				}
				t.mu.Unlock()
				if !routed {
					t.fail(errors.New("template forked a spare nobody asked for"))
					c.Close() // after fail: it asks for no replacement
					return
				}
				if route == nsReadyRoute {
					// The template's ready ns spare: its end asks for
					// the next one (refillChild).
					c.nsSpare = true
				} else if route != nil {
					// A session's own process: its end asks for no
					// replacement.
					c.refillOnce.Do(func() {})
				}
				if route == nsReadyRoute && t.nsLease != nil {
					// The spare is handed out once it has a namespace to
					// enter (a round trip to the pool's mounter, which
					// this loop need not wait for), by one long-lived
					// goroutine: a goroutine per spare grew its stack
					// through the round trip's JSON some three times,
					// copying it each time, once per job with a mount.
					if nsDeliveries == nil {
						nsDeliveries = make(chan spareDelivery, deliveryQueue)
						go t.deliverLoop(nsDeliveries)
					}
					select {
					case nsDeliveries <- spareDelivery{c, kind, route}:
					default: // never expected: one ready ns spare per kind
						go t.deliverTo(c, kind, route)
					}
				} else if t.cg.Backend() != cgroup.None {
					// The spare is handed out once it is in its cgroup;
					// creating and joining it takes a few hundred
					// microseconds that this loop need not wait for.
					if deliveries == nil {
						deliveries = make(chan spareDelivery, deliveryQueue)
						go t.deliverLoop(deliveries)
					}
					select {
					case deliveries <- spareDelivery{c, kind, route}:
					default: // never expected: as many as were asked for wait
						go t.deliverTo(c, kind, route)
					}
				} else if !t.deliverTo(c, kind, route) {
					return
				}
			case "exit":
				t.mu.Lock()
				c := t.children[m.Pid]
				delete(t.children, m.Pid)
				t.mu.Unlock()
				if c != nil {
					st := ExitStatus{Signal: m.Signal}
					if m.Code != nil {
						st.Code = *m.Code
					}
					if m.CPUUS != nil {
						c.exitUsage = &Usage{CPU: time.Duration(*m.CPUUS) * time.Microsecond,
							MaxRSS: m.MaxRSSKB << 10, MinorFaults: m.MinFlt}
					}
					c.exited(st)
				}
			case "spare_error", "fatal":
				t.fail(fmt.Errorf("template: %s", m.Msg))
				return
			default:
				t.fail(fmt.Errorf("unexpected template frame %q", m.T))
				return
			}
		}
		if err != nil {
			t.fail(fmt.Errorf("template channel: %w", err))
			return
		}
	}
}

// spareDelivery is a spare for deliverLoop to deliver (see deliverTo).
type spareDelivery struct {
	c     *Child
	kind  int
	route *sessionWait
}

// deliveryQueue is how many spares may wait for deliverLoop; the template
// forks one per kind at a time, plus the sessions' own processes.
const deliveryQueue = 16

// deliverLoop delivers the spares sent on ch, in order, until ch is
// closed. One long-lived goroutine per template does what a goroutine
// per spare did: the fresh goroutine grew its stack on the way through
// the cgroup's join, copying it, once per job.
func (t *Template) deliverLoop(ch <-chan spareDelivery) {
	for d := range ch {
		t.deliverTo(d.c, d.kind, d.route)
	}
}

// deliverTo makes c the template's spare of its kind (route nil) or
// hands it to the session waiting for it, first moving it into a cgroup
// of its own when the template uses them. It reports false when the
// template failed.
func (t *Template) deliverTo(c *Child, kind int, route *sessionWait) bool {
	if t.cg.Backend() != cgroup.None {
		c.joinCgroup(t.cg, t.memory+t.info.MemoryMargin, t.info.MemoryMargin)
	}
	c.prepareUsage()
	if route == nsReadyRoute && t.nsLease != nil {
		t.preEnter(c)
	}
	t.mu.Lock()
	if t.dead {
		t.mu.Unlock()
		c.Close()
		return false
	}
	if route == nsReadyRoute {
		return t.deliverNS(c, kind) // unlocks t.mu
	}
	if route != nil {
		if route.abandoned {
			t.mu.Unlock()
			c.Close() // its waiter gave up; no replacement is asked for
			return true
		}
		route.ch <- c // buffered for exactly this one
		t.mu.Unlock()
		return true
	}
	select {
	case t.spares[kind] <- c:
		t.mu.Unlock()
		return true
	default:
		t.mu.Unlock()
		// Never more than one spare of a kind is requested.
		c.Close()
		t.fail(errors.New("template forked a spare nobody asked for"))
		return false
	}
}

// anonMemory returns a process's anonymous resident memory in bytes
// (RssAnon in /proc/<pid>/status), or 0 when unknown.
func anonMemory(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		r, err := unix.ParseUnixRights(&m)
		if err != nil {
			return fds, err
		}
		fds = append(fds, r...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// fail marks the template dead, kills it, and wakes everyone waiting on
// it. Its children die with it (with its PID namespace, or by their
// parent-death signal).
func (t *Template) fail(err error) {
	t.mu.Lock()
	if t.dead {
		t.mu.Unlock()
		return
	}
	t.dead = true
	t.deadErr = err
	children := t.children
	t.children = map[int]*Child{}
	t.mu.Unlock()
	t.kill()
	close(t.done)
	// The children are killed (through their pidfds) before the poller
	// is closed: closing it closes the output pipes it reads, and the
	// template's end is seen (its descriptors close) before the kernel
	// sends its children their parent-death signal, so a child still
	// running failed its next write and reported that (BrokenPipeError)
	// as its job's outcome. A child sent SIGKILL runs no more code.
	for _, c := range children {
		c.Kill()
		c.exited(ExitStatus{Signal: int(unix.SIGKILL), TemplateDied: true})
	}
	t.bells.close()
	// A template that dies takes its children with it (its PID
	// namespace, or their parent-death signal): the groups of those it
	// did not have on its books are released too.
	t.mu.Lock()
	rest := t.toRelease
	t.toRelease = nil
	t.mu.Unlock()
	for _, g := range rest {
		g.Release()
	}
	// Drain unclaimed spares.
	for _, ch := range append(t.spares[:], t.nsSpares[:]...) {
		select {
		case c := <-ch:
			c.Close()
		default:
		}
	}
}

func (t *Template) kill() {
	if t.cmd != nil && t.cmd.Process != nil {
		// The template runs in its own process group; its children are in
		// sessions of their own and die with its PID namespace (or by
		// their parent-death signal). SIGKILL reaches a namespace's PID 1
		// from outside it.
		_ = unix.Kill(-t.cmd.Process.Pid, unix.SIGKILL)
		_ = t.cmd.Process.Kill()
	}
	t.conn.Close()
}

// Close stops the template: closing its channel makes it kill its
// children, wait for them and exit; a template that does not within a
// second is killed. Close returns once the template has been reaped.
func (t *Template) Close() error {
	t.conn.CloseWrite()
	select {
	case <-t.waitDone:
	case <-time.After(time.Second):
	}
	t.fail(errors.New("template closed"))
	<-t.waitDone
	return nil
}

func readJSON(r *frame.Reader, v any) error {
	b, err := r.Next()
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func nonNilInts(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// tailBuffer keeps the last max bytes written to it and passes whole lines
// to onLine.
type tailBuffer struct {
	mu     sync.Mutex
	max    int
	buf    []byte
	line   []byte
	onLine func(string)
}

// Write keeps the tail and hands on whole lines.
func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.max:]...)
	}
	if b.onLine != nil {
		b.line = append(b.line, p...)
		for {
			i := strings.IndexByte(string(b.line), '\n')
			if i < 0 {
				break
			}
			b.onLine(string(b.line[:i]))
			b.line = b.line[i+1:]
		}
		if len(b.line) > b.max {
			b.line = b.line[:0]
		}
	}
	return len(p), nil
}

// String returns the kept tail.
func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// kindFor returns the kind of spare a job with or without the network
// needs, or why this template keeps none.
func (t *Template) kindFor(network bool) (int, error) {
	if !network {
		return kindDeny, nil
	}
	if !t.network {
		return 0, errors.New("this template keeps no spares for jobs with the network")
	}
	return kindAllow, nil
}
