package pynox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Review 16: an outside reviewer's probes of review 15's fixes (nodev
// base binds, private clones), the early namespace plan (nsCheck) and the
// output pipe's read bound. Each probe runs real python3 in the real
// sandbox.

// r16Open is a job that opens each path given and prints "DEV" and the
// outcome of each (ok or the errno's name), then the mountinfo lines of
// the mounts at /m*.
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
    if f[4].startswith("/m"):
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
	for _, mode := range []MountMode{ReadOnly, ReadWrite, Overlay} {
		res := run(t, p, Job{Mounts: []MountSpec{{HostPath: src, Path: "/mnt16", Mode: mode}}, AllowRead: []string{"/proc"},
			Code: strings.Replace(r16Open, "sys.argv[1:]", `["/mnt16/null"]`, 1)})
		requireOK(t, res)
		t.Logf("%s: %s", mode, res.Stdout)
		assert.Contains(t, res.Stdout, "DEV EACCES\n", "a device node in a %s job mount's source opens in the job", mode)
		assert.Regexp(t, `(?m)^MI /mnt16 \S*nodev`, res.Stdout, "a %s job mount is not nodev", mode)
	}
}
