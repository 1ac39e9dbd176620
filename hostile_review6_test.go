package pynox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestHostileReview6LateWriter probes the window between a job's final
// report and the pool's kill (the runner now waits, alive, for the kill):
// a second thread keeps writing to a file under the write ceiling after
// the job's main code returned. Once Run has returned, the writes must
// stop (the process is killed), a following job must see a file that no
// longer changes, and the pool must keep serving.
func TestHostileReview6LateWriter(t *testing.T) {
	testenv.Slow(t)
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o777))
	p := newTestPool(t, Config{Dir: dir, Workers: 1})
	f := filepath.Join(dir, "late.txt")
	code := `
import threading, os
def w():
    n = 0
    while True:
        n += 1
        try:
            with open(` + "'" + f + "'" + `, "w") as fh:
                fh.write(str(n))
        except OSError as e:
            print('ERR', e, flush=True)
            break
t = threading.Thread(target=w, daemon=True)
t.start()
import time
time.sleep(0.05)
`
	for i := 0; i < 3; i++ {
		res := run(t, p, Job{Code: code, AllowWrite: []string{dir}})
		requireOK(t, res)
		a, err := os.ReadFile(f)
		require.NoError(t, err)
		time.Sleep(300 * time.Millisecond)
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.Equal(t, string(a), string(b), "a finished job's thread still writes after Run returned")
		// A following job sees the same, settled, file.
		res = run(t, p, Job{AllowWrite: []string{dir}, Code: "import time\na=open(" + "'" + f + "'" + ").read()\ntime.sleep(0.2)\nb=open(" + "'" + f + "'" + ").read()\nprint(a==b, a, b)"})
		requireOK(t, res)
		require.True(t, strings.HasPrefix(res.Stdout, "True"), "next job saw late writes: %s", res.Stdout)
	}
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
}

// TestHostileReview6TemplateDiesUnderJob kills a job's template while the
// job (and a process it forked) runs: the child's cgroup is now released
// on the template's death without its reap being reported. Once Run has
// returned, neither the job nor its descendant may still run (else they
// would outlive the cgroup that bounds them), and the pool keeps serving.
func TestHostileReview6TemplateDiesUnderJob(t *testing.T) {
	dir := t.TempDir()
	p := newTestPool(t, Config{Dir: dir, Workers: 1})
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
	pids := p.templatePIDs()
	require.Len(t, pids, 1)
	f := filepath.Join(dir, "pids")
	code := `
import os, time
n = 0
while True:
    n += 1
    open('` + f + `', 'w').write(str(n))
    time.sleep(0.001)
`
	done := make(chan *Result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, _ := p.Run(ctx, Job{Code: code, AllowWrite: []string{dir}})
		done <- res
	}()
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(f)
		return err == nil && len(b) > 0
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, syscall.Kill(pids[0], syscall.SIGKILL))
	select {
	case res := <-done:
		require.NotNil(t, res)
		require.NotNil(t, res.Error, "a job whose template died succeeded")
	case <-time.After(60 * time.Second):
		t.Fatal("job did not end after its template was killed")
	}
	a, err := os.ReadFile(f)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	b, err := os.ReadFile(f)
	require.NoError(t, err)
	require.Equal(t, string(a), string(b), "the job still runs after its template died and Run returned")
	awaitNewTemplate(t, p, pids[0])
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
}
