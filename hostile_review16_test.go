package pynox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/testenv"
)

// Review 16: an outside reviewer's probes of review 15's fixes (nodev
// base binds, private clones), the early namespace plan (nsCheck) and the
// output pipe's read bound. Each probe runs real python3 in the real
// sandbox.

// r16Open is a job that opens each path given and prints "DEV" and the
// outcome of each (ok or the errno's name), then the mountinfo lines of
// the mount at /mnt16.
const r16Open = `import errno, os, sys
def o(path, flags):
    try:
        os.close(os.open(path, flags))
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print("DEV", " ".join(o(p, os.O_RDONLY) for p in sys.argv[1:] if p))
for l in open("/proc/self/mountinfo"):
    f = l.split()
    if f[4] == "/mnt16":
        print("MI", f[4], f[5])
`

// Probe: a device node the host made in a job mount's source (the null
// device's numbers, harmless) must not open in the job, whatever the
// mount's mode (ro, rw, overlay): a job mount is nodev as the base binds
// are, so a host directory that happens to hold a device node (a copied
// root filesystem, a container image) hands the job no device.
func TestHostileReview16JobMountDevices(t *testing.T) {
	requireSandbox(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a device node")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	require.NoError(t, os.Mkdir(src, 0o755))
	require.NoError(t, unix.Mknod(filepath.Join(src, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	p := newTestPool(t, Config{Workers: 1, Dir: dir, Limits: Limits{AllowRead: []string{"/proc"}}})
	requireNS(t, p)
	// A pool whose prepare failed builds each namespace whole: the same.
	whole := newTestPool(t, Config{Workers: 1, Dir: dir, Limits: Limits{AllowRead: []string{"/proc"}}})
	whole.ns.prepOnce.Do(func() {
		whole.ns.prepBase = whole.nsBaseOf()
		whole.ns.prepErr = fmt.Errorf("review 16: no prepare")
	})
	for _, mode := range []MountMode{ReadOnly, ReadWrite, Overlay, ReadOnly + "-whole", ReadWrite + "-whole", Overlay + "-whole"} {
		p, label := p, mode
		if m, ok := strings.CutSuffix(string(mode), "-whole"); ok {
			p, mode = whole, MountMode(m)
		}
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: src, Path: "/mnt16", Mode: mode}}, AllowRead: []string{"/proc"},
			Code: strings.Replace(r16Open, "sys.argv[1:]", `["/mnt16/null"]`, 1)})
		requireOK(t, res)
		t.Logf("%s: %s", label, res.Stdout)
		assert.Contains(t, res.Stdout, "DEV EACCES\n", "a device node in a %s job mount's source opens in the job", label)
		assert.Regexp(t, `(?m)^MI /mnt16 \S*nodev`, res.Stdout, "a %s job mount is not nodev", label)
	}
}

// r16Flood prints n MiB of numbered lines to stdout and half as much to
// stderr as fast as it can, then "END" and exits at once.
const r16Flood = `import os, sys
n = %d
line = "x" * 1023 + "\n"
for i in range(n * 1024):
    sys.stdout.write(line)
    if i %% 2 == 0:
        sys.stderr.write(line)
sys.stdout.write("END\n")
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
`

// Probe: the output pipe's read bound per event (32 reads, 1 MiB) loses
// no output and hangs no turn: a job that writes 6 MiB to stdout and 3
// MiB to stderr at once and exits has all of it kept (under a 16 MiB
// cap) and streamed, in order; under a 1 MiB cap exactly 1 MiB is kept
// and marked truncated; the next job of the same pool runs.
func TestHostileReview16OutputFlood(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1, Limits: Limits{MaxOutput: 16 << 20}})
	want := strings.Repeat(strings.Repeat("x", 1023)+"\n", 6*1024) + "END\n"
	for _, stream := range []bool{false, true} {
		log := &outputLog{}
		job := Job{Code: fmt.Sprintf(r16Flood, 6), Timeout: 30 * time.Second}
		if stream {
			job.OnOutput = log.fn
		}
		res := run(t, p, job)
		requireOK(t, res)
		require.False(t, res.StdoutTruncated || res.StderrTruncated, "streamed %v: truncated under a 16 MiB cap", stream)
		require.Equal(t, len(want), len(res.Stdout), "streamed %v: stdout's length", stream)
		require.True(t, res.Stdout == want, "streamed %v: stdout differs", stream)
		require.Equal(t, 3*1024*1024, len(res.Stderr), "streamed %v: stderr's length", stream)
		if stream {
			log.returned.Store(true)
			require.True(t, log.text(Stdout) == want, "the streamed stdout differs: %d bytes", len(log.text(Stdout)))
			require.Equal(t, int64(0), log.late.Load())
		}
	}
	res := run(t, p, Job{Code: fmt.Sprintf(r16Flood, 6), MaxOutput: 1 << 20, Timeout: 30 * time.Second})
	requireOK(t, res)
	require.True(t, res.StdoutTruncated && res.StderrTruncated)
	require.Equal(t, 1<<20, len(res.Stdout))
	require.Equal(t, 1<<20, len(res.Stderr))
	res = run(t, p, Job{Code: "print('next')"})
	requireOK(t, res)
	require.Equal(t, "next\n", res.Stdout)
}

// Probe: a session step leaves a thread writing to a copy of its stdout
// as fast as it can (the template's poller watches that pipe after the
// step). Another session of the same template and plain jobs keep being
// answered, each step's and job's output whole, and the flooding
// session's next step answers with only its own output. A poller that
// read the full pipe for as long as it stayed full would hold every
// other child's bell.
func TestHostileReview16LeftoverFlood(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 2})
	ctx := context.Background()
	a, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer a.Finish(ctx)
	ev, err := a.Feed(ctx, Step{Code: `import os, threading
fd = os.dup(1)
blob = b"y" * 65536
def w():
    while True:
        os.write(fd, blob)
threading.Thread(target=w, daemon=True).start()
print("flooding", flush=True)
`, Timeout: 20 * time.Second})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	b, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer b.Finish(ctx)
	for i := 0; i < 20; i++ {
		ev, err := b.Feed(ctx, Step{Code: fmt.Sprintf("print('b%d' * 1000)", i), Timeout: 20 * time.Second})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		require.Equal(t, strings.Repeat(fmt.Sprintf("b%d", i), 1000)+"\n", ev.Result.Stdout)
	}
	for i := 0; i < 5; i++ {
		res := run(t, p, Job{Code: fmt.Sprintf("print('j%d')", i), Timeout: 20 * time.Second})
		requireOK(t, res)
		require.Equal(t, fmt.Sprintf("j%d\n", i), res.Stdout)
	}
	log := &outputLog{}
	ev, err = a.Feed(ctx, Step{Code: "print('a2')", OnOutput: log.fn, Timeout: 20 * time.Second})
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "a2\n", ev.Result.Stdout)
	require.NotContains(t, log.text(Stdout), "y")
}

// Probe: the early namespace plan (nsCheck) is used once; a session's
// replacement process (its first crashed) gets a plan made anew from the
// same request: the same mounts at the same paths with the same modes
// (the read-only mount read-only, nodev; the overlay empty again), no
// other mount, and a third process the same again.
func TestHostileReview16SessionPlanOnReplacement(t *testing.T) {
	requireSandbox(t)
	dir := t.TempDir()
	ro, ov := filepath.Join(dir, "ro"), filepath.Join(dir, "ov")
	for _, d := range []string{ro, ov} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(ro, "f"), []byte("ro-data"), 0o644))
	p := newTestPool(t, Config{Workers: 1, Dir: dir, Limits: Limits{AllowRead: []string{"/proc"}}})
	requireNS(t, p)
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{AllowRead: []string{"/proc"}, Mounts: []MountSpec{
		{HostPath: ro, Path: "/mro"}, {HostPath: ov, Path: "/mov", Mode: Overlay}}})
	require.NoError(t, err)
	defer co.Finish(ctx)
	look := `import os
def w(p):
    try:
        open(p, "a").close()
        return "w"
    except OSError as e:
        return type(e).__name__
mi = sorted(l.split()[4] + ":" + ",".join(o for o in l.split()[5].split(",") if o in ("ro", "rw", "nodev", "nosuid"))
            for l in open("/proc/self/mountinfo") if l.split()[4].startswith("/m"))
print("LOOK", open("/mro/f").read(), sorted(os.listdir("/mov")), w("/mro/x"), w("/mov/x"), mi)
`
	var first string
	for i := 0; i < 3; i++ {
		ev, err := co.Feed(ctx, Step{Code: look, Timeout: 20 * time.Second})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		t.Logf("process %d: %s", i, ev.Result.Stdout)
		require.Equal(t, i > 0, ev.Result.Restarted)
		require.Contains(t, ev.Result.Stdout, "LOOK ro-data [] ")
		if i == 0 {
			first = ev.Result.Stdout
		} else {
			require.Equal(t, first, ev.Result.Stdout, "the replacement's namespace differs from the first's")
		}
		ev, err = co.Feed(ctx, Step{Code: "import os; os._exit(3)", Timeout: 20 * time.Second})
		require.NoError(t, err)
		_ = ev
	}
	require.Contains(t, first, "'/mro:ro,nosuid,nodev'")
}

// Probe (what is, recorded): a device node the host made in a directory a
// job is granted (AllowRead, AllowWrite) at its host path is Landlock's
// to judge, with or without a mount namespace: a job in one (it has a
// mount) sees the same outcome as a job without. The grant is the
// operator's; the namespace neither widens nor narrows it.
func TestHostileReview16GrantDevices(t *testing.T) {
	requireSandbox(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a device node")
	}
	dir := t.TempDir()
	g, m := filepath.Join(dir, "g"), filepath.Join(dir, "m")
	for _, d := range []string{g, m} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	require.NoError(t, unix.Mknod(filepath.Join(g, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	p := newTestPool(t, Config{Workers: 1, Dir: dir, Limits: Limits{AllowRead: []string{"/proc"}}})
	requireNS(t, p)
	code := strings.Replace(r16Open, "sys.argv[1:]", `["`+filepath.Join(g, "null")+`"]`, 1)
	for _, write := range []bool{false, true} {
		job := Job{Code: code, AllowRead: []string{"/proc", g}}
		if write {
			job = Job{Code: code, AllowRead: []string{"/proc"}, AllowWrite: []string{g}}
		}
		plain := run(t, p, job)
		requireOK(t, plain)
		job.Mounts = []MountSpec{{HostPath: m, Path: "/mnt16"}}
		ns := run(t, p, job)
		requireOK(t, ns)
		t.Logf("write %v: plain %q, namespace %q", write, plain.Stdout, ns.Stdout)
		require.Equal(t, strings.SplitN(plain.Stdout, "\n", 2)[0], strings.SplitN(ns.Stdout, "\n", 2)[0])
	}
}
