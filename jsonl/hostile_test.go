package jsonl

import (
	"encoding/json"
	"fmt"
	"github.com/pynox/pynox/internal/probes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

func TestHostileProtocol(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 2})
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
		add(req{ID: fmt.Sprintf("real-forger-%d", i), Code: probes.Forger, Env: map[string]string{"VICTIMS": string(victimsJSON), "MODE": mode}})
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
	require.Equal(t, st.Jobs, st.OK+st.Failed+st.Timeouts+st.Signals+st.RequestErrors+st.WorkerErrors+st.Cancelled)
}
