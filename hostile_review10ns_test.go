package pynox

// Review 10 (namespaces): an outside review of prepared mount namespaces
// (internal/mountns: the mounter's stock, attach by setns + move_mount)
// and of the templates' ready ns spares (worker.TakeNS), by a job's
// Python code and by a request's author.

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/mountns"
	"github.com/pynox/pynox/internal/testenv"
)

// r10SharedMounter starts a mounter prepared with a base of /usr on a
// shared root tmpfs of inodes inodes (a confined pool's, made smaller),
// with the slot directories of a pool of two workers and two sessions
// (nsSlots), and returns it with the root's descriptor and a host directory and
// file to mount.
func r10SharedMounter(t *testing.T, inodes string) (m *mountns.Mounter, root, dir, file int) {
	t.Helper()
	if why := nsMachineObstacles(); len(why) > 0 {
		t.Skipf("no mount namespaces here: %v", why)
	}
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.FsconfigSetString(fsfd, "nr_inodes", inodes))
	require.NoError(t, unix.FsconfigCreate(fsfd))
	root, err = unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	unix.Close(fsfd)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(root) })
	_, err = mountns.MakeSlots(root, nsSlots(2, 2))
	require.NoError(t, err)
	m, err = mountns.Start(nsPython)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	usr, err := unix.Open("/usr", unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(usr) })
	require.NoError(t, m.Prepare(mountns.Plan{Binds: []mountns.Bind{{Source: usr, Path: "/usr", ReadOnly: true}},
		Links: mountns.HostLinks(), Root: root, RootSet: true, Slots: nsSlots(2, 2)}, 2))
	d := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(d, "f.txt"), []byte("hello"), 0o644))
	dir, err = unix.Open(d, unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(dir) })
	file, err = unix.Open(filepath.Join(d, "f.txt"), unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(file) })
	return m, root, dir, file
}

// Probe: in a pool whose namespaces share one root tmpfs (a confined
// pool), the mountpoints one live namespace holds are names every other
// namespace's attach finds there. A job (a session, say) that holds a
// file mount at /x made every other tenant's directory mount at /x or
// beneath it fail, and one that held a directory at /y failed another's
// file mount at /y, for as long as it lived. Now each live namespace's
// root is a clone of a slot directory of its own (nsSlots).
func TestHostileReview10NSSharedRootTypeConflict(t *testing.T) {
	m, _, dir, file := r10SharedMounter(t, "65536")
	a, err := m.Build(mountns.Plan{Binds: []mountns.Bind{{Source: file, Path: "/x", ReadOnly: true},
		{Source: dir, Path: "/y", ReadOnly: true}}})
	require.NoError(t, err)
	defer a.Close()
	for _, b := range []mountns.Bind{{Source: dir, Path: "/x", ReadOnly: true}, {Source: dir, Path: "/x/sub", ReadOnly: true},
		{Source: file, Path: "/y", ReadOnly: true}} {
		ns, err := m.Build(mountns.Plan{Binds: []mountns.Bind{b}})
		if err != nil {
			t.Logf("%s: %v", b.Path, err)
		}
		require.NoError(t, err, "another namespace's mount at %s fails while a live one holds a mountpoint of the other type there", b.Path)
		ns.Close()
	}
}

// Probe: the shared root's inodes are shared by the live namespaces. A
// few live ones with deep mount paths (one request's plan could name
// about 32000 components) filled it, and every other tenant's namespace
// that needed a new mountpoint failed with ENOSPC while they lived (here
// at the mounter: two of 1020 components in a root of 2048 inodes). Now
// a job's mounts and grants may make at most nsMaxEntries entries (a
// path of 600 components is refused before the mounter, no code run),
// and the shared root has room for every namespace that can be live at
// once with that many: with as many live as a pool of two workers and
// two sessions can have, each at the bound, a new mountpoint is made.
func TestHostileReview10NSEntriesBounded(t *testing.T) {
	testenv.Slow(t)
	p, data, _ := nsPool(t)
	deep := strings.Repeat("/d", 600)
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: deep}}, Code: `print("ran")`})
	requireErrorType(t, res, "SandboxSetupError")
	require.Contains(t, res.Error.Message, "more than 512 directories")
	require.Contains(t, res.Error.Message, "no code ran")
	require.Empty(t, res.Stdout)
	res = run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: strings.Repeat("/d", 100)}},
		Code: `print(open("` + strings.Repeat("/d", 100) + `/f.txt").read())`})
	requireOK(t, res)
	require.Equal(t, "hello\n", res.Stdout)
	require.Equal(t, 3, nsEntries([]string{"/a/b", "/a/c"}, nsMaxEntries))
	require.Equal(t, 65536, nsRootInodes(2, 2))

	m, _, dir, _ := r10SharedMounter(t, strconv.Itoa(nsRootInodes(2, 2)))
	path := func(c string) string { return "/" + c + strings.Repeat("/d", nsMaxEntries-1) }
	var live []*mountns.Namespace
	defer func() {
		for _, ns := range live {
			ns.Close()
		}
	}()
	for _, c := range "abcd" {
		ns, err := m.Build(mountns.Plan{Binds: []mountns.Bind{{Source: dir, Path: path(string(c)), ReadOnly: true}}})
		require.NoError(t, err)
		live = append(live, ns)
	}
	for _, c := range "efgh" {
		ns, err := m.Build(mountns.Plan{Binds: []mountns.Bind{{Source: dir, Path: path(string(c)), ReadOnly: true}}})
		require.NoError(t, err)
		ns.Close()
	}
	ns, err := m.Build(mountns.Plan{Binds: []mountns.Bind{{Source: dir, Path: "/fresh", ReadOnly: true}}})
	require.NoError(t, err, "a new mountpoint while namespaces at the bound live")
	ns.Close()
}

// r10Stock waits for the pool's one mounter (started since before) to
// hold its full stock again and returns its pid.
func r10Stock(t *testing.T, p *Pool, before map[int]bool) int {
	t.Helper()
	pid := newMounter(t, before)
	nsSettle(t, pid, 1+p.nsStock())
	return pid
}

// Probe: a request author's odd mount paths. Paths through one of the
// host's top-level links or onto one, "//" and a trailing "/", unicode,
// a path of 4000 bytes, and 300 mounts in one request: each either runs
// with its mount where it asked for it or is refused with one error and
// no code run; none leaves the mounter short of its stock, and the next
// job's namespace still has the host's links (its /bin, /lib resolve)
// and its own mount only.
func TestHostileReview10NSOddPaths(t *testing.T) {
	testenv.Slow(t)
	before := mounterPids(t)
	p, data, _ := nsPool(t)
	ok := Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `print(open("/data/f.txt").read())`}
	requireOK(t, run(t, p, ok))
	pid := r10Stock(t, p, before)
	var links []string
	for _, l := range []string{"/lib", "/bin", "/lib64", "/sbin"} {
		if fi, err := os.Lstat(l); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			links = append(links, l)
		}
	}
	deep := strings.Repeat("/abcdefgh", 500)
	cases := []struct {
		path, want string // want: the path where the job finds f.txt, "" for a refusal
	}{
		{"//data2//", "/data2"}, {"/data3/", "/data3"}, {"/dätä/ü", "/dätä/ü"}, {"/a/./b/../c", "/a/c"},
		{deep, ""}, // ENAMETOOLONG for the job's own open; the mount may stand
		{p.Config().Dir, p.Config().Dir}, {p.Config().Dir + "/below", p.Config().Dir + "/below"},
	}
	for _, l := range links {
		cases = append(cases, struct{ path, want string }{l, ""}, struct{ path, want string }{l + "/pynox-r10", ""})
	}
	for _, c := range cases {
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: c.path}},
			Code: "import os\nP = " + pyQuote(c.want) + "\nprint(open(P + '/f.txt').read() if P else 'ran')"})
		if res.Error != nil {
			t.Logf("%.40q: %s", c.path, res.Error.Message)
			require.Equal(t, "SandboxSetupError", res.Error.Type, "%q: %s", c.path, res.Error.Message)
			require.Contains(t, res.Error.Message, "no code ran")
			require.Empty(t, res.Stdout)
			continue
		}
		if c.want != "" {
			require.Equal(t, "hello\n", res.Stdout, "%q", c.path)
		}
	}
	var many []MountSpec
	for i := range 300 {
		many = append(many, MountSpec{HostPath: data, Path: "/m/" + strconv.Itoa(i)})
	}
	res := run(t, p, Job{Mounts: many, Code: `print("ran")`})
	require.NotNil(t, res.Error, "300 mounts ran: %s", res.Stdout)
	require.Empty(t, res.Stdout)
	t.Log(res.Error.Message)
	nsSettle(t, pid, 1+p.nsStock())
	for range 2 {
		res := run(t, p, Job{Mounts: ok.Mounts, Code: `import os, subprocess
print(open("/data/f.txt").read(), [q for q in ("/data2", "/data3", "/m", "/a", "/abcdefgh", "f.txt", "below") if os.path.exists(q)], os.getcwd())`})
		requireOK(t, res)
		require.Equal(t, "hello [] "+p.Config().Dir+"\n", res.Stdout)
	}
}

// Probe: the pool's mounter (real root) dies. Every later job with a
// mount fails with a SandboxSetupError that names the mounter, at once
// (none hangs), no code of it runs, and jobs without mounts keep
// running.
func TestHostileReview10NSMounterDies(t *testing.T) {
	testenv.Slow(t)
	before := mounterPids(t)
	p, data, _ := nsPool(t)
	job := Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `print(open("/data/f.txt").read())`}
	requireOK(t, run(t, p, job))
	pid := r10Stock(t, p, before)
	require.NoError(t, unix.Kill(pid, unix.SIGKILL))
	require.True(t, eventually(func() bool { return !processAlive(pid) }))
	for range 3 {
		res := run(t, p, job)
		requireErrorType(t, res, "SandboxSetupError")
		require.Contains(t, res.Error.Message, "mounter")
		require.Contains(t, res.Error.Message, "no code ran")
		require.Empty(t, res.Stdout)
		res = run(t, p, Job{Code: "print(6 * 7)"})
		requireOK(t, res)
		require.Equal(t, "42\n", res.Stdout)
	}
	// A session with a mount: its first step answers with the same
	// error, and runs nothing.
	co, err := p.Checkout(t.Context(), Job{Mounts: job.Mounts})
	if err == nil {
		ev, ferr := co.Feed(t.Context(), Step{Code: `print("ran")`})
		if ferr == nil {
			require.NotNil(t, ev.Result.Error, "a session step ran without a mounter: %s", ev.Result.Stdout)
			t.Logf("%s: %s", ev.Result.Error.Type, ev.Result.Error.Message)
			require.Equal(t, "SandboxSetupError", ev.Result.Error.Type)
			require.Contains(t, ev.Result.Error.Message, "mounter")
			require.Empty(t, ev.Result.Stdout)
		} else {
			require.Contains(t, ferr.Error(), "mounter")
		}
		co.Finish(t.Context())
	} else {
		require.Contains(t, err.Error(), "mounter")
	}
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
}

// Probe: a plain job next to a template's ready ns spare (a process that
// has not attached its seccomp job layer and will regain every
// capability in its job's user namespace) can neither signal it, nor
// read its descriptors, namespaces or memory through /proc, nor get a
// pidfd's descriptor of it, nor ptrace it; the spare then serves the
// next mount job, which holds no capability.
func TestHostileReview10NSSpareUnreachable(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	requireNS(t, p)
	job := nsSpareJob(t, p)
	requireOK(t, run(t, p, job))
	tpl := p.workers[0].live.Load()
	ns := nsSparePid(t, tpl)
	res := run(t, p, Job{Code: `import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
P = ` + strconv.Itoa(ns) + `
out = []
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    except Exception as e:
        return type(e).__name__
out.append(err(lambda: os.kill(P, 0)))  # ESRCH: Landlock's signal scope
out.append(err(lambda: os.kill(P, signal.SIGSTOP)))
out.append(err(lambda: os.listdir("/proc/%d/fd" % P)))
out.append(err(lambda: os.open("/proc/%d/ns/user" % P, os.O_RDONLY)))
out.append(err(lambda: os.open("/proc/%d/mem" % P, os.O_RDONLY)))
out.append(err(lambda: os.readlink("/proc/%d/cwd" % P)))
def pidfd():
    fd = libc.syscall(434, P, 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "pidfd_open")
    r = libc.syscall(438, fd, 3, 0)
    if r < 0:
        raise OSError(ctypes.get_errno(), "pidfd_getfd")
out.append(err(pidfd))
def ptrace():
    if libc.ptrace(16, P, 0, 0) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), "ptrace")
out.append(err(ptrace))
print(out)`})
	requireOK(t, res)
	t.Log(res.Stdout)
	require.NotContains(t, res.Stdout, "'ok'", "a plain job reached the ready ns spare")
	require.True(t, processAlive(ns))
	require.NotEqual(t, "T", procState(ns), "the ns spare was stopped")
	// Entered ahead of its job (hostile_nsfast_test.go): its job layer
	// is on already.
	require.Equal(t, "2", procStatus(t, ns, "Seccomp_filters"))
	res = run(t, p, Job{Mounts: job.Mounts, Code: `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
data = (ctypes.c_uint32 * 6)()
r = libc.capget(hdr, data)
print(open("/data/f.txt").read(), os.readlink("/proc/self"), r, list(data))`})
	requireOK(t, res)
	require.Equal(t, "hello "+strconv.Itoa(ns)+" 0 [0, 0, 0, 0, 0, 0]\n", res.Stdout)
}

// procState returns a process's state letter from /proc/<pid>/stat.
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+3 > len(b) {
		return ""
	}
	return string(b[i+2 : i+3])
}

// Probe: a job cannot keep its namespace after it ends: it holds its
// namespaces' descriptors, leaves a child (in a session of its own,
// sleeping) and tries to pass the descriptors out on every socket it
// holds. After its result no process is in its mount namespace and no
// process of the pool (the pool, its templates, spares, the mounter)
// holds a descriptor of it.
func TestHostileReview10NSNotKept(t *testing.T) {
	testenv.Slow(t)
	p, data, _ := nsPool(t)
	job := Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `import array, os, socket, stat, time
me = os.readlink("/proc/self/ns/mnt")
fds = [os.open("/proc/self/ns/mnt", os.O_RDONLY), os.open("/proc/self/ns/user", os.O_RDONLY)]
sent = 0
for fd in range(3, 64):
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            continue
        s = socket.socket(fileno=os.dup(fd))
        s.sendmsg([b"\n"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))], socket.MSG_DONTWAIT)
        sent += 1
    except OSError:
        pass
try:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(60)
        os._exit(0)
    forked = True
except OSError:
    forked = False
print(me, sent, forked)
time.sleep(1)  # the test reads the namespace's id meanwhile
`}
	// A namespace's inode number is reused once it is gone (the
	// mounter's next prepared namespace may get it): the job's namespace
	// is told apart by its 64-bit id, which is never reused, read while
	// the job lives from the one process of this test whose namespace
	// shows /data.
	type result struct {
		res *Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := p.Run(ctx, job)
		done <- result{res, err}
	}()
	var jobID uint64
	var out result
wait:
	for {
		select {
		case out = <-done:
			break wait
		case <-time.After(10 * time.Millisecond):
		}
		if jobID != 0 {
			continue
		}
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			q, err := strconv.Atoi(e.Name())
			if err != nil || !r10Ours(q) {
				continue
			}
			mi, _ := os.ReadFile("/proc/" + e.Name() + "/mountinfo")
			if strings.Contains(string(mi), " /data ") {
				if id, ok := r10NSID("/proc/" + e.Name() + "/ns/mnt"); ok {
					jobID = id
				}
			}
		}
	}
	require.NoError(t, out.err)
	res := out.res
	t.Log(res.Stdout, res.Stderr)
	require.NotZero(t, jobID, "the job's process (the one whose namespace shows /data) was never seen")
	fields := strings.Fields(res.Stdout)
	require.NotEmpty(t, fields, "stderr: %s", res.Stderr)
	ns := fields[0]
	require.True(t, strings.HasPrefix(ns, "mnt:["), res.Stdout)
	same := func(path string) bool {
		id, ok := r10NSID(path)
		return !ok || id == jobID // unreadable: counted, never excused
	}
	holders := func() []string {
		var out []string
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			q, err := strconv.Atoi(e.Name())
			if err != nil || !r10Ours(q) {
				continue // only this test's processes count
			}
			if l, _ := os.Readlink("/proc/" + e.Name() + "/ns/mnt"); l == ns && same("/proc/"+e.Name()+"/ns/mnt") {
				out = append(out, e.Name()+" in it")
			}
			fds, _ := os.ReadDir("/proc/" + e.Name() + "/fd")
			for _, f := range fds {
				fp := "/proc/" + e.Name() + "/fd/" + f.Name()
				if l, _ := os.Readlink(fp); l == ns && same(fp) {
					cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
					if len(cmd) > 60 {
						cmd = cmd[:60]
					}
					out = append(out, e.Name()+" fd "+f.Name()+" ("+strings.ReplaceAll(string(cmd), "\x00", " ")+", test "+strconv.Itoa(os.Getpid())+")")
				}
			}
		}
		return out
	}
	var left []string
	for range 200 {
		if left = holders(); len(left) == 0 {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	require.Empty(t, left, "the job's mount namespace outlived it")
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
}

// r10NSID returns the 64-bit id of the mount namespace a path opens
// (NS_GET_MNTNS_ID), which, unlike its inode number, is never reused.
func r10NSID(path string) (uint64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var id uint64
	_, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), 0x8008B705, uintptr(unsafe.Pointer(&id)))
	return id, e == 0
}

// r10Ours reports whether pid is this test process or one of its
// descendants (the pool's templates, spares, jobs and mounter).
func r10Ours(pid int) bool {
	for range 64 {
		if pid == os.Getpid() {
			return true
		}
		_, ppid, ok := procStat(pid)
		if !ok || ppid <= 1 {
			return false
		}
		pid = ppid
	}
	return false
}

// Probe: a job (plain, or with a mount namespace of its own) cannot read
// which mounts another job's namespace holds (its host directories and
// paths) through the host's /proc: mountinfo, mounts, mountstats, and
// its root and cwd links, of a live session with a mount.
func TestHostileReview10NSOtherMountinfo(t *testing.T) {
	p, data, _ := nsPool(t)
	co, err := p.Checkout(t.Context(), Job{Mounts: []MountSpec{{HostPath: data, Path: "/secret-r10"}}})
	require.NoError(t, err)
	defer co.Finish(t.Context())
	ev, err := co.Feed(t.Context(), Step{Code: `import os; print(os.readlink("/proc/self"))`})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	pid := strings.TrimSpace(ev.Result.Stdout)
	probe := `import errno, os
P = ` + pid + `
out = []
for f in ("mountinfo", "mounts", "mountstats", "root/secret" + "-r10/f.txt", "cwd", "ns/mnt", "environ", "cmdline", "status"):
    try:
        with open("/proc/%d/%s" % (P, f)) as fh:
            out.append(fh.read()[:2000])
    except OSError as e:
        out.append(errno.errorcode.get(e.errno, str(e.errno)))
for f in ("root", "cwd"):
    try:
        out.append(os.readlink("/proc/%d/%s" % (P, f)))
    except OSError as e:
        out.append(errno.errorcode.get(e.errno, str(e.errno)))
print(out)`
	for _, job := range []Job{{Code: probe}, {Mounts: []MountSpec{{HostPath: data, Path: "/mine"}}, Code: probe}} {
		res := run(t, p, job)
		requireOK(t, res)
		t.Log(res.Stdout)
		require.NotContains(t, res.Stdout, "secret-r10", "a job read another job's mounts")
		require.NotContains(t, res.Stdout, data, "a job read another job's host directory")
		require.NotContains(t, res.Stdout, "hello", "a job read another job's mounted file")
	}
}

// Probe: what a job writes to its overlay stays in its namespace: the
// next job with the same overlay (in a namespace prepared before the
// first one ran) finds the host directory's content only, and the host
// directory is unchanged.
func TestHostileReview10NSOverlayFresh(t *testing.T) {
	p, data, _ := nsPool(t)
	ov := []MountSpec{{HostPath: data, Path: "/work", Mode: Overlay, WriteBytesLimit: 1 << 20}}
	for range 3 {
		res := run(t, p, Job{Mounts: ov, Code: `import os
print(sorted(os.listdir("/work")), open("/work/f.txt").read())
open("/work/f.txt", "w").write("changed")
open("/work/new.txt", "w").write("x" * 4096)
os.mkdir("/work/d")`})
		requireOK(t, res)
		require.Equal(t, "['f.txt', 'fifo'] hello\n", res.Stdout)
	}
	got, err := os.ReadFile(filepath.Join(data, "f.txt"))
	require.NoError(t, err)
	require.Equal(t, "hello", string(got))
	_, err = os.Stat(filepath.Join(data, "new.txt"))
	require.True(t, os.IsNotExist(err))
}

// Probe: jobs queued for a worker hold no mount namespace beyond the
// pool's jobSlots (two per worker). Every queued job's namespace was
// built while it waited, so a client queueing mount jobs made the pool
// hold as many namespaces (a host's namespace count for root, and in a
// confined pool the shared root's inodes, nsMaxEntries each); now a job
// beyond the slots waits for one before its namespace is built. All of
// them still run.
func TestHostileReview10NSQueuedJobsBounded(t *testing.T) {
	testenv.Slow(t)
	p, data, _ := nsPool(t)
	job := Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `import time; time.sleep(0.1); print(open("/data/f.txt").read())`}
	requireOK(t, run(t, p, job))
	held := func() int {
		n := 0
		ents, _ := os.ReadDir("/proc/self/fd")
		for _, e := range ents {
			if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); strings.HasPrefix(l, "mnt:[") {
				n++
			}
		}
		return n
	}
	const jobs = 8
	results := make(chan *Result, jobs)
	for range jobs {
		go func() { results <- run(t, p, job) }()
	}
	most := 0
	for got := 0; got < jobs; {
		select {
		case res := <-results:
			requireOK(t, res)
			require.Equal(t, "hello\n", res.Stdout)
			got++
		case <-time.After(20 * time.Millisecond):
		}
		most = max(most, held())
	}
	t.Logf("the pool held at most %d mount namespaces for %d jobs on %d worker", most, jobs, p.Workers())
	// Besides the jobs' slots, the namespaces attached ahead for the
	// mounts these jobs repeat (nsmount_ahead.go).
	require.LessOrEqual(t, most, p.nsJobSlots()+p.aheadTarget(), "queued jobs hold mount namespaces")
}
