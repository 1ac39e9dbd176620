package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// scrape gets /metrics with an optional token and parses the answer with
// Prometheus' own text parser.
func scrape(t *testing.T, s *serveProc, token string) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequest("GET", s.base+"/metrics", nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, string(body))
	require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4"), resp.Header.Get("Content-Type"))
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(t, err, "%s", body)
	for name, mf := range fams {
		require.NotEmpty(t, mf.GetHelp(), "%s has no HELP", name)
	}
	return fams
}

// sampleValue returns the value (a histogram's count) of the series of
// the family whose labels include want, summed over the matching series.
func sampleValue(mf *dto.MetricFamily, want map[string]string) float64 {
	var sum float64
next:
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

// TestServeMetrics runs a known mix of real jobs through a real `pynox
// serve` (successes, a ZeroDivisionError, a timeout, a refused request,
// a host call answered over the WebSocket, a session of two steps) and
// scrapes GET /metrics: it needs a token like /v1/*, parses with
// Prometheus' text parser, and its counters match the stats event.
func TestServeMetrics(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	dir := t.TempDir()
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("tok-m\n"), 0o600))
	s := startServe(t, dir, "--token-file="+tokens, "--workers=1")

	for _, tok := range []string{"", "tok-x", "tok-mm"} {
		code, body := s.do(t, "GET", "/metrics", tok, "")
		require.Equal(t, 401, code, "token %q: %s", tok, body)
		require.NotContains(t, body, "pynox_")
	}
	req, _ := http.NewRequest("GET", s.base+"/metrics", nil)
	req.Header.Set("Authorization", "Basic tok-m")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 401, resp.StatusCode, "not a bearer token")

	fams := scrape(t, s, "tok-m")
	require.Equal(t, 0.0, sampleValue(fams["pynox_serve_websocket_connections"], nil))
	require.Equal(t, 1.0, sampleValue(fams["pynox_workers"], nil))

	ws, _, err := dialPool(t, s, "tok-m")
	require.NoError(t, err)
	ask := func(line string) map[string]any {
		t.Helper()
		ws.send(t, line)
		for {
			m := ws.next(t)
			if m["event"] == "call" {
				ws.send(t, fmt.Sprintf(`{"reply": {"call_id": %v, "result": 5}}`, m["call_id"]))
				continue
			}
			return m
		}
	}
	require.Equal(t, "1\n", ask(`{"id": 1, "code": "print(1)"}`)["stdout"])
	require.Nil(t, ask(`{"id": 2, "code": "x = 2"}`)["error"])
	require.Equal(t, "ZeroDivisionError", ask(`{"id": 3, "code": "1/0"}`)["error"].(map[string]any)["type"])
	require.Equal(t, "TimeoutError", ask(`{"id": 4, "code": "while True: pass", "timeout": "300ms"}`)["error"].(map[string]any)["type"])
	require.Equal(t, "RequestError", ask(`{"id": 5, "code": 5}`)["error"].(map[string]any)["type"])
	require.Equal(t, "5\n", ask(`{"id": 6, "functions": ["add"], "code": "from pynox_host import add\nprint(add(2, 3))"}`)["stdout"])
	require.Nil(t, ask(`{"id": 7, "session": "nb", "code": "x = 41"}`)["error"])
	require.Equal(t, "42\n", ask(`{"id": 8, "session": "nb", "code": "print(x + 1)"}`)["stdout"])
	code, body := s.do(t, "POST", "/v1/run", "tok-m", `{"id": 9, "code": "print(3)"}`)
	require.Equal(t, 200, code, body)
	st := ask(`{"id": "st", "stats": true}`)
	require.Equal(t, "stats", st["event"])

	fams = scrape(t, s, "tok-m")
	num := func(k string) float64 { return st[k].(float64) }
	jobs := fams["pynox_jobs_total"]
	require.Equal(t, 9.0, num("jobs"))
	require.Equal(t, num("jobs"), sampleValue(jobs, nil))
	for outcome, field := range map[string]string{"ok": "ok", "failed": "failed", "timeout": "timeouts",
		"signal": "signals", "request_error": "request_errors", "worker_error": "worker_errors", "cancelled": "cancelled"} {
		require.Equal(t, num(field), sampleValue(jobs, map[string]string{"outcome": outcome}), outcome)
	}
	for typ, n := range st["errors"].(map[string]any) {
		require.Equal(t, n.(float64), sampleValue(jobs, map[string]string{"error_type": typ}), typ)
	}
	for _, c := range []struct {
		outcome, typ string
		want         float64
	}{
		{"ok", "none", 6}, {"failed", "ZeroDivisionError", 1}, {"timeout", "TimeoutError", 1}, {"request_error", "RequestError", 1},
	} {
		require.Equal(t, c.want, sampleValue(jobs, map[string]string{"outcome": c.outcome, "error_type": c.typ}), "%+v", c)
	}
	require.Equal(t, num("jobs")-num("request_errors"), sampleValue(fams["pynox_job_duration_seconds"], nil))
	require.InDelta(t, num("duration_ms_total"), fams["pynox_job_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleSum()*1000, 0.5*num("jobs"))
	require.InDelta(t, num("queue_us_total"), fams["pynox_job_queue_seconds"].GetMetric()[0].GetHistogram().GetSampleSum()*1e6, 1e-3*num("jobs"))
	require.InDelta(t, num("cpu_ms_total"), sampleValue(fams["pynox_job_cpu_seconds_total"], nil)*1000, 1e-6)
	for name, want := range map[string]float64{
		"pynox_sessions_active":             num("sessions_active"),
		"pynox_session_steps_total":         2,
		"pynox_host_calls_total":            1,
		"pynox_host_call_duration_seconds":  1,
		"pynox_serve_websocket_connections": 1,
		"pynox_templates_up":                1,
		"pynox_workers_busy":                0,
		"pynox_jobs_queued":                 0,
	} {
		require.Contains(t, fams, name)
		require.Equal(t, want, sampleValue(fams[name], nil), name)
	}
	require.Equal(t, 1.0, num("sessions_active"))
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		require.Contains(t, fams, name)
	}

	// The connection's end ends its session, and is counted.
	require.NoError(t, ws.c.CloseNow())
	require.Eventually(t, func() bool {
		fams := scrape(t, s, "tok-m")
		return sampleValue(fams["pynox_serve_websocket_connections"], nil) == 0 &&
			sampleValue(fams["pynox_sessions_active"], nil) == 0
	}, time.Minute, 20*time.Millisecond)
}

// TestServeMetricsWithoutTokens: a server without a token file (loopback
// only) serves /metrics without a token, but, as /v1/*, not to a request
// for another Host (DNS rebinding) or from another Origin.
func TestServeMetricsWithoutTokens(t *testing.T) {
	t.Parallel()
	s := startServe(t, t.TempDir(), "--workers=1")
	fams := scrape(t, s, "")
	require.Contains(t, fams, "pynox_jobs_queued")
	port := s.base[strings.LastIndex(s.base, ":")+1:]
	for _, h := range []struct{ host, origin string }{{"evil.example:" + port, ""}, {"", "http://evil.example"}} {
		req, err := http.NewRequest("GET", s.base+"/metrics", nil)
		require.NoError(t, err)
		if h.host != "" {
			req.Host = h.host
		}
		if h.origin != "" {
			req.Header.Set("Origin", h.origin)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 403, resp.StatusCode, "%+v: %s", h, b)
		require.NotContains(t, string(b), "pynox_")
	}
}

// TestServeMetricsWhileDraining: after SIGTERM, /readyz and /v1/* answer
// 503 but /metrics still answers, showing the job the drain waits for.
func TestServeMetricsWhileDraining(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	dir := t.TempDir()
	s := startServe(t, dir, "--workers=1", "--allow-write="+dir)
	ws, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	mark, release := filepath.Join(dir, "started"), filepath.Join(dir, "release")
	ws.send(t, startedJob(t, "job", mark, "import os, time\nwhile not os.path.exists("+string(mustJSON(t, release))+"): time.sleep(0.01)\nprint('job done')"))
	awaitMarkFile(t, mark)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { code, _ := s.do(t, "GET", "/readyz", "", ""); return code == 503 },
		time.Minute, 5*time.Millisecond)
	code, _ := s.do(t, "POST", "/v1/run", "", `{"id": 1, "code": "1"}`)
	require.Equal(t, 503, code)
	fams := scrape(t, s, "")
	require.Equal(t, 1.0, sampleValue(fams["pynox_workers_busy"], nil))
	require.Equal(t, 1.0, sampleValue(fams["pynox_serve_websocket_connections"], nil))
	require.NoError(t, os.WriteFile(release, nil, 0o600))
	require.Equal(t, "job done\n", ws.next(t)["stdout"])
	require.NoError(t, s.cmd.Wait(), "stderr: %s", s.stderr.String())
}
