package pynox

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The second review's signal, clock and fallocate fixes, seen from a job:
// RLIMIT_SIGPENDING bounds the POSIX timers a job holds (each takes a
// queued-signal entry of the uid's machine-wide count), and what CPython
// itself does with signals, clocks and sessions keeps working under the
// narrower filter.
func TestHostileRTFixJobKeepsWorking(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	got := reviewProbe(t, p, Job{Code: reviewPrelude + `import faulthandler, resource, signal, threading, time
R["sigpending limit"] = "%d/%d" % resource.getrlimit(resource.RLIMIT_SIGPENDING)
try:
    resource.setrlimit(resource.RLIMIT_SIGPENDING, (1 << 20, 1 << 20))
    R["raise limit"] = "ok"
except (ValueError, OSError) as e:
    R["raise limit"] = "refused"
# Each POSIX timer preallocates a queued signal; past the limit, EAGAIN.
tid = ctypes.c_void_p()
n = 0
while n < 1000 and _libc.timer_create(1, None, ctypes.byref(tid)) == 0:
    n += 1
R["timers"] = str(n)
R["timer errno"] = errno.errorcode.get(ctypes.get_errno(), "?")
R["process_time"] = call(time.process_time)
R["thread_time"] = call(time.thread_time)
R["own thread clock"] = call(lambda: time.clock_gettime(time.pthread_getcpuclockid(threading.get_ident())))
def cpuclock(pid):
    cid = ctypes.c_int()
    err = _libc.clock_getcpuclockid(pid, ctypes.byref(cid))  # returns the errno
    if err:
        raise OSError(err, os.strerror(err))
    time.clock_gettime(cid.value)
R["clock_getcpuclockid(0)"] = call(lambda: cpuclock(0))
R["own pid's clock"] = call(lambda: cpuclock(os.getpid()))
R["monotonic"] = call(time.monotonic)
R["sleep"] = call(lambda: time.sleep(0.01))
R["getsid 0"] = call(lambda: os.getsid(0))
R["getpgid 0"] = call(lambda: os.getpgid(0))
R["getpgrp"] = call(os.getpgrp)
R["kill self 0"] = call(lambda: os.kill(os.getpid(), 0))
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
R["kill self SIGUSR1"] = call(lambda: os.kill(os.getpid(), signal.SIGUSR1))
R["handler ran"] = str(bool(got))
R["pthread_kill SIGUSR1"] = call(lambda: signal.pthread_kill(threading.get_ident(), signal.SIGUSR1))
R["kill self SIGRTMIN"] = call(lambda: os.kill(os.getpid(), signal.SIGRTMIN))
R["pthread_kill SIGRTMAX"] = call(lambda: signal.pthread_kill(threading.get_ident(), signal.SIGRTMAX))
signal.setitimer(signal.ITIMER_REAL, 0.01)
signal.signal(signal.SIGALRM, lambda *a: got.append(2))
time.sleep(0.1)
R["itimer fired"] = str(2 in got)
faulthandler.dump_traceback_later(30)
faulthandler.cancel_dump_traceback_later()
t = threading.Thread(target=lambda: time.sleep(0.01)); t.start(); t.join()
R["thread"] = "ok"
print(json.dumps(R))`})
	t.Logf("%v", got)
	require.Equal(t, "64/64", got["sigpending limit"])
	require.Equal(t, "refused", got["raise limit"], "a job raised its RLIMIT_SIGPENDING")
	require.Equal(t, "EAGAIN", got["timer errno"], "timer_create past RLIMIT_SIGPENDING")
	require.LessOrEqual(t, len(got["timers"]), 2, "at most 64 timers: %s", got["timers"])
	for _, k := range []string{"process_time", "thread_time", "own thread clock", "monotonic", "sleep", "getsid 0",
		"getpgid 0", "getpgrp", "kill self 0", "kill self SIGUSR1", "pthread_kill SIGUSR1", "thread"} {
		require.Equal(t, "ok", got[k], k)
	}
	require.Equal(t, "True", got["handler ran"])
	require.Equal(t, "True", got["itimer fired"])
	require.Equal(t, "EPERM", got["kill self SIGRTMIN"])
	require.Equal(t, "ok", got["clock_getcpuclockid(0)"])
	require.Equal(t, "EPERM", got["own pid's clock"], "a documented limit: clocks named by pid fail, the job's own too")
	require.Equal(t, "EPERM", got["pthread_kill SIGRTMAX"])
	advServes(t, p)
}

// A job's exception named like one of the pool's error types is reported
// module-qualified, whether the runner reports it or the job forges the
// report; other types stay bare.
func TestHostileRTFixErrorTypes(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	for _, tc := range []struct{ code, want string }{
		{"raise TimeoutError('socket timed out')", "builtins.TimeoutError"},
		{"import socket\nraise socket.timeout('timed out')", "builtins.TimeoutError"},
		{"class PoolWorkerError(Exception):\n    __module__ = None\nraise PoolWorkerError()", "__main__.PoolWorkerError"},
		{"class Outer:\n    class SignalError(Exception): pass\nraise Outer.SignalError()", "__main__.Outer.SignalError"},
		{"raise ValueError('bare')", "ValueError"},
		{"import json\njson.loads('{')", "JSONDecodeError"},
		{"class MyError(Exception): pass\nraise MyError()", "MyError"},
		{forgeSend + `send('{"t":"done","step":1,"exit":1,"error":{"type":"RequestError","message":"nothing ran","file":null,"line":null}}')
import time
time.sleep(1)`, "__main__.RequestError"},
	} {
		r := run(t, p, Job{Code: tc.code, Timeout: 10 * time.Second})
		require.NotNil(t, r.Error, tc.code)
		require.Equal(t, tc.want, r.Error.Type, "%s: %+v", tc.code, r.Error)
		var e *Error
		require.ErrorAs(t, r.Err(), &e)
		require.Equal(t, KindRuntime, e.Kind, tc.code)
	}
	advServes(t, p)
}

// An empty path is refused in every ceiling and grant list, from a
// configuration file (package jsonl), from Config (profiles and package directories too)
// and in requests, naming the field.
func TestHostileRTFixEmptyPaths(t *testing.T) {
	t.Parallel()
	// (The configuration file's lists: TestHostileRTFixEmptyPathsInConfigFile
	// in package jsonl.)
	requireSandbox(t)
	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{PackageDirs: []string{""}}, "package_dirs"},
		{Config{Profiles: map[string]Profile{"etl": {AllowWrite: []string{""}}}}, `profile "etl": allow_write`},
		{Config{Profiles: map[string]Profile{"etl": {AllowRead: []string{""}}}}, `profile "etl": allow_read`},
	} {
		tc.cfg.Dir, tc.cfg.Python = t.TempDir(), testPython()
		p, err := New(tc.cfg)
		if p != nil {
			p.Close()
		}
		require.Error(t, err, tc.field)
		require.Contains(t, err.Error(), tc.field)
	}
	p := newTestPool(t, Config{Workers: 1})
	for _, j := range []Job{{Code: "pass", AllowRead: []string{""}}, {Code: "pass", PackageDirs: []string{""}}} {
		r := run(t, p, j)
		requireErrorType(t, r, "RequestError")
		require.Contains(t, r.Error.Message, "empty path")
	}
}

// Write grants may not cover the system paths jobs load, nor lie beneath
// one, whether a request, a profile or a session step asks; the refusal
// names the field. A profile that asks is refused when the pool starts.
func TestHostileRTFixSystemPathGrants(t *testing.T) {
	t.Parallel()
	requireSandbox(t)
	p := newTestPool(t, Config{Workers: 1, Limits: Limits{AllowWrite: []string{"/etc", "/usr"}}})
	// (/etc covers /etc/ld.so.preload by name, whether it exists or not.)
	for _, target := range []string{"/etc", "/etc/ld.so.preload", "/usr/lib", "/usr", "/usr/lib/locale"} {
		if _, err := os.Lstat(target); err != nil {
			continue // a grant must name an existing path
		}
		r := run(t, p, Job{Code: "print('granted')", AllowWrite: []string{target}})
		requireErrorType(t, r, "RequestError")
		require.Contains(t, r.Error.Message, "allow_write")
		require.Contains(t, r.Error.Message, "read-only")
	}
	// A session asks the same way.
	_, err := p.Checkout(context.Background(), Job{AllowWrite: []string{"/etc"}})
	require.Error(t, err)
	require.Contains(t, err.Error(), "read-only")

	_, err = New(Config{Dir: t.TempDir(), Python: testPython(), Limits: Limits{AllowWrite: []string{"/etc"}},
		Profiles: map[string]Profile{"net": {AllowWrite: []string{"/etc/ssl"}}}})
	require.Error(t, err)
	require.Contains(t, err.Error(), `profile "net": allow_write`)
	require.Contains(t, err.Error(), "read-only")
}
