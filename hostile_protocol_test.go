package pynox

// Adversarial suite (helpers in hostile_test.go): the control protocol,
// forged frames, results and descriptors.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
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

func TestHostileProtocol(t *testing.T) {
	p := newTestPool(t, Config{Workers: 2})
	fdsBefore := advWarm(t, p)
	var victims []string
	for i := 0; i < 8; i++ {
		victims = append(victims, fmt.Sprintf("real-normal-%d", i))
	}
	victimsJSON, err := json.Marshal(victims)
	require.NoError(t, err)
	type req struct {
		ID   string            `json:"id"`
		Code string            `json:"code"`
		Env  map[string]string `json:"env,omitempty"`
	}
	var lines []string
	add := func(r req) {
		b, err := json.Marshal(r)
		require.NoError(t, err)
		lines = append(lines, string(b))
	}
	want := map[string]string{} // id -> stdout of the honest jobs
	modes := []string{"plain", "huge", "frames", "plain", "huge", "frames"}
	for i, mode := range modes {
		add(req{ID: fmt.Sprintf("real-forger-%d", i), Code: advForger, Env: map[string]string{"VICTIMS": string(victimsJSON), "MODE": mode}})
		// Honest jobs run alongside the forgers.
		for j := i; j < len(victims); j += len(modes) {
			add(req{ID: victims[j], Code: fmt.Sprintf("import time\ntime.sleep(0.05)\nprint(%d * 3)", j)})
			want[victims[j]] = fmt.Sprintf("%d\n", j*3)
		}
	}
	for _, v := range victims[len(modes):] {
		if _, ok := want[v]; !ok {
			j, _ := strconv.Atoi(strings.TrimPrefix(v, "real-normal-"))
			add(req{ID: v, Code: fmt.Sprintf("print(%d * 3)", j)})
			want[v] = fmt.Sprintf("%d\n", j*3)
		}
	}
	for k := 0; k < 6; k++ {
		id := fmt.Sprintf("real-after-%d", k)
		add(req{ID: id, Code: fmt.Sprintf("print('after', %d)", k)})
		want[id] = fmt.Sprintf("after %d\n", k)
	}
	out := serveLines(t, p, strings.Join(lines, "\n")+"\n")

	require.Equal(t, "ready", out[0]["event"])
	seen := map[string]int{}
	for _, l := range out[1:] {
		id := fmt.Sprint(l["id"])
		require.Nil(t, l["event"], "a forged event reached the client: %v", l)
		require.True(t, strings.HasPrefix(id, "real-"), "a forged result reached the client: %v", l)
		seen[id]++
	}
	require.Len(t, seen, len(lines), "every request answered")
	for id, n := range seen {
		require.Equal(t, 1, n, "%s answered %d times", id, n)
	}
	got := byID(t, out)
	for id, stdout := range want {
		r := got[id]
		require.NotNil(t, r, id)
		require.Nil(t, r["error"], "%s: %v", id, r["error"])
		require.Equal(t, json.Number("0"), r["exit"], id)
		require.Equal(t, stdout, r["stdout"], "%s: an honest job's result was tampered with", id)
	}
	for i, mode := range modes {
		id := fmt.Sprintf("real-forger-%d", i)
		r := got[id]
		// A forger may only have lied about itself: it gets its own
		// answer, honest or a PoolWorkerError for breaking its channel.
		if typ := errType(r); typ != "" {
			require.Equal(t, "PoolWorkerError", typ, "%s (%s): %v", id, mode, r["error"])
		}
		t.Logf("%s (%s): exit %v error %q", id, mode, r["exit"], errMessage(r))
	}
	// Descriptors a job sent over its channel never land in the host.
	require.Eventually(t, func() bool { return advFDs(t) == fdsBefore }, 5*time.Second, 20*time.Millisecond,
		"the host holds %d descriptors, %d before", advFDs(t), fdsBefore)
	advServes(t, p)
	st := p.Stats()
	require.Equal(t, int64(p.Workers()+len(lines)+1), st.Jobs, "warm-up, the stream, the control job")
	require.Equal(t, st.Jobs, st.OK+st.Failed+st.Timeouts+st.Signals+st.RequestErrors+st.WorkerErrors)
}

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
