package pynox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Warm checkouts (issue 11, items 1 and 7): a session's process is forked
// from the pool's warm templates, confined with the session's grants
// before its first step, and never holds a job's worker; a checkout says
// when and why it ended, and the first step of a replacement process says
// so.

// childrenOfTest returns the live (non-zombie) children of the test
// process: a pool's templates, and any interpreter a pool starts.
func childrenOfTest(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var kids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, ppid, ok := procStat(pid); ok && ppid == os.Getpid() && state != "Z" {
			kids = append(kids, pid)
		}
	}
	slices.Sort(kids)
	return kids
}

// TestWarmSessionForkedFromPoolTemplate: a new session's process is a
// child of one of the pool's templates; no interpreter is started for it,
// and the preloads are the template's, imported once before the checkout
// (the preload counts its imports in a file, and records when and in
// which process it was imported).
func TestWarmSessionForkedFromPoolTemplate(t *testing.T) {
	// Sequential: it counts the test process's children.
	site := t.TempDir()
	log := filepath.Join(t.TempDir(), "imports.log")
	require.NoError(t, os.WriteFile(filepath.Join(site, "warmprobe.py"), []byte(
		"import os, time\n"+
			"CREATED = time.time()\n"+
			"PID = os.getpid()\n"+
			"with open("+strconv.Quote(log)+", 'a') as f:\n"+
			"    f.write('%d\\n' % PID)\n"), 0o644))
	p := newTestPool(t, Config{Workers: 2, Preload: []string{"warmprobe"}, PackageDirs: []string{site}})
	imports := func() int {
		b, err := os.ReadFile(log)
		require.NoError(t, err)
		return strings.Count(string(b), "\n")
	}
	require.Equal(t, 2, imports(), "each template imported the preload once")
	templates := p.templatePIDs()
	slices.Sort(templates)
	require.Len(t, templates, 2)
	require.Equal(t, templates, childrenOfTest(t), "the pool's only processes of its own are its templates")

	before := float64(time.Now().UnixNano()) / 1e9
	for i := 0; i < 3; i++ {
		co := checkout(t, p, Job{})
		r := feed(t, co, "import sys, os\n"+
			"print('warmprobe' in sys.modules)\n"+
			"import warmprobe\n"+
			"print(repr(warmprobe.CREATED))\n"+
			"print(warmprobe.PID == os.getppid() != os.getpid())")
		requireOK(t, r)
		lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		require.Len(t, lines, 3, r.Stdout)
		require.Equal(t, "True", lines[0], "the preload is in sys.modules before the step imports it")
		created, err := strconv.ParseFloat(lines[1], 64)
		require.NoError(t, err)
		require.Less(t, created, before, "the preload's module object was made before the checkout, by the template")
		require.Equal(t, "True", lines[2], "the preload was imported by the session process's parent")

		_, ppid, ok := procStat(co.Pid())
		require.True(t, ok)
		require.Contains(t, templates, ppid, "the session's process is a child of a pool template")
		require.Equal(t, templates, childrenOfTest(t), "no interpreter was started for the session")
		require.Equal(t, 2, imports(), "the preload was not imported again")
	}
	require.Equal(t, templates, sortedTemplatePIDs(p), "the pool's templates served the sessions and live on")
}

func sortedTemplatePIDs(p *Pool) []int {
	pids := p.templatePIDs()
	slices.Sort(pids)
	return pids
}

// TestWarmSessionGrantsHold: two sessions forked from the same template
// each have their own grants, applied before their first step: each
// writes in its own directory and is refused the other's.
func TestWarmSessionGrantsHold(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	dir := p.Config().Dir
	for _, d := range []string{"a", "b"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o755))
	}
	a := checkout(t, p, Job{AllowWrite: []string{"a"}})
	b := checkout(t, p, Job{AllowWrite: []string{"b"}})
	write := func(d string) string {
		return "open(" + strconv.Quote(filepath.Join(dir, d, "f")) + ", 'w').write('x')\nprint('wrote')"
	}
	// Each session's very first step is a write outside its grant.
	requireErrorType(t, feed(t, a, write("b")), "PermissionError")
	requireErrorType(t, feed(t, b, write("a")), "PermissionError")
	r := feed(t, a, write("a"))
	requireOK(t, r)
	require.Equal(t, "wrote\n", r.Stdout)
	r = feed(t, b, write("b"))
	requireOK(t, r)
	require.Equal(t, "wrote\n", r.Stdout)
	requireErrorType(t, feed(t, a, "open('/etc/pynox-warm-probe', 'w')"), "PermissionError")
	_, pa, _ := procStat(a.Pid())
	_, pb, _ := procStat(b.Pid())
	require.Equal(t, p.templatePIDs(), []int{pa}, "forked from the pool's template")
	require.Equal(t, pa, pb)
}

// TestCheckoutDoneErr: Done is open and Err nil while a checkout is
// open; Finish, and Pool.Close, close Done and Err says why. A process
// that ends does not end the checkout.
func TestCheckoutDoneErr(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1}) // closed below; the cleanup's second Close does nothing
	ctx := context.Background()

	co := checkout(t, p, Job{})
	requireOK(t, feed(t, co, "x = 1"))
	r := feed(t, co, "raise SystemExit(3)")
	require.True(t, r.SessionEnded)
	require.False(t, isDone(co.Done()), "a process's end is not the checkout's")
	require.NoError(t, co.Err())
	requireOK(t, feed(t, co, "y = 1"))
	pid := co.Pid()
	require.NoError(t, co.Finish(ctx))
	require.True(t, isDone(co.Done()), "Done is closed once Finish returns nil")
	_, _, exists := procStat(pid)
	require.False(t, exists, "Finish returned before the session's process was reaped")
	require.ErrorIs(t, co.Err(), ErrFinished)
	_, err := co.Feed(ctx, Step{Code: "1"})
	require.Equal(t, co.Err().Error(), err.Error(), "Err is what calls return")

	idle := checkout(t, p, Job{})
	requireOK(t, feed(t, idle, "y = 2"))
	pid = idle.Pid()
	never := checkout(t, p, Job{}) // no step: no process
	require.False(t, isDone(idle.Done()))
	require.NoError(t, p.Close())
	_, _, exists = procStat(pid)
	require.False(t, exists, "Close returned before the session's process was reaped")
	for _, c := range []*Checkout{idle, never} {
		select {
		case <-c.Done():
		case <-time.After(time.Minute):
			t.Fatal("Done was not closed by Pool.Close")
		}
		require.ErrorIs(t, c.Err(), ErrClosed)
		require.False(t, errors.Is(c.Err(), ErrFinished))
	}
}

// TestCheckoutDoneIdle: a checkout closed for being idle closes Done, and
// Err says it was idle.
func TestCheckoutDoneIdle(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, SessionIdle: 200 * time.Millisecond})
	co := checkout(t, p, Job{})
	requireOK(t, feed(t, co, "x = 1"))
	select {
	case <-co.Done():
	case <-time.After(time.Minute):
		t.Fatal("an idle checkout's Done was not closed")
	}
	require.ErrorIs(t, co.Err(), ErrFinished)
	require.Contains(t, co.Err().Error(), "idle")
}

// TestSessionRestarted: the first step of a replacement process — after
// an exit, a crash or a timeout — carries Restarted with Step 1; no other
// step does, the session's very first included.
func TestSessionRestarted(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	r := feed(t, co, "x = 1")
	requireOK(t, r)
	require.Equal(t, 1, r.Step)
	require.False(t, r.Restarted, "the session's first process is no replacement")
	for _, end := range []struct{ name, code string }{
		{"exit", "import os\nos._exit(3)"},
		{"crash", "import ctypes\nctypes.string_at(0)"},
		{"sys.exit", "import sys\nsys.exit(0)"},
	} {
		r = feed(t, co, "x = 1")
		requireOK(t, r)
		require.False(t, r.Restarted, end.name)
		r = feed(t, co, end.code)
		require.True(t, r.SessionEnded, end.name)
		require.False(t, r.Restarted, end.name)
		r = feed(t, co, "print('x' in globals())")
		requireOK(t, r)
		require.Equal(t, "False\n", r.Stdout, end.name)
		require.Equal(t, 1, r.Step, end.name)
		require.True(t, r.Restarted, "the first step after %s says it runs in a new process", end.name)
		r = feed(t, co, "print(1)")
		require.Equal(t, 2, r.Step, end.name)
		require.False(t, r.Restarted, end.name)
	}
	ctx := context.Background()
	ev, err := co.Feed(ctx, Step{Code: "while True: pass", Timeout: 300 * time.Millisecond})
	require.NoError(t, err)
	requireErrorType(t, ev.Result, "TimeoutError")
	require.True(t, ev.Result.SessionEnded)
	r = feed(t, co, "print(2)")
	requireOK(t, r)
	require.True(t, r.Restarted, "after a timeout")
	require.Equal(t, 1, r.Step)
}

// TestSessionDoesNotBlockJobs: on a pool with one worker, a session's
// step runs while a one-shot job holds the worker (waiting in a host
// call), and a one-shot job runs while a session's step is under way
// (waiting in a host call): neither takes the other's slot.
func TestSessionDoesNotBlockJobs(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A job holds the only worker while its host call waits.
	inCall, release := make(chan struct{}), make(chan struct{})
	jobDone := make(chan *Result, 1)
	go func() {
		res, err := p.Run(ctx, Job{Code: "from pynox_host import wait\nwait()\nprint('job')", Functions: []string{"wait"},
			Host: func(ctx context.Context, _ *Call) (any, error) {
				close(inCall)
				<-release
				return nil, nil
			}})
		if err != nil {
			res = &Result{Stderr: err.Error(), Exit: -2}
		}
		jobDone <- res
	}()
	<-inCall
	co := checkout(t, p, Job{Functions: []string{"tool"}})
	r := feed(t, co, "x = 41\nprint('session')")
	requireOK(t, r)
	require.Equal(t, "session\n", r.Stdout)

	// Now the session's step waits in a host call while jobs run.
	ev, err := co.Feed(ctx, Step{Code: "from pynox_host import tool\nx += tool()\nprint(x)"})
	require.NoError(t, err)
	require.NotNil(t, ev.Call, "the step waits for Resume")
	close(release)
	jr := <-jobDone
	requireOK(t, jr)
	require.Equal(t, "job\n", jr.Stdout)
	for i := 0; i < 3; i++ {
		requireOK(t, run(t, p, Job{Code: "print('again')"}))
	}
	ev, err = co.Resume(ctx, ev.Call.ID, Return(1))
	require.NoError(t, err)
	requireOK(t, ev.Result)
	require.Equal(t, "42\n", ev.Result.Stdout)
	require.Equal(t, 2, ev.Result.Step)
}

// TestSessionTemplateDiesDuringStep: a step under way when its template
// dies ends with SessionEnded (its process died with the template's PID
// namespace); the next step runs in a replacement process, forked from
// the pool's replacement template, and says Restarted.
func TestSessionTemplateDiesDuringStep(t *testing.T) {
	// Sequential: it kills a template.
	p := newTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	requireOK(t, feed(t, co, "x = 1"))
	old := p.templatePIDs()[0]
	done := make(chan *Result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ev, err := co.Feed(ctx, Step{Code: "import time\nprint('sleeping', flush=True)\ntime.sleep(60)"})
		if err != nil || ev.Result == nil {
			done <- nil
			return
		}
		done <- ev.Result
	}()
	require.Eventually(t, func() bool {
		state, _, ok := procStat(co.Pid())
		return ok && state == "S"
	}, 30*time.Second, 5*time.Millisecond, "the step runs")
	require.NoError(t, syscall.Kill(old, syscall.SIGKILL))
	r := <-done
	require.NotNil(t, r, "Feed returned no result")
	require.True(t, r.SessionEnded, "%+v", r.Error)
	require.NotNil(t, r.Error)
	fresh := awaitNewTemplate(t, p, old)
	r = feed(t, co, "print('x' in globals())")
	requireOK(t, r)
	require.Equal(t, "False\n", r.Stdout)
	require.Equal(t, 1, r.Step)
	require.True(t, r.Restarted)
	_, ppid, ok := procStat(co.Pid())
	require.True(t, ok)
	require.Equal(t, fresh, ppid, "forked from the replacement template")
}
