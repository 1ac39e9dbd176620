package pynox

// Adversarial probes for warm checkouts (helpers in hostile_test.go): a
// session's process is forked from the same template as the pool's jobs,
// a sibling in its PID namespace, and reaches no more of a job's process
// than another job does — nor a job of a session's.

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// siblingProbe is the body of a probe of the process whose pid (in the
// template's namespace) is in the file named by target.
const siblingProbe = `import signal
a = int(open(target).read())
proc = "/proc/%d/" % a
def read(name, n=4096):
    with open(proc + name, "rb") as f:
        return f.read(n)
attempt("read mem", lambda: read("mem"))
attempt("read environ", lambda: read("environ"))
attempt("read status", lambda: read("status"))
attempt("list fd", lambda: os.listdir(proc + "fd"))
attempt("kill 0", lambda: os.kill(a, 0))
attempt("kill CONT", lambda: os.kill(a, signal.SIGCONT))
attempt("kill KILL", lambda: os.kill(a, signal.SIGKILL))
sc("ptrace attach", 101, 16, a, 0, 0)
sc("pidfd_open", 434, a, 0)
`

var siblingWant = map[string][]string{
	"read mem": {"EACCES"}, "read environ": {"EACCES"}, "read status": {"EACCES"}, "list fd": {"EACCES"},
	"kill 0": {"EPERM", "ESRCH"}, "kill CONT": {"EPERM", "ESRCH"}, "kill KILL": {"EPERM", "ESRCH"},
	"ptrace attach": {"EPERM"}, "pidfd_open": {"EPERM"},
}

func TestHostileWarmSessionSiblings(t *testing.T) {
	t.Parallel()
	// One worker: every job and session process is forked from the same
	// template, in the same PID namespace.
	p := newTestPool(t, Config{Workers: 1})
	shared := filepath.Join(p.cfg.Dir, "shared")
	require.NoError(t, os.Mkdir(shared, 0o755))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A session probes a running job, at its first step and at a later one.
	jobDone := make(chan *Result, 1)
	go func() {
		jobDone <- run(t, p, Job{AllowWrite: []string{"shared"}, Code: `import os, time
open("shared/job.pid", "w").write(os.readlink("/proc/self"))
deadline = time.time() + 60
while not os.path.exists("shared/stop") and time.time() < deadline:
    time.sleep(0.02)
print("job done")
`})
	}()
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(shared, "job.pid"))
		return err == nil && len(b) > 0
	}, 30*time.Second, 10*time.Millisecond)
	probe := "target = " + `"shared/job.pid"` + "\n" + siblingProbe
	co := checkout(t, p, Job{AllowRead: []string{"shared"}})
	for step := 1; step <= 2; step++ {
		ev, err := co.Feed(ctx, Step{Code: advCode(probe)})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		require.Equal(t, step, ev.Result.Step)
		advExpect(t, advProbes(t, ev.Result), siblingWant)
	}
	require.NoError(t, os.WriteFile(filepath.Join(shared, "stop"), nil, 0o644))
	jr := <-jobDone
	requireOK(t, jr)
	require.Equal(t, "job done\n", jr.Stdout, "the job was disturbed")

	// A job probes a session's process, stopped between its steps.
	victim := checkout(t, p, Job{AllowWrite: []string{"shared"}})
	requireOK(t, feed(t, victim, `import os
state = "intact"
open("shared/session.pid", "w").write(os.readlink("/proc/self"))`))
	r := run(t, p, Job{AllowRead: []string{"shared"}, Code: advCode("target = " + `"shared/session.pid"` + "\n" + siblingProbe)})
	requireOK(t, r)
	advExpect(t, advProbes(t, r), siblingWant)
	r = feed(t, victim, "print(state)")
	requireOK(t, r)
	require.Equal(t, "intact\n", r.Stdout)
	require.Equal(t, 2, r.Step, "the session's process lived on")
	advServes(t, p)
}
