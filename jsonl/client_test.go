package jsonl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox"
)

// startClient serves p in-process over pipes and returns a client of it;
// the test's end closes the client and checks that Serve returned nil.
func startClient(t *testing.T, p *pynox.Pool) *Client {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	served := make(chan error, 1)
	go func() {
		err := Serve(context.Background(), p, inR, outW)
		outW.Close()
		served <- err
	}()
	c, err := NewClient(outR, inW)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, c.Close())
		require.NoError(t, <-served)
	})
	return c
}

func TestClientRunsJobsConcurrently(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 2})
	c := startClient(t, p)
	require.Equal(t, 2, c.Ready().Workers)
	ctx := context.Background()

	// Concurrent jobs, each with host calls answered by its own Host,
	// answered in completion order and routed by id.
	const n = 12
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			host := func(_ context.Context, call *pynox.Call) (any, error) {
				var args []int
				if err := json.Unmarshal(call.Args, &args); err != nil {
					return nil, err
				}
				return args[0] * i, nil
			}
			res, err := c.Run(ctx, pynox.Job{ID: i, Code: "from pynox_host import times\nprint(times(10))",
				Functions: []string{"times"}, Host: host, Timeout: 30 * time.Second})
			if err != nil {
				errs <- err
				return
			}
			if res.ID != i || res.Error != nil || res.Stdout != fmt.Sprintf("%d\n", 10*i) || res.Calls != 1 {
				errs <- fmt.Errorf("job %d: %+v", i, res)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// A refused request is a result with a RequestError, as from Pool.Run.
	res, err := c.Run(ctx, pynox.Job{ID: "bad", Code: "1", Timeout: time.Hour})
	require.NoError(t, err)
	require.Equal(t, "bad", res.ID)
	require.ErrorIs(t, res.Err(), pynox.ErrRequest)
	require.Contains(t, res.Error.Message, "timeout")

	// Host errors and panics reach the job as HostError.
	res, err = c.Run(ctx, pynox.Job{Code: "from pynox_host import f, HostError\n" +
		"for _ in range(2):\n    try:\n        f()\n    except HostError as e:\n        print(e)",
		Functions: []string{"f"}, Host: func(_ context.Context, call *pynox.Call) (any, error) {
			if call.ID%2 == 0 {
				panic("secret detail")
			}
			return nil, errors.New("no f today")
		}})
	require.NoError(t, err)
	requireOK(t, res)
	require.Contains(t, res.Stdout, "no f today")
	require.Contains(t, res.Stdout, "the host function failed")
	require.NotContains(t, res.Stdout, "secret detail")

	// A job declaring functions without a Host gets an error per call.
	res, err = c.Run(ctx, pynox.Job{Code: "from pynox_host import g\ng()", Functions: []string{"g"}})
	require.NoError(t, err)
	require.Equal(t, "HostError", res.Error.Type, res.Stderr)

	st, err := c.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(n+3), st.Jobs)
	require.Equal(t, int64(1), st.RequestErrors)

	// A caller that stops waiting gets ctx.Err(); the client goes on.
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = c.Run(cctx, pynox.Job{Code: "import time\ntime.sleep(2)"})
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	res, err = c.Run(ctx, pynox.Job{Code: "print('after')"})
	require.NoError(t, err)
	require.Equal(t, "after\n", res.Stdout)
}

func TestClientSessions(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	dir := p.Config().Dir
	require.NoError(t, os.Mkdir(filepath.Join(dir, "data"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "f.txt"), []byte("granted"), 0o644))
	c := startClient(t, p)
	ctx := context.Background()

	s := c.Session("nb", pynox.Job{AllowRead: []string{"data"}, Functions: []string{"add"},
		Host: func(_ context.Context, call *pynox.Call) (any, error) {
			var a []int
			if err := json.Unmarshal(call.Args, &a); err != nil {
				return nil, err
			}
			return a[0] + a[1], nil
		}})
	require.NoError(t, s.Close(ctx), "nothing to close yet")
	read := "print(open('data/f.txt').read())"
	r, err := s.Run(ctx, pynox.Step{ID: 1, Code: "from pynox_host import add\nx = add(2, 3)\n" + read})
	require.NoError(t, err)
	requireOK(t, r)
	require.Equal(t, 1, r.ID)
	require.Equal(t, "nb", r.Session)
	require.Equal(t, "granted\n", r.Stdout)
	r, err = s.Run(ctx, pynox.Step{ID: 2, Code: "print(x)"})
	require.NoError(t, err)
	requireOK(t, r)
	require.Equal(t, "5\n", r.Stdout)
	require.Equal(t, 2, r.Step)

	// A step that ends the process: the next one starts a new process with
	// the session's permissions.
	r, err = s.Run(ctx, pynox.Step{Code: "raise SystemExit(3)"})
	require.NoError(t, err)
	require.True(t, r.SessionEnded)
	r, err = s.Run(ctx, pynox.Step{Code: "print('x' in globals())\n" + read})
	require.NoError(t, err)
	requireOK(t, r)
	require.Equal(t, "False\ngranted\n", r.Stdout)
	require.Equal(t, 1, r.Step)

	require.NoError(t, s.Close(ctx))
	require.Eventually(t, func() bool { return p.Stats().SessionsActive == 0 }, 10*time.Second, 20*time.Millisecond)
	// Closed, the name starts afresh, with the permissions again.
	r, err = s.Run(ctx, pynox.Step{Code: read})
	require.NoError(t, err)
	requireOK(t, r)
	require.NoError(t, s.Close(ctx))
}

// fakeServer is the other end of a client, driven line by line by a test
// that forges what a server writes.
type fakeServer struct {
	out  *io.PipeWriter // what the client reads
	in   *bufio.Scanner // what the client writes
	inW  *io.PipeWriter
	outR *io.PipeReader
}

func newFakeServer(t *testing.T) (*fakeServer, *Client) {
	t.Helper()
	outR, outW := io.Pipe()
	inR, inW := io.Pipe()
	f := &fakeServer{out: outW, in: bufio.NewScanner(inR), inW: inW, outR: outR}
	go io.WriteString(outW, `{"event":"ready","workers":1,"runtime":"pynox"}`+"\n")
	c, err := NewClient(outR, inW)
	require.NoError(t, err)
	return f, c
}

func (f *fakeServer) write(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(f.out, line+"\n")
	require.NoError(t, err)
}

// request reads the next line the client wrote.
func (f *fakeServer) request(t *testing.T) map[string]any {
	t.Helper()
	require.True(t, f.in.Scan(), "the client wrote no more lines")
	var m map[string]any
	require.NoError(t, json.Unmarshal(f.in.Bytes(), &m), f.in.Text())
	return m
}

// The client survives lines it cannot use, as the Python client does: a
// call event it cannot decode is answered with an error, a result it
// cannot decode fails its request only, anything else is skipped.
func TestClientSurvivesBadLines(t *testing.T) {
	f, c := newFakeServer(t)
	ctx := context.Background()
	type answer struct {
		res *pynox.Result
		err error
	}
	runAsync := func(job pynox.Job) (chan answer, string) {
		ch := make(chan answer, 1)
		go func() {
			res, err := c.Run(ctx, job)
			ch <- answer{res, err}
		}()
		req := f.request(t)
		return ch, req["id"].(string)
	}

	first, id1 := runAsync(pynox.Job{ID: "one", Code: "1", Functions: []string{"f"},
		Host: func(context.Context, *pynox.Call) (any, error) { return "ok", nil }})
	for _, junk := range []string{
		"not json at all",
		`[1, 2, 3]`,
		`{"id": "go-999", "exit": 0}`, // an id nobody waits for
		`{"event": "call", "id": "` + id1 + `", "call_id": 7, "function": "f", "args": [1], "kwargs": {}` + "\x00garbage",
		`{"event":"call","id":"` + id1 + `","call_id":8,"function":"f","args":[1,` + "\xff",
		`{"id":null,"call_id":3,"exit":-1,"error":{"type":"RequestError","message":"late reply"}}`,
		`{"event": "ready"}`,
	} {
		f.write(t, junk)
	}
	// The unreadable call with the server's field order is answered with
	// an error naming what went wrong.
	reply := f.request(t)["reply"].(map[string]any)
	require.Equal(t, float64(8), reply["call_id"])
	require.Contains(t, reply["error"], "could not read the call")
	require.NotContains(t, reply, "result")
	// A readable call is answered by the job's Host.
	f.write(t, `{"event":"call","id":"`+id1+`","call_id":9,"function":"f","args":[],"kwargs":{}}`)
	reply = f.request(t)["reply"].(map[string]any)
	require.Equal(t, float64(9), reply["call_id"])
	require.Equal(t, "ok", reply["result"])
	require.NotContains(t, reply, "error")

	// An unreadable result fails its own request, not the next.
	second, id2 := runAsync(pynox.Job{ID: "two", Code: "2"})
	f.write(t, `{"id":"`+id2+`","exit":0,"stdout":"`+"\xff\xfe"+`,`)
	a := <-second
	require.Error(t, a.err)
	require.Contains(t, a.err.Error(), "unreadable")
	f.write(t, `{"id":"`+id1+`","exit":0,"stdout":"fine\n","stderr":"","error":null}`)
	a = <-first
	require.NoError(t, a.err)
	require.Equal(t, "one", a.res.ID)
	require.Equal(t, "fine\n", a.res.Stdout)

	// The end of the output fails waiting and later calls.
	third, _ := runAsync(pynox.Job{Code: "3"})
	f.out.Close()
	a = <-third
	require.ErrorIs(t, a.err, ErrClientClosed)
	_, err := c.Run(ctx, pynox.Job{Code: "4"})
	require.ErrorIs(t, err, ErrClientClosed)
	go io.Copy(io.Discard, f.outR)
	require.NoError(t, c.Close())
}

func TestClientNeedsReady(t *testing.T) {
	outR, outW := io.Pipe()
	go func() {
		io.WriteString(outW, `{"id": 1, "exit": 0}`+"\n")
		outW.Close()
	}()
	_, err := NewClient(outR, io.Discard)
	require.ErrorContains(t, err, "not a ready event")
}
