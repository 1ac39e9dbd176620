package worker

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSpareCostProbe is a measurement, not a check: with PYNOX_SPARE_PROBE=N
// it runs N trivial jobs one after another on one template (each with one
// write grant and TMPDIR and HOME set, as a pool job with its scratch
// directory; PYNOX_SPARE_PROBE_GAP=2ms waits that long before each) and
// logs what its spares cost per job: their CPU time and page faults as
// the template reaped them (its cutime, cstime and cminflt in
// /proc/<pid>/stat, which count each child's whole life, its exit
// included), and the template's own. Run it with -v, alternating the
// builds compared; page faults vary less than CPU time on a shared
// machine. PYNOX_SPARE_PROBE_PRELOAD=pandas measures a template with those
// modules preloaded instead.
func TestSpareCostProbe(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("PYNOX_SPARE_PROBE"))
	if n <= 0 {
		t.Skip("a measurement: set PYNOX_SPARE_PROBE to the number of jobs")
	}
	gap, _ := time.ParseDuration(os.Getenv("PYNOX_SPARE_PROBE_GAP"))
	tpl := startTestTemplate(t, false)
	if mods := os.Getenv("PYNOX_SPARE_PROBE_PRELOAD"); mods != "" { // e.g. pandas: a template with preloads instead
		py, err := filepath.EvalSymlinks("/usr/bin/python3")
		require.NoError(t, err)
		tpl, err = Start(Options{Python: py, Dir: t.TempDir(), Preload: strings.Split(mods, ","),
			Env: []string{"PATH=/usr/bin:/bin", "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1"}})
		require.NoError(t, err)
		t.Cleanup(func() { tpl.Close() })
	}
	scratch := t.TempDir()
	run := func() {
		c, err := tpl.Take(false, nil)
		require.NoError(t, err)
		c.HoldRefill()
		fd, err := unix.Open(scratch, unix.O_PATH|unix.O_CLOEXEC|unix.O_DIRECTORY, 0)
		require.NoError(t, err)
		defer unix.Close(fd)
		job := Job{Code: "print(sum(range(100)))", Name: "<code>", Env: map[string]string{"TMPDIR": scratch, "HOME": scratch},
			Grants: []Grant{{Fd: fd, Access: 0x1fff}}, Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 31},
			Timeout: 30 * time.Second, MaxOutput: 1 << 20}
		o := c.Run(&job, nil)
		require.Equal(t, "4950\n", string(o.Stdout), "setup error %q, stderr %s", o.SetupError, o.Stderr)
		c.RefillNow()
	}
	for range 20 { // the template's own first forks are not counted
		run()
	}
	time.Sleep(100 * time.Millisecond)
	before := probeStat(t, tpl.Pid())
	for range n {
		time.Sleep(gap)
		run()
	}
	time.Sleep(200 * time.Millisecond) // the last exits are reaped
	after := probeStat(t, tpl.Pid())
	per := func(i int) float64 { return float64(after[i]-before[i]) / float64(n) }
	const tick = 1000.0 / 100 // ms per USER_HZ tick
	t.Logf("%d jobs, gap %s: spares %.3f ms of CPU and %.1f page faults per job; template %.3f ms and %.1f faults per job",
		n, gap, (per(4)+per(5))*tick, per(1), (per(2)+per(3))*tick, per(0))
	t.Logf("template memory: %s", probeRollup(t, tpl.Pid()))
	if dst := os.Getenv("PYNOX_SPARE_PROBE_SMAPS"); dst != "" { // the template's mappings, for a closer look
		b, err := os.ReadFile("/proc/" + strconv.Itoa(tpl.Pid()) + "/smaps")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(dst, b, 0o644))
	}
}

// probeRollup returns the template's resident, anonymous and private dirty
// memory from /proc/<pid>/smaps_rollup: what each fork copies page tables
// for, and each child's exit tears down.
func probeRollup(t *testing.T, pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	require.NoError(t, err)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, k := range []string{"Rss:", "Anonymous:", "Private_Dirty:"} {
			if strings.HasPrefix(line, k) {
				out = append(out, strings.Join(strings.Fields(line), " "))
			}
		}
	}
	return strings.Join(out, ", ")
}

// probeStat returns minflt, cminflt, utime, stime, cutime and cstime of
// /proc/<pid>/stat.
func probeStat(t *testing.T, pid int) [6]int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	require.NoError(t, err)
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	var v [6]int64
	for i, k := range []int{7, 8, 11, 12, 13, 14} {
		v[i], _ = strconv.ParseInt(f[k], 10, 64)
	}
	return v
}
