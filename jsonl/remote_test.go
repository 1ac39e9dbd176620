package jsonl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/testenv"
)

// The Go API's tests, run both ways: on a local pool (pynox.New) and on a
// remote one (Dial) talking to a real `pynox serve` binary on a loopback
// port, with the same configuration.
//
// Each test starts its own server on port 0 and most run in parallel;
// TestRemoteDialRefusals and TestRemoteDisconnectMidTurn do not: they
// reuse the address of a server they killed, which a parallel test's new
// server could take meanwhile.

// remoteServer is a running `pynox serve`.
type remoteServer = testenv.Server

// startRemoteServer starts `pynox serve --listen=listen` in dir, writable
// by jobs, with the token file and flags given, and waits until it serves.
func startRemoteServer(t testing.TB, dir, listen, tokenFile string, args ...string) *remoteServer {
	t.Helper()
	argv := []string{"--allow-write=" + dir}
	if tokenFile != "" {
		argv = append(argv, "--token-file="+tokenFile)
	}
	return testenv.StartServe(t, dir, listen, append(argv, args...)...)
}

// remoteTestToken is the token of the tests' servers.
const remoteTestToken = "remote-test-token-0123456789"

// writeTokenFile writes a token file holding remoteTestToken.
func writeTokenFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte("# tokens\n"+remoteTestToken+"\n"), 0o600))
	return path
}

// dialTest dials a server with the tests' token and closes the pool when
// the test ends.
func dialTest(t testing.TB, s *remoteServer) *pynox.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := Dial(ctx, s.URL(), DialOptions{Token: remoteTestToken})
	require.NoError(t, err)
	require.True(t, p.IsRemote())
	t.Cleanup(func() { p.Close() })
	return p
}

// apiTests are the Go API's tests that run on both a local and a remote
// pool; each gets the pool and a directory it may write in.
var apiTests = []struct {
	name string
	fn   func(t *testing.T, p *pynox.Pool)
}{
	{"RunTrivial", func(t *testing.T, p *pynox.Pool) {
		res := run(t, p, pynox.Job{ID: "t1", Code: "print(6 * 7)"})
		requireOK(t, res)
		require.Equal(t, "42\n", res.Stdout)
		require.Equal(t, "t1", res.ID)
		require.NoError(t, res.Err())
		require.NotNil(t, res.Policy)
	}},
	{"Exception", func(t *testing.T, p *pynox.Pool) {
		res := run(t, p, pynox.Job{Code: "raise KeyError('k')"})
		require.Equal(t, 1, res.Exit)
		require.Equal(t, "KeyError", res.Error.Type)
		require.NotNil(t, res.Error.File)
		require.Equal(t, "<code>", *res.Error.File)
		err := res.Err()
		require.ErrorIs(t, err, pynox.ErrRuntime)
		var e *pynox.Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, pynox.KindRuntime, e.Kind)
		require.Equal(t, "KeyError", e.Type)
	}},
	{"PythonTimeoutErrorIsRuntime", func(t *testing.T, p *pynox.Pool) {
		// The job's own TimeoutError is not the pool's verdict.
		res := run(t, p, pynox.Job{Code: "raise TimeoutError('mine')"})
		require.ErrorIs(t, res.Err(), pynox.ErrRuntime)
		require.NotErrorIs(t, res.Err(), pynox.ErrTimeout)
	}},
	{"Timeout", func(t *testing.T, p *pynox.Pool) {
		res := run(t, p, pynox.Job{Code: "while True:\n    pass", Timeout: 300 * time.Millisecond})
		require.Equal(t, -1, res.Exit)
		require.Equal(t, "TimeoutError", res.Error.Type)
		require.ErrorIs(t, res.Err(), pynox.ErrTimeout)
	}},
	{"RequestError", func(t *testing.T, p *pynox.Pool) {
		res := run(t, p, pynox.Job{Code: "print(1)", Memory: 100 << 30})
		require.ErrorIs(t, res.Err(), pynox.ErrRequest)
		require.Contains(t, res.Error.Message, "memory")
	}},
	{"StdoutStderr", func(t *testing.T, p *pynox.Pool) {
		res := run(t, p, pynox.Job{Code: "import sys\nprint('out')\nprint('err', file=sys.stderr)"})
		requireOK(t, res)
		require.Equal(t, "out\n", res.Stdout)
		require.Equal(t, "err\n", res.Stderr)
	}},
	{"InputsAndValue", func(t *testing.T, p *pynox.Pool) {
		res := run(t, p, pynox.Job{Code: "n * 2", Inputs: map[string]any{"n": 21}})
		requireOK(t, res)
		require.JSONEq(t, "42", string(res.Value))
	}},
	{"StreamedOutput", func(t *testing.T, p *pynox.Pool) {
		var mu sync.Mutex
		var got []string
		res := run(t, p, pynox.Job{Code: "import sys\nprint('a', flush=True)\nprint('b', file=sys.stderr, flush=True)",
			OnOutput: func(s pynox.Stream, text string) {
				mu.Lock()
				got = append(got, s.String()+":"+text)
				mu.Unlock()
			}})
		requireOK(t, res)
		mu.Lock()
		defer mu.Unlock()
		require.Contains(t, got, "stdout:a\n")
		require.Contains(t, got, "stderr:b\n")
	}},
	{"HostFunctionTypedError", func(t *testing.T, p *pynox.Pool) {
		host := func(_ context.Context, call *pynox.Call) (any, error) {
			var args []string
			if err := json.Unmarshal(call.Args, &args); err != nil {
				return nil, err
			}
			if args[0] == "missing" {
				return nil, pynox.RaiseAs("KeyError", "no such page")
			}
			return "page " + args[0], nil
		}
		res := run(t, p, pynox.Job{Functions: []string{"lookup"}, Host: host, Code: "from pynox_host import lookup\n" +
			"print(lookup('one'))\n" +
			"try:\n    lookup('missing')\nexcept KeyError as e:\n    print('KeyError', e)"})
		requireOK(t, res)
		require.Equal(t, "page one\nKeyError 'no such page'\n", res.Stdout)
	}},
	{"FunctionsWithoutHost", func(t *testing.T, p *pynox.Pool) {
		res := run(t, p, pynox.Job{Functions: []string{"f"}, Code: "print(1)"})
		require.ErrorIs(t, res.Err(), pynox.ErrRequest)
	}},
	{"RunContextEnds", func(t *testing.T, p *pynox.Pool) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		res, err := p.Run(ctx, pynox.Job{Code: "import time\ntime.sleep(20)"})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Nil(t, res)
	}},
	{"SessionKeepsVariables", func(t *testing.T, p *pynox.Pool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		co, err := p.Checkout(ctx, pynox.Job{})
		require.NoError(t, err)
		ev, err := co.Feed(ctx, pynox.Step{ID: 1, Code: "x = 41"})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		require.Equal(t, 1, ev.Result.Step)
		ev, err = co.Feed(ctx, pynox.Step{ID: 2, Code: "print(x + 1)"})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		require.Equal(t, "42\n", ev.Result.Stdout)
		require.Equal(t, 2, ev.Result.Step)
		require.Equal(t, 2, ev.Result.ID)
		// An exception leaves the session alive.
		ev, err = co.Feed(ctx, pynox.Step{Code: "1/0"})
		require.NoError(t, err)
		require.Equal(t, "ZeroDivisionError", ev.Result.Error.Type)
		require.False(t, ev.Result.SessionEnded)
		ev, err = co.Feed(ctx, pynox.Step{Code: "x", Inputs: map[string]any{"y": 1}})
		require.NoError(t, err)
		require.JSONEq(t, "41", string(ev.Result.Value))
		require.NoError(t, co.Finish(ctx))
		_, err = co.Feed(ctx, pynox.Step{Code: "print(x)"})
		require.ErrorIs(t, err, pynox.ErrFinished)
		require.ErrorIs(t, co.Err(), pynox.ErrFinished)
		<-co.Done()
	}},
	{"SessionCallsSurfaceAndResume", func(t *testing.T, p *pynox.Pool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		co, err := p.Checkout(ctx, pynox.Job{Functions: []string{"fetch"}})
		require.NoError(t, err)
		defer co.Finish(ctx)
		ev, err := co.Feed(ctx, pynox.Step{Code: "from pynox_host import fetch\n" +
			"print(fetch('a'))\ntry:\n    fetch('b')\nexcept PermissionError as e:\n    print('denied', e)"})
		require.NoError(t, err)
		require.NotNil(t, ev.Call)
		require.Equal(t, "fetch", ev.Call.Function)
		// A wrong call id is the caller's mistake.
		_, err = co.Resume(ctx, ev.Call.ID+1000, pynox.Return(1))
		require.ErrorIs(t, err, pynox.ErrProtocol)
		// Feed while a call waits is too.
		_, err = co.Feed(ctx, pynox.Step{Code: "print(2)"})
		require.ErrorIs(t, err, pynox.ErrProtocol)
		ev, err = co.Resume(ctx, ev.Call.ID, pynox.Return("A"))
		require.NoError(t, err)
		require.NotNil(t, ev.Call)
		ev, err = co.Resume(ctx, ev.Call.ID, pynox.RaiseError(pynox.RaiseAs("PermissionError", "not yours")))
		require.NoError(t, err)
		require.NotNil(t, ev.Result)
		requireOK(t, ev.Result)
		require.Equal(t, "A\ndenied not yours\n", ev.Result.Stdout)
		_, err = co.Resume(ctx, 1, pynox.Return(1))
		require.ErrorIs(t, err, pynox.ErrProtocol)
	}},
	{"SessionRefusedStep", func(t *testing.T, p *pynox.Pool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// A job outside the ceiling: a local pool refuses it at Checkout,
		// a remote one at the first Feed (the server sees it then).
		co, err := p.Checkout(ctx, pynox.Job{AllowRead: []string{"/etc"}})
		if err == nil {
			require.True(t, p.IsRemote())
			_, err = co.Feed(ctx, pynox.Step{Code: "print(1)"})
			co.Finish(ctx)
		}
		require.ErrorIs(t, err, pynox.ErrRequest)
		require.Contains(t, err.Error(), "/etc")
	}},
	{"SessionTimeoutRestarts", func(t *testing.T, p *pynox.Pool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		co, err := p.Checkout(ctx, pynox.Job{Env: map[string]string{"K": "v"}})
		require.NoError(t, err)
		defer co.Finish(ctx)
		ev, err := co.Feed(ctx, pynox.Step{Code: "x = 1"})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		ev, err = co.Feed(ctx, pynox.Step{Code: "while True:\n    pass", Timeout: 300 * time.Millisecond})
		require.NoError(t, err)
		require.ErrorIs(t, ev.Result.Err(), pynox.ErrTimeout)
		require.True(t, ev.Result.SessionEnded)
		// The next step runs in a new process, with the session's
		// permissions and environment, and says so.
		ev, err = co.Feed(ctx, pynox.Step{Code: "import os\nprint(os.environ['K'], 'x' in globals())"})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		require.Equal(t, "v False\n", ev.Result.Stdout)
		require.True(t, ev.Result.Restarted)
		require.Equal(t, 1, ev.Result.Step)
	}},
	{"SessionInterrupt", func(t *testing.T, p *pynox.Pool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		started := make(chan struct{})
		var once sync.Once
		co, err := p.Checkout(ctx, pynox.Job{Functions: []string{"started"}, Host: func(context.Context, *pynox.Call) (any, error) {
			once.Do(func() { close(started) })
			return nil, nil
		}})
		require.NoError(t, err)
		defer co.Finish(ctx)
		ev, err := co.Feed(ctx, pynox.Step{Code: "n = 5"})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		require.False(t, co.Interrupt(), "no step runs")
		type fed struct {
			ev  pynox.TurnEvent
			err error
		}
		done := make(chan fed, 1)
		go func() {
			ev, err := co.Feed(ctx, pynox.Step{Code: "from pynox_host import started\nimport time\nstarted()\nwhile True:\n    time.sleep(0.01)"})
			done <- fed{ev, err}
		}()
		<-started
		require.True(t, co.Interrupt())
		f := <-done
		require.NoError(t, f.err)
		require.Equal(t, "KeyboardInterrupt", f.ev.Result.Error.Type)
		require.False(t, f.ev.Result.SessionEnded)
		ev, err = co.Feed(ctx, pynox.Step{Code: "print(n)"})
		require.NoError(t, err)
		require.Equal(t, "5\n", ev.Result.Stdout)
	}},
	{"FeedContextEnds", func(t *testing.T, p *pynox.Pool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		co, err := p.Checkout(ctx, pynox.Job{})
		require.NoError(t, err)
		defer co.Finish(ctx)
		short, stop := context.WithTimeout(ctx, 500*time.Millisecond)
		defer stop()
		ev, err := co.Feed(short, pynox.Step{Code: "m = 3\nimport time\ntime.sleep(20)"})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NotNil(t, ev.Result)
		require.Equal(t, "KeyboardInterrupt", ev.Result.Error.Type)
		ev, err = co.Feed(ctx, pynox.Step{Code: "print(m)"})
		require.NoError(t, err)
		require.Equal(t, "3\n", ev.Result.Stdout)
	}},
	{"ConcurrentCallsWait", func(t *testing.T, p *pynox.Pool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		co, err := p.Checkout(ctx, pynox.Job{Functions: []string{"echo"}})
		require.NoError(t, err)
		defer co.Finish(ctx)
		ev, err := co.Feed(ctx, pynox.Step{Code: "import asyncio\nfrom pynox_host import aio\n" +
			"async def main():\n    return await asyncio.gather(*(aio.echo(i) for i in range(3)))\n" +
			"print(asyncio.run(main()))"})
		require.NoError(t, err)
		require.NotNil(t, ev.Call)
		for len(ev.Calls) < 3 {
			ev, err = co.Wait(ctx)
			require.NoError(t, err)
			require.Nil(t, ev.Result)
		}
		byArg := map[string]int64{}
		for _, c := range ev.Calls {
			byArg[string(c.Args)] = c.ID
		}
		require.Len(t, byArg, 3)
		for i := 2; i >= 0; i-- {
			ev, err = co.Resume(ctx, byArg[fmt.Sprintf("[%d]", i)], pynox.Return(i*10))
			require.NoError(t, err)
			if i > 0 {
				require.Len(t, ev.Calls, i, "the others still wait")
				require.Equal(t, ev.Calls[0], ev.Call)
			}
		}
		require.NotNil(t, ev.Result)
		requireOK(t, ev.Result)
		require.Equal(t, "[0, 10, 20]\n", ev.Result.Stdout)
		_, err = co.Wait(ctx)
		require.ErrorIs(t, err, pynox.ErrProtocol)
	}},
	{"Display", func(t *testing.T, p *pynox.Pool) {
		var got []pynox.Output
		res := run(t, p, pynox.Job{Code: "from pynox_display import display\ndisplay(5)",
			OnDisplay: func(o pynox.Output) { got = append(got, o) }})
		requireOK(t, res)
		require.Equal(t, []pynox.Output{{MIME: "text/plain", Data: "5"}}, got)
		require.Equal(t, got, res.Outputs)
	}},
	{"DumpRestore", func(t *testing.T, p *pynox.Pool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		co, err := p.Checkout(ctx, pynox.Job{})
		require.NoError(t, err)
		ev, err := co.Feed(ctx, pynox.Step{Code: "x = {'a': 41}"})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		d, err := co.Dump(ctx)
		require.NoError(t, err)
		require.NoError(t, co.Finish(ctx))
		co2, err := p.Restore(ctx, pynox.Job{}, d.Data)
		require.NoError(t, err)
		defer co2.Finish(ctx)
		ev, err = co2.Feed(ctx, pynox.Step{Code: "print(x['a'] + 1)"})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		require.Equal(t, "42\n", ev.Result.Stdout)
		_, err = p.Restore(ctx, pynox.Job{}, []byte("not a dump"))
		require.ErrorIs(t, err, pynox.ErrRequest)
	}},
	{"CollectOutputs", func(t *testing.T, p *pynox.Pool) {
		res := run(t, p, pynox.Job{Code: "import os\nopen(os.environ['PYNOX_OUTPUTS'] + '/a.txt', 'w').write('hi')"})
		requireOK(t, res)
		require.Len(t, res.Files, 1)
		require.True(t, strings.HasSuffix(res.Files[0].Path, "/a.txt"), res.Files[0].Path)
		require.Equal(t, "hi", string(res.Files[0].Data))
	}},
	{"StepCollect", func(t *testing.T, p *pynox.Pool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		co, err := p.Checkout(ctx, pynox.Job{})
		require.NoError(t, err)
		defer co.Finish(ctx)
		ev, err := co.Feed(ctx, pynox.Step{Code: "import os\nopen(os.environ['PYNOX_OUTPUTS'] + '/b.txt', 'w').write('yo')",
			Collect: []string{"$TMPDIR/*.csv"}})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		require.Len(t, ev.Result.Files, 1)
		require.Equal(t, "yo", string(ev.Result.Files[0].Data))
		// A pattern outside the step's grants is refused, the session
		// unchanged.
		_, err = co.Feed(ctx, pynox.Step{Code: "print(1)", Collect: []string{"/etc/*"}})
		require.ErrorIs(t, err, pynox.ErrRequest)
		require.Contains(t, err.Error(), "collect")
	}},
	{"Accessors", func(t *testing.T, p *pynox.Pool) {
		// The remote pool's come from the server's ready event; the
		// server runs on this machine with the local pool's settings.
		require.Equal(t, 2, p.Workers())
		require.Empty(t, p.Preloaded())
		require.Contains(t, []string{"v1", "v2", "none"}, p.Cgroups())
		want := []pynox.MountMode{pynox.ReadOnly, pynox.ReadWrite}
		if p.Mounts().VirtualPaths { // per-job mount namespaces (as root with user namespaces and overlayfs)
			want = append(want, pynox.Overlay)
		}
		require.Equal(t, want, p.Mounts().Modes)
		require.NotEmpty(t, p.Mounts().Scratch)
	}},
	{"Stats", func(t *testing.T, p *pynox.Pool) {
		before := p.Stats()
		require.Equal(t, 2, before.Workers)
		run(t, p, pynox.Job{Code: "print(1)"})
		run(t, p, pynox.Job{Code: "raise ValueError()"})
		after, err := p.StatsContext(context.Background())
		require.NoError(t, err)
		require.Equal(t, before.Jobs+2, after.Jobs)
		require.Equal(t, before.OK+1, after.OK)
		require.Equal(t, before.Failed+1, after.Failed)
		require.Equal(t, before.Errors["ValueError"]+1, after.Errors["ValueError"])
		require.Equal(t, 2, p.Workers())
	}},
}

// TestGoAPILocalAndRemote runs apiTests on a local pool and on a remote
// one served by `pynox serve` with the same settings.
func TestGoAPILocalAndRemote(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandbox(t)
	dir := t.TempDir()
	local := newTestPool(t, pynox.Config{Workers: 2, Dir: dir})
	srv := startRemoteServer(t, dir, "127.0.0.1:0", writeTokenFile(t), "--workers=2")
	remote := dialTest(t, srv)
	require.Equal(t, local.Cgroups(), remote.Cgroups())
	require.Equal(t, local.PIDNamespace(), remote.PIDNamespace())
	for _, pc := range []struct {
		name string
		p    *pynox.Pool
	}{{"local", local}, {"remote", remote}} {
		t.Run(pc.name, func(t *testing.T) {
			for _, tc := range apiTests {
				t.Run(tc.name, func(t *testing.T) { tc.fn(t, pc.p) })
			}
		})
	}
}

// TestRemoteDialRefusals: a wrong token, or nothing listening, is an
// ErrDisconnected error from Dial naming why.
func TestRemoteDialRefusals(t *testing.T) {
	requireSandbox(t)
	dir := t.TempDir()
	srv := startRemoteServer(t, dir, "127.0.0.1:0", writeTokenFile(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := Dial(ctx, srv.URL(), DialOptions{Token: "wrong"})
	require.ErrorIs(t, err, pynox.ErrDisconnected)
	require.Contains(t, err.Error(), "401")
	require.Contains(t, err.Error(), "DialOptions.Token")
	srv.Kill()
	_, err = Dial(ctx, srv.URL(), DialOptions{Token: remoteTestToken})
	require.ErrorIs(t, err, pynox.ErrDisconnected)
}

// TestRemoteDisconnectMidTurn: killing the server under a running job and
// a session fails both with ErrDisconnected; the pool then reconnects for
// new work to a server back on the same address.
func TestRemoteDisconnectMidTurn(t *testing.T) {
	testenv.Slow(t)
	requireSandbox(t)
	dir := t.TempDir()
	tokens := writeTokenFile(t)
	srv := startRemoteServer(t, dir, "127.0.0.1:0", tokens, "--workers=2")
	p := dialTest(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	co, err := p.Checkout(ctx, pynox.Job{})
	require.NoError(t, err)
	ev, err := co.Feed(ctx, pynox.Step{Code: "x = 1"})
	require.NoError(t, err)
	requireOK(t, ev.Result)

	// A one-shot job and a session step, each running (it has called
	// the host) when the server dies.
	started := make(chan struct{}, 2)
	host := func(context.Context, *pynox.Call) (any, error) { started <- struct{}{}; return nil, nil }
	code := "from pynox_host import started\nimport time\nstarted()\ntime.sleep(60)"
	runErr := make(chan error, 1)
	go func() {
		_, err := p.Run(ctx, pynox.Job{Functions: []string{"started"}, Host: host, Code: code})
		runErr <- err
	}()
	co2, err := p.Checkout(ctx, pynox.Job{Functions: []string{"started"}, Host: host})
	require.NoError(t, err)
	feedErr := make(chan error, 1)
	go func() {
		_, err := co2.Feed(ctx, pynox.Step{Code: code})
		feedErr <- err
	}()
	<-started
	<-started
	srv.Kill()

	err = <-runErr
	require.ErrorIs(t, err, pynox.ErrDisconnected)
	var e *pynox.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, pynox.KindDisconnected, e.Kind)
	require.Equal(t, "Disconnected", e.Type)
	require.ErrorIs(t, <-feedErr, pynox.ErrDisconnected)
	// The idle session of that connection has ended too.
	<-co.Done()
	require.ErrorIs(t, co.Err(), pynox.ErrDisconnected)
	_, err = co.Feed(ctx, pynox.Step{Code: "print(x)"})
	require.ErrorIs(t, err, pynox.ErrDisconnected)
	_, err = co2.Feed(ctx, pynox.Step{Code: "print(1)"})
	require.ErrorIs(t, err, pynox.ErrDisconnected)

	// While the server is away, new work fails to connect.
	_, err = p.Run(ctx, pynox.Job{Code: "print(1)"})
	require.ErrorIs(t, err, pynox.ErrDisconnected)

	// A server back on the same address: the pool reconnects.
	startRemoteServer(t, dir, srv.Addr, tokens, "--workers=2")
	res, err := p.Run(ctx, pynox.Job{Code: "print('again')"})
	require.NoError(t, err)
	requireOK(t, res)
	require.Equal(t, "again\n", res.Stdout)
	co3, err := p.Checkout(ctx, pynox.Job{})
	require.NoError(t, err)
	ev, err = co3.Feed(ctx, pynox.Step{Code: "print('fresh')"})
	require.NoError(t, err)
	require.Equal(t, "fresh\n", ev.Result.Stdout)
	require.NoError(t, co3.Finish(ctx))
}

// TestRemoteClose: Close under a running job fails it with ErrClosed (not
// ErrDisconnected), and later calls fail with ErrClosed.
func TestRemoteClose(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandbox(t)
	dir := t.TempDir()
	srv := startRemoteServer(t, dir, "127.0.0.1:0", writeTokenFile(t))
	p := dialTest(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	started := make(chan struct{}, 1)
	host := func(context.Context, *pynox.Call) (any, error) { started <- struct{}{}; return nil, nil }
	runErr := make(chan error, 1)
	go func() {
		_, err := p.Run(ctx, pynox.Job{Functions: []string{"started"}, Host: host,
			Code: "from pynox_host import started\nimport time\nstarted()\ntime.sleep(60)"})
		runErr <- err
	}()
	co, err := p.Checkout(ctx, pynox.Job{})
	require.NoError(t, err)
	<-started
	require.NoError(t, p.Close())
	err = <-runErr
	require.ErrorIs(t, err, pynox.ErrClosed)
	require.False(t, errors.Is(err, pynox.ErrDisconnected))
	_, err = p.Run(ctx, pynox.Job{Code: "print(1)"})
	require.ErrorIs(t, err, pynox.ErrClosed)
	_, err = co.Feed(ctx, pynox.Step{Code: "print(1)"})
	require.ErrorIs(t, err, pynox.ErrClosed)
	_, err = p.Checkout(ctx, pynox.Job{})
	require.ErrorIs(t, err, pynox.ErrClosed)
}

// faultProxy forwards TCP connections to a server, and can cut them (the
// connection ends under the client, the server lives on) or freeze them
// (bytes stop flowing but nothing ends: a peer gone without a word).
type faultProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	frozen chan struct{} // closed by freeze
}

func startFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fp := &faultProxy{ln: ln, target: target, frozen: make(chan struct{})}
	t.Cleanup(func() { ln.Close(); fp.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			fp.mu.Lock()
			fp.conns = append(fp.conns, c, s)
			fp.mu.Unlock()
			go fp.pipe(c, s)
			go fp.pipe(s, c)
		}
	}()
	return fp
}

// pipe copies from src to dst until either ends or the proxy freezes.
func (fp *faultProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-fp.frozen:
			<-make(chan struct{}) // holds the bytes for good
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// cut closes every connection through the proxy.
func (fp *faultProxy) cut() {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	for _, c := range fp.conns {
		c.Close()
	}
	fp.conns = nil
}

func (fp *faultProxy) url() string { return "ws://" + fp.ln.Addr().String() + "/v1/pool" }

// TestRemoteConnectionCutMidTurn: the connection ends under a running job
// while the server lives on; the job fails with ErrDisconnected and the
// pool's next job goes over a new connection to the same server.
func TestRemoteConnectionCutMidTurn(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandbox(t)
	dir := t.TempDir()
	srv := startRemoteServer(t, dir, "127.0.0.1:0", writeTokenFile(t))
	fp := startFaultProxy(t, srv.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := Dial(ctx, fp.url(), DialOptions{Token: remoteTestToken})
	require.NoError(t, err)
	defer p.Close()
	started := make(chan struct{}, 1)
	host := func(context.Context, *pynox.Call) (any, error) { started <- struct{}{}; return nil, nil }
	runErr := make(chan error, 1)
	go func() {
		_, err := p.Run(ctx, pynox.Job{Functions: []string{"started"}, Host: host,
			Code: "from pynox_host import started\nimport time\nstarted()\ntime.sleep(60)"})
		runErr <- err
	}()
	<-started
	fp.cut()
	require.ErrorIs(t, <-runErr, pynox.ErrDisconnected)
	res, err := p.Run(ctx, pynox.Job{Code: "print('over a new connection')"})
	require.NoError(t, err)
	require.Equal(t, "over a new connection\n", res.Stdout)
}

// TestRemoteSilentPeer: a connection whose bytes stop flowing without an
// end (a peer gone without a word) is ended by the keepalive, and the job
// in flight fails with ErrDisconnected instead of waiting for good.
func TestRemoteSilentPeer(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandbox(t)
	dir := t.TempDir()
	srv := startRemoteServer(t, dir, "127.0.0.1:0", writeTokenFile(t))
	fp := startFaultProxy(t, srv.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := Dial(ctx, fp.url(), DialOptions{Token: remoteTestToken, Keepalive: 300 * time.Millisecond})
	require.NoError(t, err)
	defer p.Close()
	started := make(chan struct{}, 1)
	host := func(context.Context, *pynox.Call) (any, error) { started <- struct{}{}; return nil, nil }
	runErr := make(chan error, 1)
	go func() {
		_, err := p.Run(ctx, pynox.Job{Functions: []string{"started"}, Host: host,
			Code: "from pynox_host import started\nimport time\nstarted()\ntime.sleep(60)"})
		runErr <- err
	}()
	<-started
	close(fp.frozen)
	require.ErrorIs(t, <-runErr, pynox.ErrDisconnected)
}

// TestRemoteShutdown: Shutdown refuses new work at once, lets the job in
// flight finish with its result, then closes.
func TestRemoteShutdown(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandbox(t)
	dir := t.TempDir()
	srv := startRemoteServer(t, dir, "127.0.0.1:0", writeTokenFile(t))
	p := dialTest(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	host := func(context.Context, *pynox.Call) (any, error) {
		started <- struct{}{}
		<-release
		return "done", nil
	}
	type ran struct {
		res *pynox.Result
		err error
	}
	runs := make(chan ran, 1)
	go func() {
		res, err := p.Run(ctx, pynox.Job{Functions: []string{"wait"}, Host: host,
			Code: "from pynox_host import wait\nprint(wait())"})
		runs <- ran{res, err}
	}()
	<-started
	shut := make(chan error, 1)
	go func() { shut <- p.Shutdown(ctx) }()
	// New work is refused while the job runs (Shutdown has begun once a
	// Run is refused).
	for {
		_, err := p.Run(ctx, pynox.Job{Code: "print(1)"})
		if err != nil {
			require.ErrorIs(t, err, pynox.ErrClosed)
			break
		}
	}
	close(release)
	r := <-runs
	require.NoError(t, r.err)
	requireOK(t, r.res)
	require.Equal(t, "done\n", r.res.Stdout)
	require.NoError(t, <-shut)
}

// TestExhaustedLocalAndRemote: beyond max_sessions a local Checkout fails
// with ErrExhausted, and a remote checkout's first Feed does (the server
// sees the session then); the session can be opened once one is finished.
func TestExhaustedLocalAndRemote(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandbox(t)
	dir := t.TempDir()
	local := newTestPool(t, pynox.Config{Workers: 1, Dir: dir, MaxSessions: 1})
	conf := filepath.Join(t.TempDir(), "pynox.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[pool]\nmax_sessions = 1\n"), 0o644))
	srv := startRemoteServer(t, dir, "127.0.0.1:0", writeTokenFile(t), "--workers=1", "--config="+conf)
	remote := dialTest(t, srv)
	for name, p := range map[string]*pynox.Pool{"local": local, "remote": remote} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			co, err := p.Checkout(ctx, pynox.Job{})
			require.NoError(t, err)
			ev, err := co.Feed(ctx, pynox.Step{Code: "x = 1"})
			require.NoError(t, err)
			requireOK(t, ev.Result)
			co2, err := p.Checkout(ctx, pynox.Job{})
			if err == nil {
				require.True(t, p.IsRemote())
				_, err = co2.Feed(ctx, pynox.Step{Code: "print(1)"})
				require.ErrorIs(t, err, pynox.ErrExhausted)
				require.NoError(t, co.Finish(ctx))
				ev, err = co2.Feed(ctx, pynox.Step{Code: "print(2)"})
				require.NoError(t, err)
				require.Equal(t, "2\n", ev.Result.Stdout)
				require.NoError(t, co2.Finish(ctx))
				return
			}
			require.ErrorIs(t, err, pynox.ErrExhausted)
			require.NoError(t, co.Finish(ctx))
		})
	}
}

// TestRemoteDialClient: the protocol Client over a server's WebSocket runs
// jobs and session steps, and Close ends the connection.
func TestRemoteDialClient(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandbox(t)
	dir := t.TempDir()
	srv := startRemoteServer(t, dir, "127.0.0.1:0", writeTokenFile(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := DialClient(ctx, srv.URL(), DialOptions{Token: remoteTestToken})
	require.NoError(t, err)
	require.Equal(t, 2, c.Ready().Workers)
	res, err := c.Run(ctx, pynox.Job{ID: "a", Code: "print(6 * 7)"})
	require.NoError(t, err)
	require.Equal(t, "42\n", res.Stdout)
	s := c.Session("nb", pynox.Job{})
	_, err = s.Run(ctx, pynox.Step{Code: "x = 2"})
	require.NoError(t, err)
	res, err = s.Run(ctx, pynox.Step{Code: "print(x * 3)"})
	require.NoError(t, err)
	require.Equal(t, "6\n", res.Stdout)
	require.NoError(t, c.Close())
	_, err = c.Run(ctx, pynox.Job{Code: "print(1)"})
	require.ErrorIs(t, err, ErrClientClosed)
	_, err = DialClient(ctx, srv.URL(), DialOptions{})
	require.ErrorIs(t, err, pynox.ErrDisconnected)
}

// TestRemoteRunCancelled: a Run whose ctx ends cancels its job on the
// server (a cancel request), which counts it as a CancelledError, rather
// than letting it run on for nobody.
func TestRemoteRunCancelled(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	requireSandbox(t)
	dir := t.TempDir()
	srv := startRemoteServer(t, dir, "127.0.0.1:0", writeTokenFile(t), "--workers=1")
	p := dialTest(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	short, stop := context.WithTimeout(ctx, 500*time.Millisecond)
	defer stop()
	_, err := p.Run(short, pynox.Job{Code: "import time\ntime.sleep(30)"})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// The one worker is free again long before the 30 s sleep would end.
	res, err := p.Run(ctx, pynox.Job{Code: "print('next')"})
	require.NoError(t, err)
	require.Equal(t, "next\n", res.Stdout)
	s, err := p.StatsContext(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), s.Errors["CancelledError"], "%+v", s)
}
