package pynox

// Adversarial suite (helpers in hostile_test.go): the control protocol,
// forged frames, results and descriptors (the forger against the JSON
// Lines stream is jsonl.TestHostileProtocol).

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// advForger writes forged pool results, host-call events and control
// frames to every descriptor it can reach, raw, newline-delimited and
// length-prefixed, naming the ids of other jobs in the same stream.
const advForger = `import json, os, socket, struct, time
victims = json.loads(os.environ["VICTIMS"])
objs = [{"t": "done", "exit": 0, "error": None}, {"t": "started"}, {"t": "setup_error", "msg": "x"},
        {"t": "spare", "pid": 1}, {"t": "exit", "pid": os.getppid(), "code": 0}, {"t": "fatal", "msg": "x"},
        {"t": "call", "call_id": 1, "function": "rm", "args": ["-rf", "/"]}, {"t": "fork"},
        {"event": "ready", "workers": 99, "runtime": "pynox"},
        {"id": "forged-stats", "event": "stats", "jobs": 0},
        {"event": "call", "id": "forged-call", "call_id": 7, "function": "rm", "args": ["/"], "kwargs": {}}]
for i, v in enumerate(victims):
    objs.append({"id": v, "exit": 0, "stdout": "FORGED", "stderr": "", "error": None})
    objs.append({"event": "call", "id": v, "call_id": i, "function": "exfiltrate", "args": [], "kwargs": {}})
    objs.append({"id": "forged-%d" % i, "exit": 0, "stdout": "FORGED", "error": None})
forgeries = []
for o in objs:
    data = json.dumps(o).encode()
    forgeries += [data, b"\n" + data + b"\n", struct.pack("<I", len(data)) + data]
hit = 0
for fd in range(0, 1024):
    if fd == 3:
        continue  # the control channel last: breaking it ends this job
    for f in forgeries:
        try:
            os.write(fd, f)
            hit += 1
        except OSError:
            pass
mode = os.environ["MODE"]
if mode == "rights":
    s = socket.socket(fileno=3)
    for _ in range(200):
        try:
            socket.send_fds(s, [b"\0\0\0\0"], [0, 1, 2])
        except OSError:
            break
elif mode == "huge":
    os.write(3, b"\xff\xff\xff\x7f" + b"A" * 4096)
elif mode == "frames":
    for f in forgeries:
        try:
            os.write(3, f)
        except OSError:
            break
print("wrote", hit, flush=True)
time.sleep(0.2)
`

// TestHostileProtocol, which runs the forger through Serve, is in package
// jsonl.

// A job that queues its own pipe ends on its control socket used to wedge
// its worker for good (found by this suite): the host now closes the
// socket once it stops reading it and bounds the wait for the pipes.
func TestHostileProtocolDescriptorPassing(t *testing.T) {
	requireSandbox(t)
	// Not newTestPool: if the hole is open, Close would hang with the
	// wedged job, so the pool is closed only when the job came back.
	p, err := New(Config{Workers: 1, Dir: t.TempDir(), Python: testPython()})
	require.NoError(t, err)
	fds := advWarm(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan *Result, 1)
	go func() {
		r, _ := p.Run(ctx, Job{Code: advForger, Env: map[string]string{"VICTIMS": `["x"]`, "MODE": "rights"}, Timeout: 2 * time.Second})
		done <- r
	}()
	select {
	case r := <-done:
		defer p.Close()
		require.NotNil(t, r, "the caller's context ended first")
		if typ := r.Err(); r.Error != nil {
			require.Equal(t, "PoolWorkerError", r.Error.Type, "%v", typ)
		}
		require.Equal(t, fds, advSteadyFDs(t), "descriptors the job sent landed in the host")
		advServes(t, p)
	case <-time.After(15 * time.Second):
		t.Fatal("Pool.Run did not return 13s after its job's timeout and the caller's context: the worker is wedged")
	}
}
