package pynox

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/pynox/pynox/internal/mountns"
	"github.com/pynox/pynox/internal/testenv"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Review 13 (issue 13, leased namespaces): an outside reviewer's probes
// against ready ns spares that enter a namespace leased from the
// mounter's stock before their job, and the mounter's attach of the
// job's mounts into the namespace the spare already sits in. Each probe
// runs real python3 in the real sandbox, in the spare that entered its
// namespace before the job (the job's own pid proves it), and checks the
// pool serves on afterwards.

// r13ProcPool is nsPool's pool, whose jobs may also read /proc (their
// own status and descriptors).
func r13ProcPool(t *testing.T) (p *Pool, data string) {
	t.Helper()
	dir := t.TempDir()
	p = newTestPool(t, Config{Workers: 1, Dir: dir, Limits: Limits{AllowRead: []string{dir, "/proc"}}})
	requireNS(t, p)
	data = filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("hello"), 0o644))
	return p, data
}

// r13Leased waits for p's ready ns spare to sit in its leased namespace
// and returns its pid: the next mount job runs in it.
func r13Leased(t *testing.T, p *Pool, except ...int) int {
	t.Helper()
	return nsSparePid(t, p.workers[0].live.Load(), except...)
}

// r13Self is the line a probe job prints first: its own pid as the host
// sees it (the pool's default PID mode shares the host's).
const r13Self = `import os
print("SELF", os.readlink("/proc/self"), flush=True)
`

// r13RequireIn asserts res ran in the process pid.
func r13RequireIn(t *testing.T, res *Result, pid int) {
	t.Helper()
	require.Contains(t, res.Stdout, "SELF "+strconv.Itoa(pid)+"\n", "the job did not run in the leased spare %d; stdout: %s stderr: %s", pid, res.Stdout, res.Stderr)
}

// r13Line returns the JSON object res printed after prefix.
func r13Line(t *testing.T, res *Result, prefix string) map[string]any {
	t.Helper()
	for _, l := range strings.Split(res.Stdout, "\n") {
		if rest, ok := strings.CutPrefix(l, prefix+" "); ok {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(rest), &m), l)
			return m
		}
	}
	t.Fatalf("no %s line; error %+v\nstdout: %s\nstderr: %s", prefix, res.Error, res.Stdout, res.Stderr)
	return nil
}

// r13StateCode prints what a job holds of its process: capability sets,
// securebits, no_new_privs, seccomp mode and filters, its descriptors,
// its working directory and whether its root is read-only.
const r13StateCode = `import ctypes, json, os
st = {}
for l in open("/proc/self/status"):
    k, _, v = l.partition(":")
    st[k] = v.strip()
libc = ctypes.CDLL(None, use_errno=True)
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink("/proc/self/fd/" + fd)
    except OSError:
        fds[fd] = "?"
print("STATE " + json.dumps({
    "caps": [st[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
    "securebits": libc.prctl(27, 0, 0, 0, 0),
    "nnp": st["NoNewPrivs"], "seccomp": st["Seccomp"], "filters": st.get("Seccomp_filters", "?"),
    "fds": fds, "cwd": os.getcwd(), "rootro": bool(os.statvfs("/").f_flag & os.ST_RDONLY),
    "uidmap": open("/proc/self/uid_map").read().split(),
}), flush=True)
`

// r13Probe runs body (with r13Self before it) as a mount job with mounts
// in p's leased spare, asserting it ran there.
func r13Probe(t *testing.T, p *Pool, mounts []MountSpec, body string) *Result {
	t.Helper()
	spare := r13Leased(t, p)
	res := run(t, p, Job{Mounts: mounts, Code: r13Self + body})
	requireOK(t, res)
	r13RequireIn(t, res, spare)
	return res
}

// Probe: a job in a spare that entered its leased namespace before the
// job holds nothing the spare had there: every capability set is empty
// (the bounding and ambient sets too), no_new_privs is set, seccomp is
// in filter mode with at least as many filters as a job without mounts
// has, it holds no namespace descriptor, no socket or descriptor beyond
// those a job without mounts holds, its root is read-only, and it starts
// in the pool's directory.
func TestHostileReview13LeasedProcessState(t *testing.T) {
	p, data := r13ProcPool(t)
	plain := run(t, p, Job{Code: r13StateCode, AllowRead: []string{"/proc"}})
	requireOK(t, plain)
	base := r13Line(t, plain, "STATE")
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: "print(1)"}))
	for round := range 2 {
		spare := r13Leased(t, p)
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: r13Self + r13StateCode, AllowRead: []string{"/proc"}})
		requireOK(t, res)
		r13RequireIn(t, res, spare)
		got := r13Line(t, res, "STATE")
		t.Logf("round %d: leased job %v; plain job %v", round, got, base)
		require.Equal(t, []any{"0000000000000000", "0000000000000000", "0000000000000000", "0000000000000000", "0000000000000000"}, got["caps"])
		require.Equal(t, "1", got["nnp"])
		require.Equal(t, "2", got["seccomp"])
		nf, err := strconv.Atoi(got["filters"].(string))
		require.NoError(t, err)
		bf, err := strconv.Atoi(base["filters"].(string))
		require.NoError(t, err)
		require.GreaterOrEqual(t, nf, bf, "the leased job runs under fewer seccomp filters than a plain job")
		require.Equal(t, true, got["rootro"])
		require.Equal(t, p.Config().Dir, got["cwd"])
		fds := got["fds"].(map[string]any)
		for fd, l := range fds {
			s := l.(string)
			for _, bad := range []string{"mnt:[", "user:[", "pid:[", "net:[", "cgroup:[", "fscontext", "[fsmount]", "pidfd"} {
				require.NotContains(t, s, bad, "the job holds descriptor %s: %s", fd, s)
			}
		}
		require.LessOrEqual(t, len(fds), len(base["fds"].(map[string]any)), "the leased job holds more descriptors than a plain job: %v vs %v", fds, base["fds"])
	}
	advServes(t, p)
}

// r13MountSyscalls tries, from a job in its leased namespace, every way
// to change the namespace's mounts or leave it, and writes to the
// namespace's root, to a read-only mount, an overlay and a read-write
// mount.
const r13MountSyscalls = `
import ctypes
sc("umount2_data", 166, "/data", 0)
sc("umount2_data_detach", 166, "/data", 2)
sc("umount2_root", 166, "/", 2)
sc("remount_data_rw", 165, 0, "/data", 0, 0x20 | 0x1000, 0)
sc("remount_root_rw", 165, 0, "/", 0, 0x20 | 0x1000, 0)
sc("bind_over_data", 165, "/work", "/data", 0, 0x1000, 0)
sc("mount_tmpfs", 165, "none", "/tmp", "tmpfs", 0, 0)
sc("move_mount", 429, -100, "/work", -100, "/data", 4)
sc("open_tree", 428, -100, "/data", 1 | 0x80000)
sc("mount_setattr", 442, -100, "/data", 0x8000, ctypes.byref((ctypes.c_uint64 * 4)(0, 1, 0, 0)), 32)
sc("fsopen", 430, "tmpfs", 0)
sc("fspick", 433, -100, "/data", 0)
sc("pivot_root", 155, "/data", "/data")
sc("chroot", 161, "/data")
sc("unshare_ns", 272, 0x00020000)
sc("unshare_user", 272, 0x10000000)
try:
    fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
    sc("setns_mnt", 308, fd, 0)
except OSError as e:
    R["setns_mnt"] = _name(e.errno)
try:
    fd = os.open("/proc/1/ns/mnt", os.O_RDONLY)
    sc("setns_host", 308, fd, 0)
except OSError as e:
    R["setns_host"] = _name(e.errno)
attempt("mkdir_root", lambda: os.mkdir("/r13-new"))
attempt("write_ro", lambda: open("/data/r13-new", "w"))
def _w(p):
    with open(p, "w") as f:
        f.write("r13")
attempt("write_overlay", lambda: _w("/work/r13-overlay"))
attempt("write_rw", lambda: _w("/out/r13-rw"))
`

// Probe: a job in a leased namespace cannot change its mounts or leave
// it (umount, remount, bind, tmpfs, move_mount, open_tree,
// mount_setattr, fsopen, fspick, pivot_root, chroot, unshare, setns all
// fail), its root and its read-only mount refuse writes, its overlay
// takes writes that no later job and not the host sees, and its
// read-write mount's writes reach the host.
func TestHostileReview13LeasedMountSyscalls(t *testing.T) {
	p, data, out := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data"}, {HostPath: data, Path: "/work", Mode: Overlay},
		{HostPath: out, Path: "/out", Mode: ReadWrite}}
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	res := r13Probe(t, p, mounts, advCode(r13MountSyscalls))
	denied := []string{"EPERM", "EACCES", "ENOSYS"}
	advExpect(t, advProbes(t, res), map[string][]string{
		"umount2_data": denied, "umount2_data_detach": denied, "umount2_root": denied,
		"remount_data_rw": denied, "remount_root_rw": denied, "bind_over_data": denied, "mount_tmpfs": denied,
		"move_mount": denied, "open_tree": denied, "mount_setattr": denied, "fsopen": denied, "fspick": denied,
		"pivot_root": denied, "chroot": denied, "unshare_ns": denied, "unshare_user": denied,
		"setns_mnt": denied, "setns_host": append([]string{"ENOENT"}, denied...),
		"mkdir_root": {"EROFS", "EACCES"}, "write_ro": {"EROFS", "EACCES"},
		"write_overlay": {"ok"}, "write_rw": {"ok"},
	})
	require.NoFileExists(t, filepath.Join(data, "r13-overlay"), "an overlay write reached the host")
	require.FileExists(t, filepath.Join(out, "r13-rw"), "a read-write mount's write did not reach the host")
	// The next job, in the next leased spare, sees no overlay write and
	// still its read-write one.
	res = r13Probe(t, p, mounts, `print(os.path.exists("/work/r13-overlay"), open("/out/r13-rw").read(), os.path.exists("/r13-new"))`)
	require.Contains(t, res.Stdout, "False r13 False\n")
	advServes(t, p)
}

// Probe: a job mount at the pool's directory (the spare's working
// directory, which the spare entered before the mount was attached over
// it) is where the job starts: its relative paths see the mount, not the
// empty directory it covered, and the mount's mode holds there.
func TestHostileReview13MountOverWorkingDir(t *testing.T) {
	p, data, _ := nsPool(t)
	dir := p.Config().Dir
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: "print(1)"}))
	res := r13Probe(t, p, []MountSpec{{HostPath: data, Path: dir}}, `import errno
print(os.getcwd(), open("f.txt").read(), sorted(os.listdir(".")))
try:
    open("r13-new", "w")
except OSError as e:
    print("write", errno.errorcode[e.errno])`)
	t.Log(res.Stdout)
	require.Contains(t, res.Stdout, dir+" hello ['f.txt', 'fifo']\n")
	require.Contains(t, res.Stdout, "write EROFS\n")
	require.NoFileExists(t, filepath.Join(data, "r13-new"))
	advServes(t, p)
}

// Probe: mounts the attach cannot make, or the pool must refuse (paths
// that collide with the namespace's base: /proc, /dev/null, /, the
// python runtime's directory; a FIFO, a socket or a symlink as the
// source; more mounts than one request carries; a path through a
// top-level link) never run the job's code, each gets exactly one
// answer, and the pool serves mount jobs again after each.
func TestHostileReview13AttachRefusals(t *testing.T) {
	testenv.Slow(t)
	p, data, out := nsPool(t)
	marker := filepath.Join(out, "ran")
	sock := filepath.Join(data, "sock")
	l, err := r13Listen(sock)
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, os.Symlink("/etc", filepath.Join(data, "etclink")))
	py, err := filepath.EvalSymlinks(testPython())
	require.NoError(t, err)
	many := []MountSpec{}
	for i := range 300 {
		many = append(many, MountSpec{HostPath: data, Path: "/many/m" + strconv.Itoa(i)})
	}
	ran := Job{Code: `open("/r13out/ran", "w").write("ran"); print("RAN")`}
	cases := []struct {
		name   string
		mounts []MountSpec
		mayRun bool // the pool may accept it: then the mount must not hide what it names
	}{
		{"proc", []MountSpec{{HostPath: data, Path: "/proc"}}, false},
		{"proc-self", []MountSpec{{HostPath: data, Path: "/proc/self"}}, false},
		{"dev-null", []MountSpec{{HostPath: filepath.Join(data, "f.txt"), Path: "/dev/null"}}, false},
		{"root", []MountSpec{{HostPath: data, Path: "/"}}, false},
		{"python", []MountSpec{{HostPath: data, Path: filepath.Dir(py)}}, false},
		{"fifo-source", []MountSpec{{HostPath: filepath.Join(data, "fifo"), Path: "/fifo"}}, true},
		{"socket-source", []MountSpec{{HostPath: sock, Path: "/sock"}}, true},
		{"symlink-source-outside", []MountSpec{{HostPath: filepath.Join(data, "etclink"), Path: "/etc2"}}, false},
		{"too-many", many, false},
		{"dotdot", []MountSpec{{HostPath: data, Path: "/x/../proc"}}, false},
		{"file-over-workdir", []MountSpec{{HostPath: filepath.Join(data, "f.txt"), Path: p.Config().Dir}}, false},
		{"over-workdir-parent", []MountSpec{{HostPath: data, Path: filepath.Dir(p.Config().Dir)}}, true},
		{"newline-path", []MountSpec{{HostPath: data, Path: "/a\nb"}}, true},
		{"long-component", []MountSpec{{HostPath: data, Path: "/" + strings.Repeat("x", 300)}}, false},
		{"long-path", []MountSpec{{HostPath: data, Path: strings.Repeat("/"+strings.Repeat("y", 250), 20)}}, true},
		{"double-slash", []MountSpec{{HostPath: data, Path: "//dd//e/"}}, true},
		{"dot-component", []MountSpec{{HostPath: data, Path: "/a/./b"}}, true},
		{"beneath-fifo", []MountSpec{{HostPath: filepath.Join(data, "fifo"), Path: "/ff"}, {HostPath: data, Path: "/ff/x"}}, false},
	}
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: "print(1)"}))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r13Leased(t, p)
			j := ran
			j.Mounts = append(append([]MountSpec{}, c.mounts...), MountSpec{HostPath: out, Path: "/r13out", Mode: ReadWrite})
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			res, err := p.Run(ctx, j)
			cancel()
			require.NoError(t, err, "no answer")
			if res.Error == nil && c.mayRun {
				t.Logf("accepted: %s", res.Stdout)
				require.NoError(t, os.Remove(marker))
			} else {
				require.NotNil(t, res.Error, "the job ran: %s", res.Stdout)
				t.Logf("%s: %s", res.Error.Type, res.Error.Message)
				require.Contains(t, []string{"SandboxSetupError", "RequestError"}, res.Error.Type)
				require.NotContains(t, res.Stdout, "RAN")
				require.NoFileExists(t, marker)
			}
			res = run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `import os
print(open("/data/f.txt").read(), os.path.exists("/many"), os.path.exists("/etc2"), os.path.exists("/fifo"))`})
			requireOK(t, res)
			require.Equal(t, "hello False False False\n", res.Stdout)
		})
	}
	advServes(t, p)
}

// Probe: a mount whose host path is swapped between a directory in the
// ceiling and a symbolic link to a secret directory outside it, over and
// over while mount jobs ask for it, never shows the secret: the job runs
// with the directory or is refused.
func TestHostileReview13SymlinkSwap(t *testing.T) {
	p, data, _ := nsPool(t)
	secretDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(secretDir, "f.txt"), []byte("SECRET"), 0o644))
	swap := filepath.Join(p.Config().Dir, "swap")
	real := filepath.Join(p.Config().Dir, "real")
	require.NoError(t, os.Mkdir(real, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(real, "f.txt"), []byte("public"), 0o644))
	link := filepath.Join(p.Config().Dir, "link")
	require.NoError(t, os.Symlink(secretDir, link))
	require.NoError(t, os.Rename(real, swap))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// swap is the directory or the link, never missing.
			_ = unix.Renameat2(unix.AT_FDCWD, swap, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE)
			if i%61 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: "print(1)"}))
	seen := map[string]int{}
	for range 30 {
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: swap, Path: "/s"}}, Code: `print(open("/s/f.txt").read())`})
		require.NotContains(t, res.Stdout, "SECRET")
		require.NotContains(t, res.Stderr, "SECRET")
		if res.Error != nil {
			seen[res.Error.Type+": "+strings.ReplaceAll(res.Error.Message, p.Config().Dir, "DIR")]++
		} else {
			seen[strings.TrimSpace(res.Stdout)]++
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("outcomes: %v", seen)
	// Settled as the directory, the mount serves it.
	if fi, err := os.Lstat(swap); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		require.NoError(t, unix.Renameat2(unix.AT_FDCWD, swap, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE))
	}
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: swap, Path: "/s"}}, Code: `print(open("/s/f.txt").read())`})
	requireOK(t, res)
	require.Equal(t, "public\n", res.Stdout)
	advServes(t, p)
}

// Probe: many mount jobs at once on two workers, each with mounts at
// random paths of its own, never see another job's paths or files, and
// their read-write writes land only in their own host directory.
func TestHostileReview13ConcurrentRandomMounts(t *testing.T) {
	p := newTestPool(t, Config{Workers: 2})
	requireNS(t, p)
	dir := p.Config().Dir
	const jobs = 24
	names := make([]string, jobs)
	for i := range names {
		names[i] = fmt.Sprintf("r13-%d-%x", i, rand.Uint64())
	}
	all, err := json.Marshal(names)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var bad atomic.Int32
	sem := make(chan struct{}, 4)
	for i := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			name := names[i]
			host := filepath.Join(dir, name)
			if err := os.Mkdir(host, 0o755); err != nil {
				bad.Add(1)
				return
			}
			_ = os.WriteFile(filepath.Join(host, "id"), []byte(name), 0o644)
			// Landlock does not mediate stat: another job's mountpoint
			// would show.
			res := run(t, p, Job{Mounts: []MountSpec{{HostPath: host, Path: "/" + name}, {HostPath: host, Path: "/rw-" + name, Mode: ReadWrite},
				{HostPath: host, Path: "/ov-" + name, Mode: Overlay}},
				Code: `import os
N = ` + pyQuote(name) + `
open("/rw-" + N + "/wrote", "w").write(N)
others = [p + o for o in ` + string(all) + ` if o != N for p in ("/", "/rw-", "/ov-") if os.path.lexists(p + o)]
print(open("/" + N + "/id").read(), open("/ov-" + N + "/id").read(), others)`})
			if res.Error != nil || res.Stdout != name+" "+name+" []\n" {
				t.Errorf("job %s: %+v stdout %q stderr %s", name, res.Error, res.Stdout, res.Stderr)
				bad.Add(1)
				return
			}
			if b, err := os.ReadFile(filepath.Join(host, "wrote")); err != nil || string(b) != name {
				t.Errorf("job %s wrote %q (%v)", name, b, err)
				bad.Add(1)
			}
		}()
	}
	wg.Wait()
	require.Zero(t, bad.Load())
	advServes(t, p)
}

// Probe: a session with mounts whose process dies between steps gets a
// replacement in a namespace of its own (not the dead process's, whose
// overlay writes it does not see) with its mounts again.
func TestHostileReview13SessionReplacedProcess(t *testing.T) {
	p, data, _ := nsPool(t)
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: "print(1)"}))
	r13Leased(t, p)
	co, err := p.Checkout(t.Context(), Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}, {HostPath: data, Path: "/work", Mode: Overlay}}})
	require.NoError(t, err)
	defer co.Finish(context.Background())
	step := func(code string) *Result {
		ev, err := co.Feed(t.Context(), Step{Code: code})
		require.NoError(t, err)
		return ev.Result
	}
	res := step(`import os
open("/work/r13", "w").write("first")
print(os.stat("/proc/self/ns/mnt").st_ino, os.readlink("/proc/self"))`)
	requireOK(t, res)
	first := strings.Fields(res.Stdout)
	res = step(`import os, signal; os.kill(os.getpid(), signal.SIGKILL)`)
	require.NotNil(t, res.Error)
	res = step(`import os
print(os.stat("/proc/self/ns/mnt").st_ino, os.readlink("/proc/self"), os.path.exists("/work/r13"), open("/data/f.txt").read())`)
	requireOK(t, res)
	second := strings.Fields(res.Stdout)
	t.Logf("first %v second %v", first, second)
	require.Len(t, second, 4)
	require.NotEqual(t, first[0], second[0], "the replacement runs in the dead process's namespace")
	require.NotEqual(t, first[1], second[1])
	require.Equal(t, []string{"False", "hello"}, second[2:])
	advServes(t, p)
}

// Probe: a burst of mount jobs that empties the mounter's stock over and
// over (its namespaces are rebuilt in the background at a low priority)
// while every worker's CPU is also taken by busy jobs: every mount job is
// answered (served, or refused with a setup error), none hangs, and the
// pool serves after.
func TestHostileReview13StockPressure(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 2})
	requireNS(t, p)
	dir := p.Config().Dir
	data := helloDataDir(t, dir)
	var wg sync.WaitGroup
	var served, refused atomic.Int32
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8 {
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
				job := Job{Mounts: []MountSpec{{HostPath: data, Path: fmt.Sprintf("/p%d-%d", g, i)}},
					Code: fmt.Sprintf(`print(open("/p%d-%d/f.txt").read())`, g, i)}
				if g == 0 && i%2 == 0 {
					job.Code = "import time\nt = time.time()\nwhile time.time() - t < 0.3: pass\n" + job.Code
				}
				res, err := p.Run(ctx, job)
				cancel()
				if err != nil {
					t.Errorf("no answer: %v", err)
					return
				}
				if res.Error != nil {
					require.Equal(t, "SandboxSetupError", res.Error.Type, res.Error.Message)
					refused.Add(1)
					continue
				}
				if res.Stdout != "hello\n" {
					t.Errorf("stdout %q", res.Stdout)
				}
				served.Add(1)
			}
		}()
	}
	wg.Wait()
	t.Logf("served %d, refused %d", served.Load(), refused.Load())
	require.Zero(t, refused.Load(), "mount jobs were refused under pressure")
	advServes(t, p)
}

// helloDataDir makes dir/data holding f.txt ("hello"), the directory
// the namespace probes mount.
func helloDataDir(t *testing.T, dir string) string {
	t.Helper()
	data := filepath.Join(dir, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "f.txt"), []byte("hello"), 0o644))
	return data
}

// selfConfinedPool starts a pool in dir that confines itself
// (ConfineSelf), with workers workers, dir readable and writable and
// read grants on extraRead too; it is closed when the test ends.
func selfConfinedPool(t *testing.T, dir string, workers int, extraRead ...string) *Pool {
	t.Helper()
	p, err := New(Config{Python: testPython(), Dir: dir, ConfineSelf: true, Workers: workers,
		Limits: Limits{AllowRead: append([]string{dir}, extraRead...), AllowWrite: []string{dir}}})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// nsChildProcess runs the calling test again in a child test process
// with env set to a fresh directory, for probes of a pool that confines
// the whole process (or changes its limits), and reports whether this
// is that child, with the directory. In the parent it skips where the
// machine has no mount namespaces and requires the child's test to
// pass (not skip).
func nsChildProcess(t *testing.T, env string) (string, bool) {
	t.Helper()
	if dir := os.Getenv(env); dir != "" {
		return dir, true
	}
	requireSandbox(t)
	if len(nsMachineObstacles()) > 0 {
		t.Skipf("no mount namespaces here: %v", nsMachineObstacles())
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env+"="+t.TempDir())
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "--- PASS: "+t.Name(), "child:\n%s", out)
	require.NotContains(t, string(out), "--- SKIP", "child:\n%s", out)
	return "", false
}

// r13SelfConfineEnv runs TestHostileReview13SelfConfined's probes in a
// child test process (a pool that confines itself confines the whole
// process).
const r13SelfConfineEnv = "PYNOX_R13_SELFCONFINE"

// Probe: in a pool that confines itself (each namespace's root a slot of
// one shared tmpfs), a leased namespace shows no earlier job's mounts or
// mountpoints (in the same slot tmpfs), the job in it holds no
// capability, cannot change its mounts, and concurrent jobs with random
// paths never see each other's.
func TestHostileReview13SelfConfined(t *testing.T) {
	dir, child := nsChildProcess(t, r13SelfConfineEnv)
	if !child {
		return
	}
	p := selfConfinedPool(t, dir, 2, "/proc")
	requireNS(t, p)
	data := helloDataDir(t, dir)
	secret := fmt.Sprintf("/r13-secret-%x", rand.Uint64())
	requireOK(t, run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: secret}, {HostPath: data, Path: "/deep/a/b/c"}}, Code: "print(1)"}))
	for range 3 {
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, AllowRead: []string{"/proc"}, Code: r13StateCode + `
import os
print("SEEN", os.path.lexists(` + pyQuote(secret) + `), os.path.lexists("/deep"))
print("SELF", os.readlink("/proc/self"))`})
		requireOK(t, res)
		st := r13Line(t, res, "STATE")
		require.Equal(t, []any{"0000000000000000", "0000000000000000", "0000000000000000", "0000000000000000", "0000000000000000"}, st["caps"])
		require.Equal(t, true, st["rootro"])
		require.Contains(t, res.Stdout, "SEEN False False\n")
	}
	res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}, {HostPath: data, Path: "/work", Mode: Overlay}},
		Code: advCode(`
sc("umount2_data", 166, "/data", 2)
sc("remount_root_rw", 165, 0, "/", 0, 0x20 | 0x1000, 0)
sc("move_mount", 429, -100, "/work", -100, "/data", 4)
sc("open_tree", 428, -100, "/data", 1 | 0x80000)
sc("unshare_ns", 272, 0x00020000)
attempt("mkdir_root", lambda: os.mkdir("/r13-new"))
`)})
	denied := []string{"EPERM", "EACCES", "ENOSYS"}
	advExpect(t, advProbes(t, res), map[string][]string{"umount2_data": denied, "remount_root_rw": denied, "move_mount": denied,
		"open_tree": denied, "unshare_ns": denied, "mkdir_root": {"EROFS", "EACCES"}})
	names := make([]string, 8)
	for i := range names {
		names[i] = fmt.Sprintf("r13c-%d-%x", i, rand.Uint64())
	}
	all, err := json.Marshal(names)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/" + name}}, Code: `import os
N = ` + pyQuote(name) + `
print(open("/" + N + "/f.txt").read(), [o for o in ` + string(all) + ` if o != N and os.path.lexists("/" + o)])`})
			if res.Error != nil || res.Stdout != "hello []\n" {
				t.Errorf("job %s: %+v %q %s", name, res.Error, res.Stdout, res.Stderr)
			}
		}()
	}
	wg.Wait()
	// Namespaces attached ahead in a pool that confines itself (each at a
	// slot of its own): a job in one holds no capability, its root is
	// read-only; a job asking for other mounts in a spare that entered
	// one (the mounter's reattach) sees none of the part it held, not
	// even the mountpoint's name.
	ahead := []MountSpec{{HostPath: data, Path: secret}}
	took, reattached := false, false
	for attempt := 0; attempt < 10 && !(took && reattached); attempt++ {
		aheadWarm(t, p, ahead)
		before := aheadOf(p)
		res = run(t, p, Job{Mounts: ahead, AllowRead: []string{"/proc"}, Code: r13StateCode})
		requireOK(t, res)
		st := r13Line(t, res, "STATE")
		require.Equal(t, []any{"0000000000000000", "0000000000000000", "0000000000000000", "0000000000000000", "0000000000000000"}, st["caps"])
		require.Equal(t, true, st["rootro"])
		took = took || aheadOf(p).took > before.took
		aheadWarm(t, p, ahead)
		before = aheadOf(p)
		res = run(t, p, Job{Mounts: []MountSpec{{HostPath: data, Path: "/data"}}, Code: `import os
print(os.path.lexists(` + pyQuote(secret) + `), open("/data/f.txt").read())`})
		requireOK(t, res)
		require.Equal(t, "False hello\n", res.Stdout)
		reattached = reattached || aheadOf(p).reattached > before.reattached
	}
	require.True(t, took, "no job ran in a namespace attached ahead")
	require.True(t, reattached, "no job's mounts replaced the part a namespace attached ahead held")
	advServes(t, p)
}

// r13Listen makes a listening unix socket at path (a mount source that
// is a socket).
func r13Listen(path string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Listen(fd, 1); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// r13Reach is what a running job tries against another process (the
// template's next ready ns spare, sitting in its leased namespace whose
// root is still writable, or the pool's mounter, which holds the stock's
// and the leases' descriptors): its root, working directory, descriptors
// and namespaces through /proc, signals, ptrace, pidfd_getfd and
// process_vm_readv.
const r13Reach = `
import time
while not os.path.exists(TARGETS):
    time.sleep(0.01)
time.sleep(0.05)
targets = json.load(open(TARGETS))
for who, pid in targets.items():
    P = "/proc/%d/" % pid
    attempt(who + "_root_list", lambda: os.listdir(P + "root/"))
    attempt(who + "_root_mkdir", lambda: os.mkdir(P + "root/r13-planted"))
    attempt(who + "_root_symlink", lambda: os.symlink("/", P + "root/r13-link"))
    attempt(who + "_cwd_list", lambda: os.listdir(P + "cwd/"))
    attempt(who + "_fd_list", lambda: os.listdir(P + "fd/"))
    attempt(who + "_fd0_open", lambda: os.close(os.open(P + "fd/0", os.O_RDONLY)))
    attempt(who + "_ns_mnt", lambda: os.close(os.open(P + "ns/mnt", os.O_RDONLY)))
    attempt(who + "_ns_user", lambda: os.close(os.open(P + "ns/user", os.O_RDONLY)))
    attempt(who + "_mem", lambda: os.close(os.open(P + "mem", os.O_RDONLY)))
    attempt(who + "_mountinfo", lambda: open(P + "mountinfo").read())
    if who == "spare" and R[who + "_mountinfo"] == "ok":
        print("SPAREMOUNTS", json.dumps(open(P + "mountinfo").read()))
    sc(who + "_kill0", 62, pid, 0)
    sc(who + "_sigstop", 62, pid, 19)
    sc(who + "_ptrace", 101, 16, pid, 0, 0)
    fd = sc(who + "_pidfd_open", 434, pid, 0)
    if fd >= 0:
        sc(who + "_pidfd_getfd", 438, fd, 3, 0)
        os.close(fd)
    else:
        R[who + "_pidfd_getfd"] = "skipped"
    buf = ctypes.create_string_buffer(8)
    iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
    riov = (ctypes.c_void_p * 2)(0x400000, 8)
    sc(who + "_vm_readv", 310, pid, iov, 1, riov, 1, 0)
`

// Probe: a running mount job cannot reach the template's next ready ns
// spare, which sits in its leased namespace (whose root is writable until
// its own job's attach) while the job runs, nor the pool's mounter: no
// listing, planting or symlink in the spare's root through
// /proc/<pid>/root, none of their descriptors or namespaces, no signal
// (the spare is not stopped), no ptrace, pidfd_getfd or
// process_vm_readv; and the next job, in that spare, finds nothing
// planted.
//
// With namespaces attached ahead (nsmount_ahead.go) the other spare sits
// in one holding the mounts the pool's jobs keep asking for, read-only
// root and all: the same probes, but its mountinfo shows those mounts
// (as any running job's does to a job with /proc).
func TestHostileReview13ReachNextSpare(t *testing.T) {
	for _, ahead := range []bool{false, true} {
		t.Run(map[bool]string{false: "leased", true: "ahead"}[ahead], func(t *testing.T) {
			if ahead {
				testenv.Slow(t)
			}
			r13ReachNextSpare(t, ahead)
		})
	}
}

func r13ReachNextSpare(t *testing.T, ahead bool) {
	before := mounterPids(t)
	dir := t.TempDir()
	p := newTestPool(t, Config{Workers: 2, Dir: dir, Limits: Limits{AllowRead: []string{dir, "/proc"}}})
	requireNS(t, p)
	p.ns.ahead.mu.Lock()
	p.ns.ahead.off = !ahead
	p.ns.ahead.mu.Unlock()
	data := helloDataDir(t, dir)
	ctl := filepath.Join(dir, "ctl")
	require.NoError(t, os.Mkdir(ctl, 0o755))
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	// Both templates keep a ready ns spare from their first mount job on
	// (with ahead, the second round's spares enter namespaces attached
	// ahead).
	var wg sync.WaitGroup
	for range map[bool]int{false: 2, true: 4}[ahead] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			requireOK(t, run(t, p, Job{Mounts: mounts, Code: "import time; time.sleep(0.3)"}))
		}()
	}
	wg.Wait()
	if ahead {
		// Until both ready ns spares sit in namespaces attached ahead (a
		// mount change in the process, which other tests' pools make as
		// they start, makes those attached before it stale).
		for round := 0; ; round++ {
			if aheadEntered(p, nsSparePid(t, p.workers[0].live.Load())) && aheadEntered(p, nsSparePid(t, p.workers[1].live.Load())) {
				break
			}
			if round == 10 {
				t.Skip("the ready ns spares never both entered namespaces attached ahead (mount changes on a busy machine); nothing probed")
			}
			for range 2 {
				requireOK(t, run(t, p, Job{Mounts: mounts, Code: "pass"}))
			}
		}
	}
	mounter := newMounter(t, before)
	// A template whose spare the machine's load delays past the spare
	// timeout is replaced, its spares with it: the probe then lost its
	// target and is run again.
	for attempt := 0; ; attempt++ {
		if r13ReachOnce(t, p, mounts, ctl, mounter, ahead) {
			break
		}
		if attempt == 2 {
			t.Skip("the other template's ready ns spare died under the machine's load three times; nothing probed")
		}
	}
	// The next jobs run in the spares and find nothing planted.
	for range 2 {
		res := run(t, p, Job{Mounts: mounts, Code: `import os
print(os.path.lexists("/r13-planted"), os.path.lexists("/r13-link"), open("/data/f.txt").read())`})
		requireOK(t, res)
		require.Equal(t, "False False hello\n", res.Stdout)
	}
	advServes(t, p)
}

// r13ReachOnce runs TestHostileReview13ReachNextSpare's probe job once
// and checks what it got; false when its target died meanwhile.
func r13ReachOnce(t *testing.T, p *Pool, mounts []MountSpec, ctl string, mounter int, ahead bool) bool {
	targets := filepath.Join(ctl, "targets.json")
	self := filepath.Join(ctl, "self")
	_ = os.Remove(targets)
	_ = os.Remove(self)
	spares := map[int]bool{}
	for i := range 2 {
		spares[nsSparePid(t, p.workers[i].live.Load())] = true
	}
	done := make(chan *Result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, _ := p.Run(ctx, Job{Mounts: append([]MountSpec{{HostPath: ctl, Path: "/ctl", Mode: ReadWrite}}, mounts...),
			AllowRead: []string{"/proc"}, Timeout: 20 * time.Second,
			Code: r13Self + "open('/ctl/self', 'w').write(os.readlink('/proc/self'))\n" + advCode("TARGETS = '/ctl/targets.json'\n"+r13Reach)})
		done <- res
	}()
	var attacker int
	var early *Result
	require.True(t, eventually(func() bool {
		select {
		case early = <-done:
			return true
		default:
		}
		b, err := os.ReadFile(self)
		attacker, _ = strconv.Atoi(string(b))
		return err == nil && attacker > 0
	}))
	if early != nil {
		t.Fatalf("the probe job ended early: %+v", early.Error)
	}
	require.True(t, spares[attacker], "the job did not run in a leased spare")
	delete(spares, attacker)
	require.Len(t, spares, 1)
	var next int
	for q := range spares {
		next = q
	}
	b, err := json.Marshal(map[string]int{"spare": next, "mounter": mounter})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(targets+".tmp", b, 0o644))
	require.NoError(t, os.Rename(targets+".tmp", targets))
	res := <-done
	require.NotNil(t, res)
	requireOK(t, res)
	if !processAlive(next) {
		t.Logf("the target spare %d died meanwhile (its template was replaced?); probing again", next)
		return false
	}
	got := advProbes(t, res)
	denied := []string{"EPERM", "EACCES", "ENOSYS", "ESRCH", "PermissionError"}
	want := map[string][]string{}
	for _, who := range []string{"spare", "mounter"} {
		for _, probe := range []string{"root_list", "root_mkdir", "root_symlink", "cwd_list", "fd_list", "fd0_open", "ns_mnt",
			"ns_user", "mem", "mountinfo", "kill0", "sigstop", "ptrace", "pidfd_open", "vm_readv"} {
			want[who+"_"+probe] = denied
		}
		want[who+"_pidfd_getfd"] = []string{"skipped"}
		// With /proc granted, another process's descriptor numbers and
		// mountinfo are readable (the kernel asks no ptrace access for
		// them): what any job with /proc sees of any process, leased or
		// not; the spare's shows no job's mount yet.
		want[who+"_fd_list"] = append([]string{"ok"}, denied...)
		want[who+"_mountinfo"] = append([]string{"ok"}, denied...)
	}
	advExpect(t, got, want)
	if ahead {
		require.True(t, aheadEntered(p, next), "the other spare did not enter a namespace attached ahead")
	} else {
		require.NotContains(t, res.Stdout, " /data ", "the other spare's namespace shows a job's mount before its job")
	}
	require.NotEqual(t, "T", procStatus(t, next, "State")[:1], "the job stopped the other template's ready ns spare")
	return true
}

// r13MounterNS counts the mount namespace descriptors the mounter pid
// holds (its stock's and its leases').
func r13MounterNS(pid int) int {
	n := 0
	ents, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	for _, e := range ents {
		if l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "mnt:[") &&
			e.Name() != strconv.Itoa(mountns.SeedFD) {
			n++
		}
	}
	return n
}

// Probe: leases do not pile up. After mount jobs that succeed, jobs
// whose attach fails, jobs that kill their own process, ready ns spares
// killed in their leased namespace, and templates killed with their
// ready ns spare in its leased namespace, the host holds as many
// descriptors as before and the mounter as many namespaces (its stock,
// its own, and one lease per ready ns spare): no lease outlives the
// spare it was made for.
func TestHostileReview13NoLeaseLeak(t *testing.T) {
	testenv.Slow(t)
	before := mounterPids(t)
	p, data, _ := nsPool(t)
	mounts := []MountSpec{{HostPath: data, Path: "/data"}}
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	mounter := newMounter(t, before)
	r13Leased(t, p)
	steady := func() (int, int) {
		var ns int
		for range 100 {
			ns = r13MounterNS(mounter)
			time.Sleep(20 * time.Millisecond)
			if ns == r13MounterNS(mounter) {
				break
			}
		}
		return advSteadyFDs(t), ns
	}
	// Let the stock refill before counting.
	time.Sleep(300 * time.Millisecond)
	fds0, ns0 := steady()
	for round := range 3 {
		requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
		res := run(t, p, Job{Mounts: append([]MountSpec{{HostPath: filepath.Join(data, "f.txt"), Path: p.Config().Dir}}, mounts...), Code: "print(1)"})
		require.NotNil(t, res.Error)
		require.Equal(t, "SandboxSetupError", res.Error.Type)
		res = run(t, p, Job{Mounts: mounts, Code: "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"})
		require.NotNil(t, res.Error)
		spare := r13Leased(t, p)
		require.NoError(t, unix.Kill(spare, unix.SIGKILL))
		require.True(t, eventually(func() bool { return !processAlive(spare) }))
		res = run(t, p, Job{Mounts: mounts, Code: `print(open("/data/f.txt").read())`})
		requireOK(t, res)
		require.Equal(t, "hello\n", res.Stdout, "round %d", round)
		// A template that dies takes its ready ns spare, and that spare's
		// lease ends with it.
		r13Leased(t, p)
		old := p.workers[0].live.Load().Pid()
		require.NoError(t, unix.Kill(old, unix.SIGKILL))
		awaitNewTemplate(t, p, old)
		requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	}
	r13Leased(t, p)
	// What the pool attached ahead for these jobs' mounts (the sources'
	// copies, the namespaces and their scratch directories) is held on
	// purpose, until 30 s without mount jobs: dropped before counting.
	// The spare that entered one hands it back with its job, and its
	// replacement takes a lease, as before.
	aheadDrop(p)
	requireOK(t, run(t, p, Job{Mounts: mounts, Code: "print(1)"}))
	r13Leased(t, p)
	time.Sleep(300 * time.Millisecond)
	fds1, ns1 := steady()
	t.Logf("host descriptors %d -> %d; mounter namespaces %d -> %d (leased now %d)", fds0, fds1, ns0, ns1, nsLeased(mounter))
	require.Equal(t, fds0, fds1, "the host's descriptors grew")
	require.LessOrEqual(t, ns1, ns0, "the mounter holds more namespaces than before")
	advServes(t, p)
}
