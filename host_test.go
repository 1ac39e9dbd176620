package pynox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHostFunctionsGoAPI(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	var calls atomic.Int64
	waitEnded := make(chan struct{}, 1)
	host := func(ctx context.Context, c *Call) (any, error) {
		calls.Add(1)
		switch c.Function {
		case "echo":
			return json.RawMessage(c.Args), nil
		case "big":
			return strings.Repeat("x", MaxCallBytes+10), nil
		case "bad":
			return func() {}, nil
		case "boom":
			return nil, errors.New("it broke")
		case "wait":
			<-ctx.Done()
			waitEnded <- struct{}{}
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("unexpected %s", c.Function)
	}
	fns := []string{"echo", "big", "bad", "boom", "wait"}

	res := run(t, p, Job{Functions: fns, Host: host, Code: "from pynox_host import echo\nprint(echo(1, 'two', [3], {'four': None}))"})
	requireOK(t, res)
	require.Equal(t, "[1, 'two', [3], {'four': None}]\n", res.Stdout)

	res = run(t, p, Job{Functions: fns, Host: host, Code: "from pynox_host import big, bad, boom, HostError\n" +
		"for f in (big, bad, boom):\n    try:\n        f()\n    except HostError as e:\n        print(f.__name__, str(e)[:60])"})
	requireOK(t, res)
	require.Contains(t, res.Stdout, "big the host's result could not be passed on: the result is")
	require.Contains(t, res.Stdout, "bad the host's result could not be passed on: json: unsupport")
	require.Contains(t, res.Stdout, "boom it broke\n")

	// Arguments must be JSON, and at most 1 MiB of it.
	res = run(t, p, Job{Functions: fns, Host: host, Code: "from pynox_host import echo\n" +
		"for a in (object(), float('nan'), 'x' * (1 << 20)):\n    try:\n        echo(a)\n    except (TypeError, ValueError) as e:\n        print(type(e).__name__)"})
	requireOK(t, res)
	require.Equal(t, "TypeError\nTypeError\nValueError\n", res.Stdout)

	// A forged oversized call (bypassing the runner's check) is refused by
	// the pool, and the job carries on.
	before := calls.Load()
	res = run(t, p, Job{Functions: fns, Host: host, Code: "import json, os, struct\n" +
		"b = json.dumps({'t': 'call', 'step': 1, 'function': 'echo', 'args': ['y' * (1 << 20)], 'kwargs': {}}).encode()\n" +
		"os.write(3, struct.pack('<I', len(b)))\nos.write(4, b'!')\nos.write(3, b)\nos.write(4, b'!')\n" +
		"n = struct.unpack('<I', os.read(3, 4))[0]\nprint(json.loads(os.read(3, n)).get('error', '')[:40])"})
	requireOK(t, res)
	require.Contains(t, res.Stdout, "the arguments are 104858")
	require.Equal(t, before, calls.Load(), "the host never saw it")

	// Each job may make MaxCalls calls; the next raises HostError.
	res = run(t, p, Job{Functions: fns, Host: host, Code: "from pynox_host import echo, HostError\n" +
		"n = 0\ntry:\n    while True:\n        echo(n)\n        n += 1\nexcept HostError as e:\n    print(n, e)"})
	requireOK(t, res)
	require.Equal(t, fmt.Sprintf("%d this job made more than %d host calls\n", MaxCalls, MaxCalls), res.Stdout)

	// Calls from several threads take turns.
	res = run(t, p, Job{Functions: fns, Host: host, Code: "from pynox_host import echo\nimport threading\n" +
		"out = []\ndef w(i):\n    for j in range(20):\n        out.append(echo(i, j) == [i, j])\n" +
		"ts = [threading.Thread(target=w, args=(i,)) for i in range(4)]\n[t.start() for t in ts]\n[t.join() for t in ts]\nprint(len(out), all(out))"})
	requireOK(t, res)
	require.Equal(t, "80 True\n", res.Stdout)

	// The host's wait counts against the timeout, and its ctx ends.
	res = run(t, p, Job{Functions: fns, Host: host, Timeout: 300 * time.Millisecond, Code: "from pynox_host import wait\nwait()"})
	requireErrorType(t, res, "TimeoutError")
	select {
	case <-waitEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the host function's ctx did not end with the job")
	}

	// Declared functions need a Host.
	res = run(t, p, Job{Functions: []string{"x"}, Code: "1"})
	requireErrorType(t, res, "RequestError")
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
}
