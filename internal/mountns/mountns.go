// Package mountns builds private mount namespaces for jobs: a root holding
// read-only and read-write binds of host directories at paths of the
// host's choosing and overlay mounts whose writes go to a sized tmpfs.
//
// A Landlock-confined process, and everything it forks, can never mount,
// so the namespaces are built by a helper, the mounter, that the host
// starts before it confines itself: a trusted, unconfined Python process
// (python3 -I -S, running the embedded builder.py) that dies with its host
// (parent-death signal, and end of file on its socket). Per request it
// assembles the tree as a detached mount tree (nothing is ever created on
// the host), pivot_roots into it in a new mount namespace, and hands back
// a user namespace and a mount namespace that a capability-less root
// process can enter with setns (the owner of a user namespace holds every
// capability in it; the entering process must drop them again).
//
// Prepared namespaces (Mounter.Prepare): given the part of every
// namespace no request changes, the mounter keeps a few namespaces built
// from it ready, in the background, and a request only attaches its own
// mounts to one of them, without a fork: the mounter (real root in the
// initial user namespace, holding every capability over the prepared
// namespace's user namespace) clones the request's sources in its own
// mount namespace, setns-es into the prepared mount namespace, makes the
// mountpoints (never off its root tmpfs), move_mounts the clones there,
// makes the root read-only and setns-es back. Verified on Linux 6.18
// (prepared_test.go): the job sees the base and exactly its own mounts,
// two namespaces never share one, an attach that fails drops the
// namespace. Mounts attached this way are not locked (MNT_LOCKED marks
// only the mounts a namespace copied when it was made for a less
// privileged user namespace), nor is the root's read-only flag: a process
// holding capabilities in the namespace could unmount or remount them.
// The pool's jobs hold none there (they drop them on entry) and their
// seccomp layer denies every mount call (hostile_nsprep_test.go).
//
// Verified on Linux 6.18 (see mountns_test.go): detached assembly
// (fsopen, fsmount, open_tree, move_mount onto a detached tmpfs), overlayfs
// over a host directory with its upper layer on a sized tmpfs (writes past
// the size fail with ENOSPC, the host directory is unchanged), read-only
// binds (EROFS), and entry by a process that has no capabilities, has
// no_new_privs and holds a pending Landlock ruleset whose rules, being per
// inode, match the bind-mounted host directories.
package mountns

import (
	"cmp"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/rawsys"
)

//go:embed builder.py
var builder string

// Bind asks for a host directory or file at Path.
type Bind struct {
	// Source is an O_PATH (or any) descriptor of the host directory or
	// file, opened by the host when it accepted the request; it stays the
	// caller's (the mounter gets a copy).
	Source int
	// Path is where the namespace shows it: absolute, without "." or
	// ".." components.
	Path string
	// ReadOnly makes the bind read-only (writes fail with EROFS).
	ReadOnly bool
	// NoDev makes the bind (and every mount beneath it) nodev: a device
	// node in it does not open (EACCES).
	NoDev bool
}

// Overlay asks for an overlay mount of a host directory at Path: the
// namespace may write there, the host directory never changes, and the
// writes (at most Limit bytes) vanish with the namespace.
type Overlay struct {
	// Lower is a descriptor of the host directory; it stays the caller's.
	Lower int
	// Path is where the namespace shows it.
	Path string
	// Limit is the size of the tmpfs holding the writes, in bytes.
	Limit int64
}

// Plan is what one namespace holds besides the host's top-level symbolic
// links (Links: name to target, as on the host, so that /lib and /bin
// resolve as they do outside).
type Plan struct {
	Binds    []Bind
	Overlays []Overlay
	Links    [][2]string
	// Dirs are empty directories to make in the namespace's root (the
	// host's working directory, say), outside every bind and overlay.
	Dirs []string
	// Root is a descriptor of a detached tmpfs mount; see RootSet.
	Root int
	// RootSet says Root is a descriptor of a detached tmpfs mount (made
	// by the host with fsopen and fsmount) that the namespace's root is
	// a clone of, instead of a fresh tmpfs: a Landlock rule on its root,
	// made before the host confined itself, then matches every path in
	// every such namespace. Mountpoints made in it are shared by them,
	// unless Slots is set.
	RootSet bool
	// Slots, with RootSet, is how many slot directories (MakeSlots) the
	// host made in Root before it confined itself, each with a rule of
	// its Landlock domain: every namespace's root is then a clone of a
	// slot no other live namespace uses (a Landlock rule on Root's root
	// does not reach such a clone: the path walk stops at the namespace's
	// root, the slot), so no two live namespaces share a mountpoint name.
	// The mounter empties a slot, and uses it again, once its namespace
	// is gone; a build that finds no free slot within a few seconds
	// fails. Zero clones Root's root.
	Slots int
}

// MakeSlots makes the n slot directories of a shared root (see
// Plan.Slots) in the detached tmpfs mount root, and returns their paths
// through /proc/self/fd (for Landlock rules).
func MakeSlots(root, n int) ([]string, error) {
	paths := make([]string, 0, n)
	for i := range n {
		name := "s" + strconv.Itoa(i)
		if err := unix.Mkdirat(root, name, 0o755); err != nil {
			return nil, fmt.Errorf("making slot directory %s: %w", name, err)
		}
		paths = append(paths, "/proc/self/fd/"+strconv.Itoa(root)+"/"+name)
	}
	return paths, nil
}

// Namespace is a built namespace: enter User, then Mount, with setns.
// Closing both releases it (the builder process is gone already).
type Namespace struct {
	User  *os.File
	Mount *os.File
}

// Close releases the namespace's descriptors.
func (n *Namespace) Close() error {
	return errors.Join(n.User.Close(), n.Mount.Close())
}

// Mounter is a running builder process.
type Mounter struct {
	mu       sync.Mutex
	cmd      *exec.Cmd
	sock     *os.File
	prepared bool // Prepare succeeded: Build sends the job's part only
	// conn is sock's raw connection: sock is non-blocking and registered
	// with the runtime's poller, so that a goroutine waiting for the
	// builder's reply parks instead of holding its thread in a blocking
	// recvmsg (the scheduler's monitor then polled every few tens of
	// microseconds for as long as the builder took, and handed the
	// goroutine's P to another thread: some fifteen wake-ups per job
	// with a mount). buf and oob are its receive buffers (m.mu).
	conn syscall.RawConn
	buf  []byte
	oob  []byte
}

// Start starts the builder with python (an absolute path to the trusted
// interpreter). It must be called before the calling process confines
// itself with Landlock.
func Start(python string) (*Mounter, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("mounter socketpair: %w", err)
	}
	// Ours alone is non-blocking (the builder reads its end blocking):
	// os.NewFile then registers it with the runtime's poller.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("mounter socketpair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "mounter"), os.NewFile(uintptr(fds[1]), "mounter-child")
	defer theirs.Close()
	conn, err := ours.SyscallConn()
	if err != nil {
		ours.Close()
		return nil, fmt.Errorf("mounter socketpair: %w", err)
	}
	cmd := exec.Command(python, "-I", "-S", "-c", builder)
	cmd.Env = []string{"LC_ALL=C.UTF-8"}
	cmd.Dir = "/"
	cmd.ExtraFiles = []*os.File{theirs}
	// No parent-death signal: it would follow the OS thread that started
	// the builder, which the Go runtime may end at any time. The builder
	// exits at end of file on its socket, which the host's death (or
	// Close) brings; its builder children die with it.
	if err := cmd.Start(); err != nil {
		ours.Close()
		return nil, fmt.Errorf("starting the mounter: %w", err)
	}
	m := &Mounter{cmd: cmd, sock: ours, conn: conn, buf: make([]byte, 8192), oob: make([]byte, unix.CmsgSpace(2*4))}
	if pidfd, err := unix.PidfdOpen(cmd.Process.Pid, unix.PIDFD_NONBLOCK); err == nil {
		go m.watchDeath(pidfd)
	}
	return m, nil
}

// watchDeath waits (parked in the runtime's poller) until the builder
// process has ended, then shuts the host's end of the socket down, so
// that a reply being awaited ends at once with "the builder process is
// gone". The builder's end of the socket closing is not enough: a holder
// of an inline build (see INLINE in builder.py) has a copy of the
// builder's descriptors, the socket among them, for up to INLINE_HOLD
// seconds after the builder is killed. Without a pidfd (an old kernel)
// the host learns of the death when the socket closes.
func (m *Mounter) watchDeath(pidfd int) {
	f := os.NewFile(uintptr(pidfd), "mounter-pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Read(func(fd uintptr) bool {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(p, 0)
		return n > 0 // readable once the process has ended
	})
	_ = m.conn.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
}

// Close stops the builder (end of file on its socket) and waits for it.
func (m *Mounter) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sock.Close()
	_ = m.cmd.Wait()
	return nil
}

type wireBind struct {
	FD   int    `json:"fd"`
	Path string `json:"path"`
	RO   bool   `json:"ro,omitempty"`
	// NoDev is Bind.NoDev.
	NoDev bool `json:"nodev,omitempty"`
}

type wireOverlay struct {
	FD    int    `json:"fd"`
	Path  string `json:"path"`
	Limit int64  `json:"limit"`
}

type wirePlan struct {
	Op       string        `json:"op,omitempty"`    // "prepare", "attach", "lease", "release", or a full build
	N        int           `json:"n,omitempty"`     // prepare: the stock's size
	Lease    int64         `json:"lease,omitempty"` // attach, release: the leased namespace
	Binds    []wireBind    `json:"binds"`
	Overlays []wireOverlay `json:"overlays"`
	Links    [][2]string   `json:"links"`
	Dirs     []string      `json:"dirs"`
	Root     *int          `json:"root,omitempty"`
	Slots    int           `json:"slots,omitempty"`
	Path     string        `json:"path,omitempty"` // scratch: the pool's scratch tmpfs
	NS       *int          `json:"ns,omitempty"`   // reattach: the namespace's mount descriptor
	Prev     []string      `json:"prev,omitempty"` // reattach: the paths attached before
}

// maxPlan and maxFDs are what one request to the builder may carry: its
// JSON plan, and its descriptors (the kernel's SCM_MAX_FD); builder.py's
// MAX_PLAN and MAX_FDS.
const (
	maxPlan = 1 << 16
	maxFDs  = 253
)

// MaxStock is the most prepared namespaces a Mounter keeps (Prepare's n).
const MaxStock = 16

// SeedFD is the descriptor number at which a prepared mounter holds its
// seed namespace for good: a mount namespace of the initial user
// namespace whose one mount is a small empty read-only tmpfs, from which
// each stock namespace's build starts (a copy of it, not of the host's
// mount namespace). No job ever enters it; tools that count the
// namespaces a mounter holds leave this descriptor out.
const SeedFD = 1000

// Prepare gives the mounter the base plan, the part of every namespace
// that no request changes (runtime and system paths, devices, /proc, the
// host's links, Dirs, and Root in a pool whose namespaces share one; no
// Overlays), and has it keep n namespaces built from it ready, each
// rebuilt in the background (a builder process forked then) after one is
// taken. From then on Build takes only a job's part (Binds, Overlays and
// Dirs; no Links, no Root) and attaches it to a prepared namespace
// without a fork: see builder.py. The base plan's descriptors stay the
// caller's (the mounter keeps copies for its lifetime). Prepare may be
// called once; before it, Build builds every namespace whole.
func (m *Mounter) Prepare(base Plan, n int) error {
	if n < 1 || n > MaxStock {
		return fmt.Errorf("mounter: prepare: n is %d; expected 1 to %d", n, MaxStock)
	}
	if len(base.Overlays) > 0 {
		return errors.New("mounter: prepare: a base plan has no overlays")
	}
	w, fds, err := wire(base)
	if err != nil {
		return err
	}
	w.Op, w.N = "prepare", n
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prepared {
		return errors.New("mounter: prepared already")
	}
	got, _, err := m.roundTrip(w, fds)
	if err != nil {
		return err
	}
	if len(got) != 0 {
		for _, fd := range got {
			unix.Close(fd)
		}
		return errors.New("mounter: prepare: unexpected descriptors in the reply")
	}
	m.prepared = true
	return nil
}

// Prepared reports whether Prepare succeeded (Build takes a job's part).
func (m *Mounter) Prepared() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.prepared
}

// Build asks the builder for a namespace holding plan. Requests are
// served one at a time. After Prepare, plan is a job's part only, which
// the mounter attaches to a prepared namespace (one with the base plan's
// mounts): the result is the namespace a whole build of the base and
// the job's part would give, except that the job's mounts are not locked
// to it (see SECURITY.md: the job gives up every capability and its
// seccomp layer denies every mount call).
func (m *Mounter) Build(plan Plan) (*Namespace, error) {
	w, fds, err := wire(plan)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prepared {
		if len(plan.Links) > 0 || plan.RootSet {
			return nil, errors.New("mounter: a prepared mounter's Build takes a job's part only (no Links, no Root)")
		}
		w.Op = "attach"
	}
	got, _, err := m.roundTrip(w, fds)
	if err != nil {
		return nil, err
	}
	if len(got) != 2 {
		for _, fd := range got {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("mounter: the reply holds %d descriptors; expected 2", len(got))
	}
	return &Namespace{User: os.NewFile(uintptr(got[0]), "userns"), Mount: os.NewFile(uintptr(got[1]), "mntns")}, nil
}

// Lease is a prepared namespace leased before any job's mounts are in
// it (Mounter.Lease): a ready spare enters it ahead of its job, and
// Mounter.Attach later attaches the job's mounts to it.
type Lease struct {
	// ID names the lease to the mounter.
	ID int64
	// Namespace is the namespace: its descriptors are the caller's.
	Namespace *Namespace
}

// ErrNoneReady is Lease's error when the mounter's stock is empty (its
// namespaces are being rebuilt): a lease never waits for a build, so
// that no attach (a job waiting) waits behind it.
var ErrNoneReady = errors.New("mounter: lease: no prepared namespace is ready")

// leaseNoneReady is how the mounter says so (builder.py: serve_lease).
const leaseNoneReady = "lease: no prepared namespace is ready"

// Lease takes a prepared namespace out of the mounter's stock (failing
// with ErrNoneReady when the stock is empty) and hands it over before
// any job's mounts are in it: it holds the base plan's mounts only, and
// its root is still writable (the attach makes it read-only). It fails
// before Prepare. The lease ends with Attach (successful or not) or
// Release; the mounter holds at most 256 leases at once.
func (m *Mounter) Lease() (*Lease, error) {
	id, user, mount, err := m.LeaseFDs()
	if err != nil {
		return nil, err
	}
	return &Lease{ID: id, Namespace: &Namespace{User: os.NewFile(uintptr(user), "userns"), Mount: os.NewFile(uintptr(mount), "mntns")}}, nil
}

// LeaseFDs is Lease with the namespace's user and mount namespace
// descriptors as they came (close-on-exec), the caller's to close: a
// caller that only passes them on closes them with a raw close(2), not
// through an os.File (see internal/rawsys).
func (m *Mounter) LeaseFDs() (id int64, user, mount int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.prepared {
		return 0, -1, -1, errors.New("mounter: lease: the mounter is not prepared")
	}
	got, id, err := m.roundTrip(wirePlan{Op: "lease"}, nil)
	if err != nil && strings.Contains(err.Error(), leaseNoneReady) {
		return 0, -1, -1, ErrNoneReady
	}
	if err != nil {
		return 0, -1, -1, err
	}
	if len(got) != 2 || id <= 0 {
		for _, fd := range got {
			unix.Close(fd)
		}
		return 0, -1, -1, fmt.Errorf("mounter: the lease reply holds %d descriptors and lease %d; expected 2 and a lease", len(got), id)
	}
	return id, got[0], got[1], nil
}

// Attach attaches a job's part (Binds, Overlays and Dirs, as Build takes
// after Prepare) to the namespace leased as id, and makes its root
// read-only: when it returns nil, the namespace (and every process in
// it) shows the base plan's mounts and exactly plan's. The lease ends
// either way; when Attach fails, the namespace may hold part of plan,
// and no job may run in it.
func (m *Mounter) Attach(id int64, plan Plan) error {
	if len(plan.Links) > 0 || plan.RootSet {
		return errors.New("mounter: Attach takes a job's part only (no Links, no Root)")
	}
	w, fds, err := wire(plan)
	if err != nil {
		return err
	}
	w.Op, w.Lease = "attach", id
	m.mu.Lock()
	defer m.mu.Unlock()
	got, _, err := m.roundTrip(w, fds)
	for _, fd := range got {
		unix.Close(fd)
	}
	if err == nil && len(got) != 0 {
		err = errors.New("mounter: unexpected descriptors in the attach reply")
	}
	return err
}

// Reattach replaces the job's part attached to a prepared namespace (one
// Build returned; mnt is its mount namespace's descriptor, prev the
// paths of that part's binds and overlays) with plan's, a job's part:
// the mounts at prev are detached and the entries made for them
// removed, then plan's are attached and the root made read-only, as
// Attach does. It is for a namespace a process entered before its job
// (no code of that job ran in it; one the host took back from an earlier
// job held that job's process, gone since) whose job asks for other
// mounts than it holds. When it fails, the namespace may hold part of
// either, and no job may run in it.
func (m *Mounter) Reattach(mnt int, prev []string, plan Plan) error {
	if len(plan.Links) > 0 || plan.RootSet {
		return errors.New("mounter: Reattach takes a job's part only (no Links, no Root)")
	}
	w, fds, err := wire(plan)
	if err != nil {
		return err
	}
	i := len(fds)
	w.Op, w.NS, w.Prev = "reattach", &i, prev
	fds = append(fds, mnt)
	m.mu.Lock()
	defer m.mu.Unlock()
	got, _, err := m.roundTrip(w, fds)
	for _, fd := range got {
		unix.Close(fd)
	}
	if err == nil && len(got) != 0 {
		err = errors.New("mounter: unexpected descriptors in the reattach reply")
	}
	return err
}

// Scratch hands the mounter the pool's own scratch tmpfs (path, and root
// a descriptor of its root), which it unmounts when the host goes (end
// of file on its socket): a pool that confines itself cannot. The
// mounter takes it only as its first request.
func (m *Mounter) Scratch(path string, root int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	got, _, err := m.roundTrip(wirePlan{Op: "scratch", Path: path}, []int{root})
	for _, fd := range got {
		unix.Close(fd)
	}
	return err
}

// Release ends the lease id without an attach (its spare never got a
// job): the mounter drops its copies of the namespace's descriptors.
func (m *Mounter) Release(id int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	got, _, err := m.roundTrip(wirePlan{Op: "release", Lease: id}, nil)
	for _, fd := range got {
		unix.Close(fd)
	}
	return err
}

// wire encodes plan and lists the descriptors it names.
func wire(plan Plan) (wirePlan, []int, error) {
	var w wirePlan
	var fds []int
	for _, b := range plan.Binds {
		w.Binds = append(w.Binds, wireBind{FD: len(fds), Path: b.Path, RO: b.ReadOnly, NoDev: b.NoDev})
		fds = append(fds, b.Source)
	}
	for _, o := range plan.Overlays {
		if o.Limit <= 0 {
			return w, nil, fmt.Errorf("overlay %s: limit must be positive", o.Path)
		}
		w.Overlays = append(w.Overlays, wireOverlay{FD: len(fds), Path: o.Path, Limit: o.Limit})
		fds = append(fds, o.Lower)
	}
	w.Links = plan.Links
	w.Dirs = plan.Dirs
	if plan.RootSet {
		i := len(fds)
		w.Root = &i
		w.Slots = plan.Slots
		fds = append(fds, plan.Root)
	}
	return w, fds, nil
}

// roundTrip sends one request and returns the descriptors of its reply
// (the caller's) and its lease number (zero when it has none), or the
// mounter's error. m.mu is held.
func (m *Mounter) roundTrip(w wirePlan, fds []int) ([]int, int64, error) {
	var msg []byte
	var err error
	if w.Op == "lease" && len(fds) == 0 {
		msg = leaseRequest // the same bytes json.Marshal makes of w
	} else if msg, err = json.Marshal(w); err != nil {
		return nil, 0, err
	}
	if len(msg) > maxPlan || len(fds) > maxFDs {
		return nil, 0, fmt.Errorf("mounter: the plan is %d bytes with %d descriptors; at most %d bytes and %d descriptors fit one request",
			len(msg), len(fds), maxPlan, maxFDs)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	var ioErr error
	// (Raw calls on the non-blocking socket: see internal/rawsys.)
	err = m.conn.Write(func(fd uintptr) bool {
		_, ioErr = rawsys.Sendmsg(int(fd), msg, oob, unix.MSG_DONTWAIT)
		return ioErr != unix.EAGAIN
	})
	if err = cmp.Or(err, ioErr); err != nil {
		return nil, 0, fmt.Errorf("mounter: %w", err)
	}
	buf, rb := m.buf, m.oob
	var n, oobn int
	err = m.conn.Read(func(fd uintptr) bool {
		n, oobn, _, ioErr = rawsys.Recvmsg(int(fd), buf, rb, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
		return ioErr != unix.EAGAIN
	})
	if err = cmp.Or(err, ioErr); err != nil {
		return nil, 0, fmt.Errorf("mounter: %w", err)
	}
	if n == 0 {
		return nil, 0, errors.New("mounter: the builder process is gone")
	}
	var got []int
	if oobn > 0 {
		cms, err := unix.ParseSocketControlMessage(rb[:oobn])
		if err == nil {
			for _, c := range cms {
				if r, err := unix.ParseUnixRights(&c); err == nil {
					got = append(got, r...)
				}
			}
		}
	}
	if lease, ok := okReply(buf[:n]); ok {
		return got, lease, nil
	}
	var reply struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
		Lease int64  `json:"lease"`
	}
	if err := json.Unmarshal(buf[:n], &reply); err != nil || !reply.OK {
		for _, fd := range got {
			unix.Close(fd)
		}
		if reply.Error != "" {
			return nil, 0, fmt.Errorf("mounter: %s", reply.Error)
		}
		return nil, 0, fmt.Errorf("mounter: bad reply %q", buf[:n])
	}
	return got, reply.Lease, nil
}

// leaseRequest is a lease request as json.Marshal encodes it, made once.
var leaseRequest = func() []byte {
	b, err := json.Marshal(wirePlan{Op: "lease"})
	if err != nil {
		panic(err)
	}
	return b
}()

// okReply reads the builder's two common replies as Python's json.dumps
// writes them, {"ok": true} and {"ok": true, "lease": N}, without the
// json package (whose decoder grew the stack of the goroutine waiting
// for a lease, copying it, about once per job with a mount); ok is false
// for any other reply, which roundTrip then decodes with the json
// package.
func okReply(b []byte) (lease int64, ok bool) {
	const plain, leased = `{"ok": true}`, `{"ok": true, "lease": `
	if string(b) == plain {
		return 0, true
	}
	if len(b) <= len(leased)+1 || string(b[:len(leased)]) != leased || b[len(b)-1] != '}' {
		return 0, false
	}
	digits := b[len(leased) : len(b)-1]
	if len(digits) > 18 || digits[0] == '0' {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		lease = lease*10 + int64(c-'0')
	}
	return lease, true
}

// HostLinks lists the symbolic links at the top of the host's root
// (/lib -> usr/lib on a merged-/usr system), to recreate in a namespace.
func HostLinks() [][2]string {
	ents, err := os.ReadDir("/")
	if err != nil {
		return nil
	}
	var links [][2]string
	for _, e := range ents {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		if t, err := os.Readlink("/" + e.Name()); err == nil {
			links = append(links, [2]string{e.Name(), t})
		}
	}
	return links
}
