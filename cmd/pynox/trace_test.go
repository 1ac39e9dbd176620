package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/testenv"
)

// otlpReceiver is an OTLP/HTTP traces receiver: it keeps every request's
// raw body and decoded spans.
type otlpReceiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies [][]byte
	spans  []*tracepb.Span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
			http.Error(w, "not here", http.StatusNotFound)
			return
		}
		var rd io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			rd = gz
		}
		body, err := io.ReadAll(rd)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var msg collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.bodies = append(r.bodies, body)
		for _, rs := range msg.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Write(b)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// otlpAttrs maps an OTLP span's string and integer attributes by key,
// as text.
func otlpAttrs(s *tracepb.Span) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes {
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = strconv.FormatInt(v.IntValue, 10)
		}
	}
	return m
}

// envWithout is the test's environment without the OTEL_ variables, plus
// extra.
func envWithout(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// endPool closes the pool's input and waits for it to exit 0.
func endPool(t *testing.T, p *poolProc) {
	t.Helper()
	require.NoError(t, p.stdin.Close())
	require.NoError(t, p.cmd.Wait(), "stderr: %s", p.stderr.String())
}

// `pynox pool` with OTEL_EXPORTER_OTLP_ENDPOINT exports its spans over
// OTLP/HTTP to that endpoint, through its own Landlock domain, which
// denies TCP but for the endpoint's port (a job still cannot connect
// there): a job's span and a session step's carry the traceparent's trace
// id and parent span id and the request's id, the export flushes at exit,
// and nothing of the code or the output is in what was sent. The JSON log
// line carries the trace id.
func TestPoolExportsTraces(t *testing.T) {
	t.Parallel()
	recv := newOTLPReceiver(t)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(recv.srv.URL, "http://"))
	require.NoError(t, err)
	cmd := exec.Command(pynoxBinary(t), "pool", "--workers=1", "--log=json")
	cmd.Dir = t.TempDir()
	cmd.Env = envWithout("OTEL_EXPORTER_OTLP_ENDPOINT="+recv.srv.URL, "OTEL_BSP_SCHEDULE_DELAY=100")
	p := startPoolCmd(t, cmd)

	sc := p.ready["self_confinement"].(map[string]any)
	if abi, _ := sandbox.ABI(); abi >= 4 {
		require.Equal(t, "deny", sc["tcp"], "ready: %v", p.ready)
		portNum, err := strconv.Atoi(port)
		require.NoError(t, err)
		require.Equal(t, []any{float64(portNum)}, sc["tcp_connect"], "ready: %v", p.ready)
	}

	const secretCode, secretOut = "SECRET_CODE_b16b", "SECRET_OUT_00d5"
	p.send(t, `{"id":"j1","code":"# `+secretCode+`\nprint('`+secretOut+`')","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`)
	res := p.next(t)
	require.Equal(t, "j1", res["id"])
	require.Nil(t, res["error"], "result: %v", res)
	p.send(t, `{"id":"s1","session":"a","code":"x = '`+secretOut+`'","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`)
	res = p.next(t)
	require.Equal(t, "s1", res["id"])
	require.Nil(t, res["error"], "result: %v", res)
	// A job cannot reach the exporter's port: its own domain (and
	// seccomp) deny every TCP connect.
	p.send(t, `{"id":"probe","code":"import socket\ntry:\n    socket.create_connection(('127.0.0.1', `+port+`), timeout=5)\n    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)"}`)
	res = p.next(t)
	require.Equal(t, "probe", res["id"])
	require.NotContains(t, res["stdout"], "connected")
	endPool(t, p)

	recv.mu.Lock()
	defer recv.mu.Unlock()
	require.NotEmpty(t, recv.spans, "no span reached the receiver; stderr: %s", p.stderr.String())
	byID := map[string]*tracepb.Span{}
	for _, s := range recv.spans {
		byID[otlpAttrs(s)["pynox.id"]] = s
	}
	j1 := byID["j1"]
	require.NotNil(t, j1, "spans: %v", recv.spans)
	require.Equal(t, "pynox.job", j1.Name)
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", hex.EncodeToString(j1.TraceId))
	require.Equal(t, "00f067aa0ba902b7", hex.EncodeToString(j1.ParentSpanId))
	require.Equal(t, "ok", otlpAttrs(j1)["pynox.outcome"])
	require.Equal(t, "0", otlpAttrs(j1)["pynox.exit_code"])
	s1 := byID["s1"]
	require.NotNil(t, s1)
	require.Equal(t, "pynox.session.step", s1.Name)
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", hex.EncodeToString(s1.TraceId))
	require.Equal(t, "b7ad6b7169203331", hex.EncodeToString(s1.ParentSpanId))
	require.Equal(t, "a", otlpAttrs(s1)["pynox.session"])
	require.Equal(t, "1", otlpAttrs(s1)["pynox.step"])
	for _, b := range recv.bodies {
		require.False(t, bytes.Contains(b, []byte(secretCode)), "the code was exported")
		require.False(t, bytes.Contains(b, []byte(secretOut)), "the output was exported")
	}
	require.Contains(t, p.stderr.String(), `"id":"j1"`)
	for _, line := range strings.Split(p.stderr.String(), "\n") {
		if strings.Contains(line, `"id":"j1"`) {
			require.Contains(t, line, `"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"`)
		}
	}
}

// Without OTEL_EXPORTER_OTLP_ENDPOINT (or with OTEL_SDK_DISABLED=true) the
// pool makes no exporter: nothing connects to the OTLP default port
// 4318 nor to a configured endpoint, even at exit, where an exporter
// would flush its spans, and a traceparent's trace id still reaches the
// log line.
func TestPoolWithoutExporterConnectsNowhere(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	var conns sync.WaitGroup
	var mu sync.Mutex
	accepted := 0
	// The exporter's default endpoint is localhost:4318, which may
	// resolve to either loopback address.
	var lns []net.Listener
	for _, addr := range []string{"127.0.0.1:4318", "[::1]:4318"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			if addr == "[::1]:4318" && !strings.Contains(err.Error(), "in use") {
				continue // no IPv6 loopback here
			}
			t.Skipf("the OTLP/HTTP default port is taken: %v", err)
		}
		defer ln.Close()
		lns = append(lns, ln)
		conns.Add(1)
		go func() {
			defer conns.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				accepted++
				mu.Unlock()
				c.Close()
			}
		}()
	}
	recv := newOTLPReceiver(t)
	for name, env := range map[string][]string{
		"no endpoint":  envWithout("OTEL_SERVICE_NAME=x", "OTEL_BSP_SCHEDULE_DELAY=100"),
		"sdk disabled": envWithout("OTEL_EXPORTER_OTLP_ENDPOINT="+recv.srv.URL, "OTEL_SDK_DISABLED=true", "OTEL_BSP_SCHEDULE_DELAY=100"),
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(pynoxBinary(t), "pool", "--workers=1", "--log=json")
			cmd.Dir = t.TempDir()
			cmd.Env = env
			p := startPoolCmd(t, cmd)
			_, has := p.ready["self_confinement"].(map[string]any)["tcp_connect"]
			require.False(t, has, "no exporter, no port: %v", p.ready)
			p.send(t, `{"id":"j","code":"print(1)","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`)
			res := p.next(t)
			require.Nil(t, res["error"], "result: %v", res)
			endPool(t, p)
			require.Contains(t, p.stderr.String(), `"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"`)
		})
	}
	for _, ln := range lns {
		ln.Close()
	}
	conns.Wait()
	require.Zero(t, accepted, "something connected to the OTLP default port")
	recv.mu.Lock()
	defer recv.mu.Unlock()
	require.Empty(t, recv.bodies, "a disabled SDK exported")
}

// A malformed OTLP endpoint stops `pynox pool` at start with a message
// naming the variable.
func TestPoolBadOTLPEndpoint(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(pynoxBinary(t), "pool", "--workers=1")
	cmd.Dir = t.TempDir()
	cmd.Env = envWithout("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=localhost:4318")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdin = strings.NewReader("")
	err := cmd.Run()
	require.Error(t, err)
	require.Contains(t, stderr.String(), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	require.Contains(t, stderr.String(), "expected an http:// or https:// URL")
}

// `pynox serve` exports the spans of POST /v1/run and of a WebSocket
// session's steps, each under its request's traceparent, and flushes them
// when SIGTERM ends it.
func TestServeExportsTraces(t *testing.T) {
	t.Parallel()
	recv := newOTLPReceiver(t)
	cmd := exec.Command(pynoxBinary(t), "serve", "--listen=127.0.0.1:0", "--workers=1", "--python="+testenv.Python())
	cmd.Dir = t.TempDir()
	cmd.Env = envWithout("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="+recv.srv.URL+"/v1/traces", "OTEL_BSP_SCHEDULE_DELAY=100")
	pipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	s := &serveProc{cmd: cmd, stderr: &syncBuffer{}}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			fmt.Fprintln(s.stderr, sc.Text())
			if a, ok := strings.CutPrefix(sc.Text(), "pynox serve: listening on "); ok {
				addr <- a
			}
		}
		close(addr)
	}()
	a, ok := <-addr
	require.True(t, ok, "no address; stderr: %s", s.stderr.String())
	s.base = a

	code, body := s.do(t, "POST", "/v1/run", "", `{"id":"r1","code":"print(1)","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`)
	require.Equal(t, 200, code, body)
	require.NotContains(t, body, "RequestError")
	ws, _, err := dialPool(t, s, "")
	require.NoError(t, err)
	ws.send(t, `{"id":"s1","session":"a","code":"x = 1","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`)
	r := ws.next(t)
	require.Equal(t, "s1", r["id"])
	require.Nil(t, r["error"], "%v", r)
	ws.c.CloseNow()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "stderr: %s", s.stderr.String())

	recv.mu.Lock()
	defer recv.mu.Unlock()
	byID := map[string]*tracepb.Span{}
	for _, sp := range recv.spans {
		byID[otlpAttrs(sp)["pynox.id"]] = sp
	}
	require.NotNil(t, byID["r1"], "spans: %v; stderr: %s", recv.spans, s.stderr.String())
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", hex.EncodeToString(byID["r1"].TraceId))
	require.Equal(t, "00f067aa0ba902b7", hex.EncodeToString(byID["r1"].ParentSpanId))
	require.NotNil(t, byID["s1"])
	require.Equal(t, "pynox.session.step", byID["s1"].Name)
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", hex.EncodeToString(byID["s1"].TraceId))
	require.Equal(t, "b7ad6b7169203331", hex.EncodeToString(byID["s1"].ParentSpanId))
}
