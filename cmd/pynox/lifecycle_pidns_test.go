package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// inSyscall reports whether pid is blocked in system call nr
// (/proc/<pid>/syscall).
func inSyscall(pid, nr int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/syscall")
	return err == nil && strings.HasPrefix(string(b), strconv.Itoa(nr)+" ")
}

// waitGone waits (bounded) for every pid to be gone or a zombie, and
// returns those still running.
func waitGone(pids []int) []int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []int
		for _, pid := range pids {
			if alive(pid) {
				left = append(left, pid)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPoolSIGKILLJobClearedPdeathsig is issue 9 item 2: a job and a
// session process that clear their parent-death signal
// (prctl(PR_SET_PDEATHSIG, 0)) must still not outlive a SIGKILLed pool: a
// one-shot job sleeping past its timeout, and a session stopped between
// steps, which nobody would ever resume.
func TestPoolSIGKILLJobClearedPdeathsig(t *testing.T) {
	t.Parallel()
	p := startPool(t, "--workers=1")
	const clear = `import ctypes, os\nctypes.CDLL(None).prctl(1, 0, 0, 0, 0)\n`
	// The session reports its pid as the pool's namespace knows it.
	p.send(t, `{"id": "s", "session": "nb", "code": "`+clear+`print(os.readlink('/proc/self'))"}`)
	r := p.next(t)
	require.Nil(t, r["error"], "%v", r)
	session, err := strconv.Atoi(strings.TrimSpace(r["stdout"].(string)))
	require.NoError(t, err)
	p.send(t, `{"id": "j", "code": "`+clear+`import time\ntime.sleep(10**6)"}`)
	// The job is the pool's grandchild that sleeps: past its prctl.
	var job int
	deadline := time.Now().Add(20 * time.Second)
	for job == 0 && time.Now().Before(deadline) {
		for _, pid := range descendants(p.cmd.Process.Pid) {
			if pid != session && inSyscall(pid, unix.SYS_CLOCK_NANOSLEEP) {
				job = pid
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NotZero(t, job, "the job never slept")
	procs := []int{job, session}
	t.Cleanup(func() {
		// The old code left them running: end them (processes this test
		// started) rather than leave them to the machine.
		for _, pid := range procs {
			if alive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	require.True(t, alive(job))
	require.True(t, alive(session))

	require.NoError(t, p.cmd.Process.Kill())
	_ = p.cmd.Wait()
	require.Empty(t, waitGone(procs), "processes that outlived the SIGKILLed pool (job %d, session %d)", job, session)
}

// zombies returns the processes below pid that are zombies.
func zombies(pid int) []int {
	var out []int
	for _, d := range descendants(pid) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(d) + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		if strings.Fields(s[strings.LastIndexByte(s, ')')+2:])[0] == "Z" {
			out = append(out, d)
		}
	}
	return out
}

// TestPoolAsPID1NoZombies is issue 17 item 7 through `pynox pool`: run as
// PID 1 of a PID namespace (as the init of a container), it inherits every
// orphan in it, so anything a template leaves unreaped becomes its zombie.
// Session open/close cycles, jobs and a SIGKILLed template (whose spares
// are orphaned when templates have no PID namespace) leave none, with and
// without PID namespaces for the templates.
func TestPoolAsPID1NoZombies(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to start the pool in a PID namespace of its own")
	}
	for _, mode := range []string{"auto", "off"} {
		t.Run(mode, func(t *testing.T) {
			conf := filepath.Join(t.TempDir(), "pynox.toml")
			require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf("[pool]\nworkers = 1\npid_namespace = %q\n", mode)), 0o644))
			cmd := exec.Command(pynoxBinary(t), "pool", "--config="+conf)
			cmd.Dir = t.TempDir()
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
			c, stderr := startClientCmd(t, cmd)
			require.Equal(t, mode == "auto", c.Ready().PIDNamespace)
			pool := cmd.Process.Pid
			ctx := context.Background()
			noZombies := func(what string) {
				t.Helper()
				deadline := time.Now().Add(5 * time.Second)
				for len(zombies(pool)) > 0 && time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
				}
				var stats []string
				for _, z := range zombies(pool) {
					b, _ := os.ReadFile("/proc/" + strconv.Itoa(z) + "/stat")
					stats = append(stats, string(b))
					if f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:]); len(f) > 1 {
						pb, _ := os.ReadFile("/proc/" + f[1] + "/stat")
						wc, _ := os.ReadFile("/proc/" + f[1] + "/wchan")
						st, _ := os.ReadFile("/proc/" + f[1] + "/stack")
						stats = append(stats, "parent: "+string(pb)+" wchan "+string(wc)+"\n"+string(st))
					}
				}
				require.Empty(t, stats, "zombies in the pool's namespace after %s (pool %d)", what, pool)
			}
			for i := range 20 {
				s := c.Session(fmt.Sprintf("s%d", i), pynox.Job{})
				r, err := s.Run(ctx, pynox.Step{Code: "x = 1"})
				require.NoError(t, err)
				require.Nil(t, r.Error)
				require.NoError(t, s.Close(ctx))
			}
			noZombies("20 session open/close cycles")
			for i := range 20 {
				require.Equal(t, fmt.Sprintf("%d\n", i), runJob(t, c, pynox.Job{Code: fmt.Sprintf("print(%d)", i)}).Stdout)
			}
			noZombies("20 jobs")
			// The template (the pool's only child) with its spare: the
			// spare dies by its parent-death signal (or with the
			// template's namespace), the pool replaces the template.
			var tpl []int
			for _, d := range descendants(pool) {
				if b, err := os.ReadFile("/proc/" + strconv.Itoa(d) + "/stat"); err == nil {
					s := string(b)
					if strings.Fields(s[strings.LastIndexByte(s, ')')+2:])[1] == strconv.Itoa(pool) {
						tpl = append(tpl, d)
					}
				}
			}
			require.Len(t, tpl, 1)
			require.Eventually(t, func() bool { return len(descendants(tpl[0])) == 1 }, 10*time.Second, 10*time.Millisecond,
				"the template's spare never appeared")
			require.NoError(t, syscall.Kill(tpl[0], syscall.SIGKILL))
			for i := range 3 {
				r := runJob(t, c, pynox.Job{Code: fmt.Sprintf("print(%d)", i)})
				if i == 0 && r.Error != nil && r.Error.Type == "PoolWorkerError" {
					// The job reached the spare before the SIGKILL did:
					// it started, and died with its template (no retry:
					// its code may have run).
					require.Contains(t, r.Error.Message, "template serving the job died")
					r = runJob(t, c, pynox.Job{Code: fmt.Sprintf("print(%d)", i)})
				}
				require.Equal(t, fmt.Sprintf("%d\n", i), r.Stdout, "error %+v, exit %d, stderr %q; pool: %s", r.Error, r.Exit, r.Stderr, stderr.String())
			}
			noZombies("a SIGKILLed template")
			require.NoError(t, c.Close(), "the pool exits 0 at the end of its input; stderr: %s", stderr.String())
		})
	}
}
