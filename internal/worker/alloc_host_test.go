package worker

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestProcFilesReadAllocatesNothing: reading a job's counters through
// its open /proc files (twice per job) allocates nothing: the buffer is
// lent from a pool and the fields are found in place.
func TestProcFilesReadAllocatesNothing(t *testing.T) {
	cmd := exec.Command("/bin/sleep", "60")
	require.NoError(t, cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := cmd.Process.Pid
	f, err := openProcFiles(pid)
	require.NoError(t, err)
	defer f.close()
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := f.read(pid, true); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
}

// TestParseMinorFaultsOddNames: the minor faults are the eighth field
// after the command name's last ')', whatever the name holds, as
// bytes.Fields counts them.
func TestParseMinorFaultsOddNames(t *testing.T) {
	for _, comm := range []string{"python3.11", "a b) c (d", ") 1 2 3 4 5 6 7 8", "x"} {
		line := "4242 (" + comm + ") S 1 4242 4242 0 -1 4194560 1234 0 0 0 5 6 0 0 20 0 1 0 100 1000 200\n"
		n, err := parseMinorFaults([]byte(line))
		require.NoError(t, err, comm)
		require.Equal(t, int64(1234), n, comm)
	}
	_, err := parseMinorFaults([]byte("4242 (x) S 1 2\n"))
	require.Error(t, err, "a short line is malformed")
	_, err = parseMinorFaults([]byte("no parenthesis"))
	require.Error(t, err)
	// This process's own line agrees with bytes.Fields.
	b, err := os.ReadFile("/proc/self/stat")
	require.NoError(t, err)
	n, err := parseMinorFaults(b)
	require.NoError(t, err)
	want, err := strconv.ParseInt(string(bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])[7]), 10, 64)
	require.NoError(t, err)
	require.InDelta(t, want, n, 1000) // the process faults between the reads
}

// TestReadFramesAllocatesLittle: reading a child's control socket lends a
// pooled buffer instead of giving each child (one per job) a 32 KiB one.
func TestReadFramesAllocatesLittle(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop a quarter of the buffers put back: the allocations it saves cannot be counted")
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer closeAll(fds[:])
	const n = 50
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	for range n {
		c := &Child{ctlFd: fds[0]}
		_, _, _, err := c.readFrames()
		require.NoError(t, err)
	}
	runtime.ReadMemStats(&ms1)
	perChild := (ms1.TotalAlloc - ms0.TotalAlloc) / n
	require.Less(t, perChild, uint64(4<<10), "bytes allocated per child's first read")
}

// TestKillSendsOnce: once a SIGKILL went through a child's pidfd, Kill
// sends no other (the turn kills the child at its report, and Close kills
// it again). The probe swaps in the pidfd of another process after the
// first Kill: it must survive the second.
func TestKillSendsOnce(t *testing.T) {
	victim := exec.Command("/bin/sleep", "60")
	require.NoError(t, victim.Start())
	other := exec.Command("/bin/sleep", "60")
	require.NoError(t, other.Start())
	defer func() { other.Process.Kill(); other.Wait() }()
	vfd, err := unix.PidfdOpen(victim.Process.Pid, 0)
	require.NoError(t, err)
	ofd, err := unix.PidfdOpen(other.Process.Pid, 0)
	require.NoError(t, err)
	defer unix.Close(ofd)
	c := &Child{pidfd: vfd}
	c.Kill()
	_ = victim.Wait()
	unix.Close(vfd)
	c.pidfd = ofd
	c.Kill()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, unix.PidfdSendSignal(ofd, 0, nil, 0), "the second Kill sent nothing")
	var st unix.Siginfo
	require.NoError(t, unix.Waitid(unix.P_PIDFD, ofd, &st, unix.WEXITED|unix.WNOHANG, nil))
	require.Zero(t, st.Signo, "the other process is still running")
}

// TestReadBellAllocatesLittle: a child's bell reader (one per job)
// borrows its read buffer instead of allocating 4 KiB. The count is
// process-wide, so goroutines other tests left behind (templates closing)
// can allocate while it runs: the least of several rounds is what
// readBell and the probe's own setup cost. A 4 KiB buffer per child would
// put every round above the bound.
func TestReadBellAllocatesLittle(t *testing.T) {
	const n, rounds = 50, 5
	least := uint64(1 << 62)
	for range rounds {
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		for range n {
			var p [2]int
			require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK))
			c := &Child{bell: os.NewFile(uintptr(p[0]), "bell"), rings: make(chan struct{}, 1), bellClosed: make(chan struct{})}
			unix.Write(p[1], []byte{1})
			unix.Close(p[1])
			c.readBell() // one ring, then end of file
			require.Equal(t, int64(1), c.rung.Load())
			c.bell.Close()
		}
		runtime.ReadMemStats(&ms1)
		least = min(least, (ms1.TotalAlloc-ms0.TotalAlloc)/n)
	}
	require.Less(t, least, uint64(2<<10), "bytes allocated per child's bell reader (least of %d rounds)", rounds)
}

// TestJobTurnAllocations: a one-shot job that makes no host call
// allocates no channel for the replies to calls (MaxInFlight slots, the
// largest allocation of a turn). Measured over real jobs: the fewest
// bytes the process allocated while one ran, from the hand-over to the
// outcome (other goroutines, the template's reader taking the next
// spare, may allocate meanwhile).
func TestJobTurnAllocations(t *testing.T) {
	if raceEnabled {
		// CI's race pass measured 8192 bytes as the least of 20 jobs (3856
		// without the detector): the buffers a turn borrows from sync.Pool
		// are dropped at random under it and allocated again.
		t.Skip("the race detector makes sync.Pool drop a quarter of the buffers put back: a turn's allocations cannot be counted")
	}
	tpl := startTestTemplate(t, false)
	const n = 20
	least := uint64(1 << 62)
	for i := range n + 2 {
		c, err := tpl.Take(false, nil)
		require.NoError(t, err)
		job := Job{Code: "pass", Name: "<code>", Timeout: 10 * time.Second, MaxOutput: 1 << 10,
			Limits: Limits{Memory: 256 << 20, Fsize: 1 << 20, CPUSecs: 10}}
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		o := c.Run(&job, nil)
		runtime.ReadMemStats(&ms1)
		require.Empty(t, o.SetupError)
		require.Zero(t, o.Exit)
		c.Close()
		if i >= 2 { // the first jobs warm the pools
			least = min(least, ms1.TotalAlloc-ms0.TotalAlloc)
		}
	}
	t.Logf("at least %d bytes allocated per job", least)
	require.Less(t, least, uint64(6<<10))
}
