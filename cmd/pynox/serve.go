package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/worker"
	"github.com/pynox/pynox/jsonl"
	"github.com/pynox/pynox/mcpserver"
)

// serveUsage is `pynox serve --help`.
const serveUsage = `Usage: pynox serve --listen=ADDR [flags]

Serves the pool protocol over HTTP:
  GET  /v1/pool   a WebSocket: each text message is one line of the pynox pool
                  protocol, both ways (the ready event first); the sessions a
                  connection opens are its own and end with it
  POST /v1/run    one request object in, one result object out
                  (application/json); no sessions, no host functions
  /v1/mcp         the Model Context Protocol over streamable HTTP (the tools
                  of pynox mcp); each MCP session's Python sessions are its
                  own and end with it (or after --idle-timeout unused)
  GET  /healthz   200 while the process serves
  GET  /readyz    200 while the templates are up and the server is not draining
  GET  /metrics   the pool's metrics in the Prometheus text format
/v1/* and /metrics need "Authorization: Bearer TOKEN" with a token of
--token-file; the probes need none. Without --token-file the server listens on loopback
addresses only. SIGTERM or SIGINT: /readyz and new requests to /v1/* get 503
at once, work in flight finishes (up to --drain-timeout), then the process
exits 0; a second signal ends the drain.

Example:
  pynox serve --listen=127.0.0.1:8080

Flags of the server:
  --listen=ADDR          host:port to listen on (required; port 0 picks one,
                         and the address is printed on stderr)
  --token-file=FILE      bearer tokens, one per line (blank lines and lines
                         starting with # skipped), reread on SIGHUP
  --max-conns=N          WebSocket connections, runs and MCP requests at once
                         (an MCP client's event stream holds one; default 64)
  --drain-timeout=D      how long SIGTERM lets work in flight finish (default 30s)
  --write-timeout=D      a result the client does not take within D closes the
                         connection (default 1m)
  --idle-timeout=D       a connection that sends nothing for D is closed
                         (default 1h)
  --max-inflight-per-conn=N
                         jobs and session requests a WebSocket connection
                         may have accepted and not yet answered; one more
                         is answered with a RequestError (default 64);
                         also bounds the tool calls under way on /v1/mcp
                         per token, abandoned ones included
  --max-mcp-sessions-per-token=N
                         MCP sessions one token may hold at once (on a
                         server without tokens: all clients; default 256)
  --tls-cert=FILE        serve HTTPS and WSS with this PEM certificate chain
  --tls-key=FILE         and this PEM private key (both or neither; both
                         reread on SIGHUP)

Every flag of pynox pool (run "pynox pool --help"): --config, --workers,
--preload, --package-dir, --allow-read, --allow-write, --python, --cgroups,
--log, --pin-cpus, with the same configuration file.
`

// serveOptions are the flags of `pynox serve` beyond the pool's.
type serveOptions struct {
	listen       string
	tokenFile    string
	maxConns     int
	drainTimeout time.Duration
	writeTimeout time.Duration
	idleTimeout  time.Duration
	// maxInFlight bounds a WebSocket connection's requests in flight
	// (--max-inflight-per-conn).
	maxInFlight int
	// maxMCPSessions bounds the MCP sessions of one token
	// (--max-mcp-sessions-per-token).
	maxMCPSessions int
	// tlsCert and tlsKey are --tls-cert and --tls-key.
	tlsCert, tlsKey string
}

func serve(args []string, stdout, stderr io.Writer) int {
	if len(args) == 2 && args[0] == tokenReaderArg {
		return tokenReader(args[1], os.Stdin, stdout)
	}
	var o serveOptions
	var ln net.Listener
	var tokens *tokenSet
	var certs *certSource
	flags := func(fs *flag.FlagSet) {
		fs.StringVar(&o.listen, "listen", "", "host:port to listen on")
		fs.StringVar(&o.tokenFile, "token-file", "", "bearer tokens, one per line")
		fs.IntVar(&o.maxConns, "max-conns", 64, "connections and runs at once")
		fs.DurationVar(&o.drainTimeout, "drain-timeout", 30*time.Second, "how long SIGTERM lets work finish")
		fs.DurationVar(&o.writeTimeout, "write-timeout", time.Minute, "longest wait for a client to take a result")
		fs.DurationVar(&o.idleTimeout, "idle-timeout", time.Hour, "longest silence of a connection")
		fs.IntVar(&o.maxInFlight, "max-inflight-per-conn", 64, "requests in flight per WebSocket connection")
		fs.IntVar(&o.maxMCPSessions, "max-mcp-sessions-per-token", maxMCPSessions, "MCP sessions per token")
		fs.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate chain for HTTPS")
		fs.StringVar(&o.tlsKey, "tls-key", "", "PEM private key for HTTPS")
	}
	before := func() (int, bool) {
		switch {
		case o.listen == "":
			fmt.Fprintf(stderr, "pynox serve: --listen=ADDR is required, as in --listen=127.0.0.1:8080\n")
			return 2, false
		case o.maxConns <= 0:
			fmt.Fprintf(stderr, "pynox serve: --max-conns=%d: expected a positive integer\n", o.maxConns)
			return 2, false
		case o.drainTimeout <= 0:
			fmt.Fprintf(stderr, "pynox serve: --drain-timeout=%s: expected a positive duration, as in 30s\n", o.drainTimeout)
			return 2, false
		case o.writeTimeout <= 0:
			fmt.Fprintf(stderr, "pynox serve: --write-timeout=%s: expected a positive duration, as in 1m\n", o.writeTimeout)
			return 2, false
		case o.idleTimeout <= 0:
			fmt.Fprintf(stderr, "pynox serve: --idle-timeout=%s: expected a positive duration, as in 1h\n", o.idleTimeout)
			return 2, false
		case o.maxInFlight <= 0:
			fmt.Fprintf(stderr, "pynox serve: --max-inflight-per-conn=%d: expected a positive integer\n", o.maxInFlight)
			return 2, false
		case o.maxMCPSessions <= 0:
			fmt.Fprintf(stderr, "pynox serve: --max-mcp-sessions-per-token=%d: expected a positive integer\n", o.maxMCPSessions)
			return 2, false
		case o.tlsCert != "" && o.tlsKey == "":
			fmt.Fprintf(stderr, "pynox serve: --tls-cert=%s needs --tls-key=FILE (the certificate's private key): give both or neither\n", o.tlsCert)
			return 2, false
		case o.tlsKey != "" && o.tlsCert == "":
			fmt.Fprintf(stderr, "pynox serve: --tls-key=%s needs --tls-cert=FILE (the certificate chain): give both or neither\n", o.tlsKey)
			return 2, false
		}
		if o.tlsCert != "" {
			// Read now and, on SIGHUP, by readers started before the
			// process confines itself, as the token file is.
			var err error
			if certs, err = loadCerts(o.tlsCert, o.tlsKey); err != nil {
				fmt.Fprintf(stderr, "pynox serve: %v\n", err)
				return 1, false
			}
		}
		if o.tokenFile != "" {
			var err error
			if tokens, err = loadTokens(o.tokenFile); err != nil {
				fmt.Fprintf(stderr, "pynox serve: --token-file=%s: %v\n", o.tokenFile, err)
				return 1, false
			}
			// The process confines itself next, and may then no longer
			// read the file: an unconfined helper rereads it on SIGHUP.
			if tokens.read, err = startTokenReader(o.tokenFile); err != nil {
				fmt.Fprintf(stderr, "pynox serve: --token-file=%s: starting its reader: %v\n", o.tokenFile, err)
				return 1, false
			}
		}
		var err error
		if ln, err = net.Listen("tcp", o.listen); err != nil {
			fmt.Fprintf(stderr, "pynox serve: --listen=%s: %v\n", o.listen, err)
			return 1, false
		}
		if tokens == nil && !isLoopback(ln.Addr()) {
			ln.Close()
			fmt.Fprintf(stderr, "pynox serve: --listen=%s: without --token-file the server listens on loopback addresses only (127.0.0.1, ::1, localhost), "+
				"since anyone who reaches it could run code; give --token-file=FILE to listen there\n", o.listen)
			return 1, false
		}
		return 0, true
	}
	return withPool("serve", serveUsage, args, stdout, stderr, flags, before, func(p *pynox.Pool) int {
		if msg := jobsReachServer(p.Config(), p.RuntimePaths(), tokens, certs); msg != "" {
			ln.Close()
			fmt.Fprintf(stderr, "pynox serve: %s\n", msg)
			return 1
		}
		return serveHTTP(p, ln, tokens, certs, o, stderr)
	})
}

// jobsReachServer says why the server's own jobs could act as its
// clients, or returns "". A job granted the network reaches a loopback
// server like any local process, so without tokens it could send requests
// of its own with any grant of the ceiling (the seventh review: a job with
// the network and no write grant had the server run one with a write
// grant); and a job that may read the token file (beneath the read or
// write ceiling, a package dir, or the system paths every job may read;
// the read ceiling is the working directory by default) learns every
// client's token; the same holds for the TLS private key. runtime are the
// interpreter's paths (Pool.RuntimePaths), which every job reads too.
func jobsReachServer(cfg pynox.Config, runtime []string, tokens *tokenSet, certs *certSource) string {
	network := cfg.Limits.AllowNetwork
	for _, pr := range cfg.Profiles {
		network = network || pr.AllowNetwork
	}
	if tokens == nil && network {
		return "the ceiling grants the network ([pool.limits] allow_network), and a job granted it reaches this server on loopback: " +
			"without --token-file it could send requests of its own with any grant of the ceiling; give --token-file=FILE (outside every path a job may read)"
	}
	if tokens != nil {
		if msg := secretReadable(cfg, runtime, "--token-file", tokens.path, "every client's token"); msg != "" {
			return msg
		}
	}
	if certs != nil {
		return secretReadable(cfg, runtime, "--tls-key", certs.keyPath, "the server's TLS private key")
	}
	return ""
}

// secretReadable says why a job could read the file a flag names (path),
// or returns "". A file with more than one hard link is refused: another
// link may lie where jobs read, and the check cannot find it.
func secretReadable(cfg pynox.Config, runtime []string, flag, path, what string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Sprintf("%s=%s: %v", flag, path, err)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	var st syscall.Stat_t
	if err := syscall.Stat(abs, &st); err == nil && st.Nlink > 1 {
		return fmt.Sprintf("%s=%s has %d hard links, and a job could read %s through one beneath a path it may read; expected a file with a single link, outside every path a job may read", flag, path, st.Nlink, what)
	}
	for _, g := range []struct {
		what  string
		paths []string
	}{
		{"the read ceiling ([pool.limits] allow_read, --allow-read; by default the working directory)", cfg.Limits.AllowRead},
		{"the write ceiling ([pool.limits] allow_write, --allow-write)", cfg.Limits.AllowWrite},
		{"a package dir ([pool] package_dirs, --package-dir)", cfg.PackageDirs},
		{"the system paths every job may read", worker.SystemPaths()},
		{"the interpreter's paths every job may read (its prefix, sys.path, the preloads)", runtime},
	} {
		for _, d := range g.paths {
			d = filepath.Clean(d)
			if abs == d || strings.HasPrefix(abs, strings.TrimSuffix(d, "/")+"/") {
				return fmt.Sprintf("%s=%s lies beneath %s %s, so jobs could read %s; expected a file outside every path a job may read", flag, path, g.what, d, what)
			}
		}
	}
	return ""
}

// isLoopback reports whether a listener's address is a loopback one.
func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// tokenSet holds the accepted bearer tokens, as SHA-256 digests so that
// comparing them takes the same time whatever their lengths.
type tokenSet struct {
	path string
	// read returns the file's content; nil reads it in this process.
	read    func() ([]byte, error)
	digests atomic.Pointer[[][sha256.Size]byte]
}

// loadTokens reads a token file: one token per line, surrounding blanks
// trimmed, blank lines and lines starting with # skipped. A file with no
// token is an error (nobody could use the server).
func loadTokens(path string) (*tokenSet, error) {
	ts := &tokenSet{path: path}
	if err := ts.reload(); err != nil {
		return nil, err
	}
	return ts, nil
}

// reload rereads the token file; on error the tokens in use stay.
func (ts *tokenSet) reload() error {
	read := ts.read
	if read == nil {
		read = func() ([]byte, error) { return readSmallFile(ts.path) }
	}
	b, err := read()
	if err != nil {
		return err
	}
	var digests [][sha256.Size]byte
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		digests = append(digests, sha256.Sum256([]byte(l)))
	}
	if len(digests) == 0 {
		return errors.New("the file holds no token (expected one token per line)")
	}
	ts.digests.Store(&digests)
	return nil
}

// valid compares token with every accepted one in constant time.
func (ts *tokenSet) valid(token string) bool {
	d := sha256.Sum256([]byte(token))
	ok := 0
	for _, t := range *ts.digests.Load() {
		ok |= subtle.ConstantTimeCompare(d[:], t[:])
	}
	return ok == 1 && token != ""
}

// tokenReaderArg makes `pynox serve` the file's reader (see
// startTokenReader) instead of a server.
const tokenReaderArg = "__token-reader"

// maxTokenFile bounds the token file a reader sends.
const maxTokenFile = 1 << 20

// startTokenReader starts a child process, before this one confines
// itself (see [pynox.Config.ConfineSelf]), that reads the token file at
// path whenever asked: a self-confined server reads only its runtime, its
// read ceiling and its write ceiling, where the token file has no
// business (jobs may read beneath the read ceiling). The child can do
// nothing but read that one file for this process, over a pipe, and ends
// when the pipe closes. It returns the function that asks it.
func startTokenReader(path string) (func() ([]byte, error), error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "serve", tokenReaderArg, abs)
	cmd.Stderr = nil
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = cmd.Wait() }()
	var mu sync.Mutex
	return func() ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if _, err := in.Write([]byte{'r'}); err != nil {
			return nil, fmt.Errorf("the file's reader is gone: %w", err)
		}
		var hdr [5]byte
		if _, err := io.ReadFull(out, hdr[:]); err != nil {
			return nil, fmt.Errorf("the file's reader is gone: %w", err)
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n > maxTokenFile+1024 {
			return nil, errors.New("the file's reader sent too much")
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(out, b); err != nil {
			return nil, fmt.Errorf("the file's reader is gone: %w", err)
		}
		if hdr[0] != 0 {
			return nil, errors.New(string(b))
		}
		return b, nil
	}, nil
}

// tokenReader is the file's reader process: for each byte on in it
// reads path and writes a status byte (0 for the content, 1 for an
// error message), a big-endian length and the content or the message.
// It ignores the signals meant for the server and ends at EOF on in.
func tokenReader(path string, in io.Reader, out io.Writer) int {
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	var req [1]byte
	for {
		if _, err := in.Read(req[:]); err != nil {
			return 0
		}
		status := byte(0)
		b, err := readSmallFile(path)
		if err != nil {
			status, b = 1, []byte(err.Error())
		}
		var hdr [5]byte
		hdr[0] = status
		binary.BigEndian.PutUint32(hdr[1:], uint32(len(b)))
		if _, err := out.Write(append(hdr[:], b...)); err != nil {
			return 0
		}
	}
}

// readSmallFile reads a file of at most maxTokenFile bytes.
func readSmallFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxTokenFile {
		return nil, fmt.Errorf("longer than %d bytes", maxTokenFile)
	}
	return b, nil
}

// httpServer serves a pool over HTTP.
type httpServer struct {
	p      *pynox.Pool
	tokens *tokenSet
	o      serveOptions
	stderr io.Writer
	// conns holds a slot per WebSocket connection or run in progress.
	conns    chan struct{}
	draining atomic.Bool
	// drain ends when draining starts: connections stop reading requests.
	drain context.Context
	// sockets counts the WebSocket connections being served.
	sockets sync.WaitGroup
	// mcp serves /v1/mcp: one MCP server, a server session per client.
	mcp     *mcpserver.Server
	mcpHTTP http.Handler
	// mcpCalls counts the MCP requests other than GET (which holds the
	// client's event stream open) being served.
	mcpCalls sync.WaitGroup
	// mcpOwners maps MCP session ids to the token that opened them.
	mcpOwners mcpOwners
	// mcpBusy counts the tool calls under way per token (its digest, ""
	// without tokens), answered or not (see mcpInFlight).
	mcpBusyMu sync.Mutex
	mcpBusy   map[string]int
	// metrics serves GET /metrics (metrics.go); wsConns counts the
	// WebSocket connections of /v1/pool for it.
	metrics http.Handler
	wsConns prometheus.Gauge
}

func serveHTTP(p *pynox.Pool, ln net.Listener, tokens *tokenSet, certs *certSource, o serveOptions, stderr io.Writer) int {
	drain, startDrain := context.WithCancel(context.Background())
	defer startDrain()
	s := &httpServer{p: p, tokens: tokens, o: o, stderr: stderr, conns: make(chan struct{}, o.maxConns), drain: drain}
	s.setupMetrics()
	s.mcp = mcpserver.New(p, buildVersion())
	s.mcpHTTP = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp.MCP() }, &mcp.StreamableHTTPOptions{
		// An MCP session unused for --idle-timeout ends, and its Python
		// sessions with it.
		SessionTimeout: o.idleTimeout,
		// guard applies the Host and Origin rules of every /v1/* path;
		// the SDK's own Host check would refuse, on a server with tokens,
		// what /v1/pool and /v1/run accept.
		DisableLocalhostProtection: true,
		MaxRequestBodyBytes:        jsonl.MaxLine + 1,
	})
	s.mcp.MCP().AddReceivingMiddleware(s.mcpInFlight)
	if tokens != nil {
		// An MCP session is bound to the token that opened it: the SDK
		// refuses (403) a request naming its session id with another
		// token. guard has checked the token already.
		s.mcpHTTP = auth.RequireBearerToken(func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
			d := sha256.Sum256([]byte(token))
			return &auth.TokenInfo{UserID: hex.EncodeToString(d[:])}, nil
		}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(s.mcpHTTP)
	}
	hs := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes: 64 << 10, IdleTimeout: 2 * time.Minute}

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	defer signal.Stop(sigs)
	defer signal.Stop(hups)
	go func() {
		for range hups {
			if certs != nil {
				if err := certs.reload(); err != nil {
					fmt.Fprintf(stderr, "pynox serve: SIGHUP: %v; the certificate in use stays\n", err)
				} else {
					fmt.Fprintf(stderr, "pynox serve: SIGHUP: reloaded --tls-cert=%s and --tls-key=%s\n", certs.certPath, certs.keyPath)
				}
			}
			if tokens == nil {
				continue
			}
			if err := tokens.reload(); err != nil {
				fmt.Fprintf(stderr, "pynox serve: SIGHUP: --token-file=%s: %v; the tokens in use stay\n", tokens.path, err)
			} else {
				fmt.Fprintf(stderr, "pynox serve: SIGHUP: reloaded --token-file=%s\n", tokens.path)
			}
		}
	}()

	served := make(chan error, 1)
	scheme := "http"
	guard := newConnGuard(stderr)
	hs.ConnState = guard.state
	ln = &steadyListener{Listener: ln, stderr: stderr, guard: guard}
	if certs != nil {
		scheme = "https"
		hs.TLSConfig = certs.tlsConfig()
		ln = tls.NewListener(ln, hs.TLSConfig)
	}
	go func() { served <- hs.Serve(ln) }()
	fmt.Fprintf(stderr, "pynox serve: listening on %s://%s\n", scheme, ln.Addr())

	select {
	case err := <-served:
		fmt.Fprintf(stderr, "pynox serve: %v\n", err)
		return 1
	case <-sigs:
	}
	// Draining: /readyz and new requests to /v1/* get 503, WebSocket
	// connections read no more requests and answer what they hold, and
	// the jobs and steps under way finish (up to --drain-timeout; a
	// second signal ends them at once).
	s.draining.Store(true)
	startDrain()
	ctx, kill := context.WithTimeout(context.Background(), o.drainTimeout)
	defer kill()
	go func() {
		select {
		case <-sigs:
			kill()
		case <-ctx.Done():
		}
	}()
	err := p.Shutdown(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "pynox serve: drain: %v: the work still running was ended\n", err)
	}
	// The MCP calls under way have their answers; then the MCP sessions
	// end, which closes their clients' event streams and finishes their
	// Python sessions.
	calls := make(chan struct{})
	go func() { s.mcpCalls.Wait(); close(calls) }()
	select {
	case <-calls:
	case <-ctx.Done():
	}
	for ss := range s.mcp.MCP().Sessions() {
		_ = ss.Close()
	}
	// The answers are being written; a client that does not read them
	// holds its connection up to the drain's end (and a second more).
	sockets := make(chan struct{})
	go func() { s.sockets.Wait(); close(sockets) }()
	select {
	case <-sockets:
	case <-ctx.Done():
		select {
		case <-sockets:
		case <-time.After(time.Second):
		}
	}
	closing, done := context.WithTimeout(context.Background(), time.Second)
	defer done()
	if hs.Shutdown(closing) != nil {
		hs.Close()
	}
	return 0
}

func (s *httpServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "draining"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "workers": s.p.Workers()})
	})
	mux.Handle("GET /v1/pool", s.guard(http.HandlerFunc(s.servePool)))
	mux.Handle("POST /v1/run", s.guard(http.HandlerFunc(s.serveRun)))
	mux.Handle("/v1/mcp", s.guard(http.HandlerFunc(s.serveMCP)))
	mux.Handle("GET /metrics", s.guardMetrics(s.metrics))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A request that declares a body has it read within
		// --write-timeout, whatever answers it: the handlers that do not
		// read it (GET /healthz, a 401 for a missing token, a 404) left
		// net/http discarding it with no deadline before the answer, so
		// a client with no token that never sent the body it declared
		// held its connection busy for good, never idle, and enough of
		// them filled the connection bound (connGuard) so that every new
		// connection was closed (review 36). Requests without a body
		// (the WebSocket upgrade, MCP's GET stream) keep no deadline.
		if r.ContentLength != 0 {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.o.writeTimeout))
		}
		mux.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// guard admits a request to /v1/* with a valid bearer token (when the
// server has tokens) while the server is not draining and holds fewer
// than --max-conns connections.
func (s *httpServer) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(w, r) {
			return
		}
		if msg := s.browserProblem(r); msg != "" {
			writeJSON(w, http.StatusForbidden, map[string]any{"error": msg})
			return
		}
		if s.draining.Load() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": "the server is shutting down"})
			return
		}
		select {
		case s.conns <- struct{}{}:
			defer func() { <-s.conns }()
		default:
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": fmt.Sprintf("the server serves --max-conns=%d connections already; retry later", s.o.maxConns)})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authorized reports whether a request carries a valid bearer token, or
// the server has none; otherwise it answers 401.
func (s *httpServer) authorized(w http.ResponseWriter, r *http.Request) bool {
	if s.tokens != nil {
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || !s.tokens.valid(strings.TrimSpace(token)) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pynox"`)
			writeJSON(w, http.StatusUnauthorized, map[string]any{"error": `expected "Authorization: Bearer TOKEN" with a token of the server's --token-file`})
			return false
		}
	}
	return true
}

// browserProblem says why a request to /v1/* may come from a web page
// the user visits rather than from a client of the server, or returns "".
// A page may send a cross-origin POST without asking first, and may reach
// a loopback server through a name of its own that resolves to 127.0.0.1
// (DNS rebinding); without tokens, either would run its code. So: a
// request whose Origin is not the server's own is refused, and a server
// without tokens answers only to Host names that a page cannot own
// (localhost and loopback addresses). POST /v1/run also requires
// Content-Type: application/json, which a page cannot send across origins
// without a preflight that this server never grants.
func (s *httpServer) browserProblem(r *http.Request) string {
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || !strings.EqualFold(u.Host, r.Host) {
			return fmt.Sprintf("Origin %q is not this server (Host %q): requests from web pages of other origins are refused", origin, r.Host)
		}
	}
	if s.tokens == nil {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		ip := net.ParseIP(strings.Trim(host, "[]"))
		if !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
			return fmt.Sprintf("Host %q: without --token-file the server answers requests for localhost and loopback addresses only", r.Host)
		}
	}
	return ""
}

// serveRun is POST /v1/run: one request object in, one result out.
func (s *httpServer) serveRun(w http.ResponseWriter, r *http.Request) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeJSON(w, http.StatusUnsupportedMediaType, map[string]any{"error": fmt.Sprintf("Content-Type %q: expected application/json", r.Header.Get("Content-Type"))})
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(s.o.writeTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, jsonl.MaxLine+1))
	var line []byte
	if err != nil {
		var mbe *http.MaxBytesError
		if !errors.As(err, &mbe) {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": "reading the request body: " + err.Error()})
			return
		}
		line = bytes.Repeat([]byte{' '}, jsonl.MaxLine+1) // RunLine refuses it as too long
	} else {
		line = bytes.TrimSpace(body)
		if bytes.ContainsAny(line, "\n") {
			// One request: a body of several lines is not one object.
			line = bytes.ReplaceAll(line, []byte("\n"), []byte(" "))
		}
	}
	out, err := jsonl.RunLine(runContext(r), s.p, line)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": err.Error()})
		return
	}
	_ = rc.SetWriteDeadline(time.Now().Add(s.o.writeTimeout))
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// servePool is GET /v1/pool: the pool protocol over a WebSocket.
func (s *httpServer) servePool(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return // Accept answered the request
	}
	s.sockets.Add(1)
	defer s.sockets.Done()
	s.wsConns.Inc()
	defer s.wsConns.Dec()
	// A message is one line: MaxLine bytes and a newline at most. A
	// longer one closes the connection (status 1009, message too big).
	c.SetReadLimit(jsonl.MaxLine + 1)
	readCtx, stopRead := context.WithCancel(context.Background())
	defer stopRead()
	rd := &wsReader{c: c, ctx: readCtx, idle: s.o.idleTimeout}
	wr := &wsWriter{c: c, timeout: s.o.writeTimeout}
	err = jsonl.ServeWith(s.drain, s.p, rd, wr, jsonl.ServeOptions{MaxInFlight: s.o.maxInFlight, LimitName: "--max-inflight-per-conn"})
	switch {
	case err != nil || rd.failed:
		c.CloseNow() // the connection broke: no close handshake to wait for
	case s.draining.Load():
		c.Close(websocket.StatusGoingAway, "the server is shutting down")
	default:
		c.Close(websocket.StatusNormalClosure, "")
	}
}

// wsReader reads a WebSocket's messages as lines: each message, with a
// newline added when it has none.
type wsReader struct {
	c    *websocket.Conn
	ctx  context.Context
	idle time.Duration
	buf  []byte
	// failed is set when reading ended other than by a close message.
	failed bool
}

func (r *wsReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		ctx, cancel := context.WithTimeout(r.ctx, r.idle)
		typ, msg, err := r.c.Read(ctx)
		cancel()
		if err != nil {
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure || websocket.CloseStatus(err) == websocket.StatusGoingAway {
				return 0, io.EOF
			}
			r.failed = true
			return 0, err
		}
		if typ != websocket.MessageText {
			r.c.Close(websocket.StatusUnsupportedData, "send each request line as a text message")
			r.failed = true
			return 0, errors.New("binary message")
		}
		if len(msg) == 0 || msg[len(msg)-1] != '\n' {
			msg = append(msg, '\n')
		}
		r.buf = msg
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// wsWriter writes each line written to it as one text message, without
// its newline. A write blocks until the message is sent (so a client
// that does not read holds up the writer, and with it Serve), and fails
// once a message waits longer than timeout.
type wsWriter struct {
	c       *websocket.Conn
	timeout time.Duration
	partial []byte
}

func (w *wsWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.partial = append(w.partial, p...)
			break
		}
		line := p[:i]
		if len(w.partial) > 0 {
			line = append(w.partial, line...)
			w.partial = nil
		}
		p = p[i+1:]
		ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
		err := w.c.Write(ctx, websocket.MessageText, line)
		cancel()
		if err != nil {
			return 0, err
		}
	}
	return n, nil
}

// maxMCPSessions is the default of --max-mcp-sessions-per-token: the
// MCP sessions /v1/mcp holds at once for one token (on a server without
// tokens, for all clients together); a request that would open one more
// gets 503.
const maxMCPSessions = 256

// serveMCP is /v1/mcp: the MCP streamable HTTP transport, served by the
// SDK's handler (POST carries the client's messages, GET holds its event
// stream, DELETE ends its session).
func (s *httpServer) serveMCP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" {
		// A request without a session opens one, which lives up to
		// --idle-timeout unused: their number is bounded, or a client
		// could open them until the server runs out of memory (the fifth
		// review opened 3000 in 3 s, ~15 KB each). Concurrent requests
		// may pass the count together: at most --max-conns more.
		// The bound is per token, so that one token's client cannot
		// take every place from the others.
		owner := s.mcpOwner(r)
		if n := s.mcpOwners.count(s.mcp.MCP(), owner); n >= s.o.maxMCPSessions {
			who := "the server holds"
			if s.tokens != nil {
				who = "this token holds"
			}
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": fmt.Sprintf("%s %d MCP sessions already (the limit): --max-mcp-sessions-per-token=%d; end one (DELETE /v1/mcp) or retry once one has been idle for --idle-timeout", who, n, s.o.maxMCPSessions)})
			return
		}
		defer func() {
			if id := w.Header().Get("Mcp-Session-Id"); id != "" {
				s.mcpOwners.add(id, owner)
			}
		}()
	}
	if r.Method != http.MethodGet {
		// Its body is read within --write-timeout, as POST /v1/run's: a
		// client that never finished it held its --max-conns place for
		// good (the fifth review's slow-body probe).
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.o.writeTimeout))
		s.mcpCalls.Add(1)
		defer s.mcpCalls.Done()
	}
	if r.Method == http.MethodPost {
		if msg := s.mcpBatch(r); msg != "" {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": msg})
			return
		}
	}
	s.mcpHTTP.ServeHTTP(w, r)
}

// mcpBatch says why a POST to /v1/mcp is refused as a JSON-RPC batch of
// more than one request, or returns "". The SDK takes batches from a
// client that negotiated protocol 2025-03-26 and runs every call of one,
// all in one --max-conns place: before, one POST of 100 run_python calls
// queued 100 jobs, and another client's run waited behind them (the
// 35th review; 1 MiB holds ~7000). A batch of one request, with any
// notifications and responses, passes. The body read is put back for the
// SDK, which applies its own size limit.
func (s *httpServer) mcpBatch(r *http.Request) string {
	head, err := io.ReadAll(io.LimitReader(r.Body, jsonl.MaxLine+2))
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), r.Body), r.Body}
	trimmed := bytes.TrimLeft(head, " \t\r\n")
	if err != nil || len(trimmed) == 0 {
		return ""
	}
	type message struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	var batch []message
	if trimmed[0] != '[' {
		var one message
		if json.Unmarshal(head, &one) != nil {
			return ""
		}
		batch = []message{one}
	} else if json.Unmarshal(head, &batch) != nil {
		return "" // the SDK answers a malformed body
	}
	for _, m := range batch {
		// The SDK reads a numeric id through a float64 into an int64: one
		// beyond 2^53, or a fraction, was answered under another id
		// (-9223372036854775808 for 123456789012345678901234567890 and
		// for 2^63-1; the 35th review).
		if id := bytes.TrimSpace(m.ID); len(id) > 0 && (id[0] == '-' || id[0] >= '0' && id[0] <= '9') {
			if n, err := strconv.ParseInt(string(id), 10, 64); err != nil || n > 1<<53 || n < -(1<<53) {
				return fmt.Sprintf("id %s: expected a string or an integer from -2^53 to 2^53 (the answer would carry another id)", id)
			}
		}
	}
	if trimmed[0] != '[' {
		return ""
	}
	n := 0
	for _, m := range batch {
		if m.Method != "" && len(m.ID) > 0 { // an id, even null: not a notification
			n++
		}
	}
	if n <= 1 {
		return ""
	}
	return fmt.Sprintf("a JSON-RPC batch of %d requests: /v1/mcp takes one request per POST (each holds a --max-conns place while it is served); send them one by one", n)
}

// mcpInFlight bounds the tool calls one token has under way on /v1/mcp
// by --max-inflight-per-conn. A POST holds its --max-conns place only
// while its client waits, but the SDK goes on with a call whose POST was
// abandoned (in MCP a disconnection is not a cancellation): before, a
// client that posted calls and dropped each at once queued any number of
// jobs while holding no place (the 35th review: 30 calls, and another
// client's run waited 20 s). One more call is answered at once with an
// error naming the flag.
func (s *httpServer) mcpInFlight(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/call" {
			return next(ctx, method, req)
		}
		owner := ""
		if ex := req.GetExtra(); ex != nil && ex.TokenInfo != nil {
			owner = ex.TokenInfo.UserID
		}
		s.mcpBusyMu.Lock()
		if s.mcpBusy == nil {
			s.mcpBusy = map[string]int{}
		}
		if n := s.mcpBusy[owner]; n >= s.o.maxInFlight {
			s.mcpBusyMu.Unlock()
			who := "this token"
			if s.tokens == nil {
				who = "the server's clients"
			}
			return nil, fmt.Errorf("%d tool calls of %s are under way (the limit, --max-inflight-per-conn), counting those whose requests were abandoned; wait for their answers before sending more", n, who)
		}
		s.mcpBusy[owner]++
		s.mcpBusyMu.Unlock()
		defer func() {
			s.mcpBusyMu.Lock()
			if s.mcpBusy[owner]--; s.mcpBusy[owner] == 0 {
				delete(s.mcpBusy, owner)
			}
			s.mcpBusyMu.Unlock()
		}()
		return next(ctx, method, req)
	}
}

// steadyListener is a listener whose Accept ends only when the listener
// is closed: any other error (a connection the kernel could not hand
// over, a descriptor or poller limit reached) is waited out and the next
// connection accepted. http.Server ends on every accept error it does not
// know to be temporary; among those is ENOSPC from registering the new
// connection with Go's poller when the pool's uid has used up its epoll
// watches (fs.epoll.max_user_watches, counted per uid machine-wide,
// without exemption for capabilities), which a job can do (the seventh
// review: two sessions holding 5.5 million watches made the server exit).
type steadyListener struct {
	net.Listener
	stderr io.Writer
	// guard, when set, bounds the connections held open (see connGuard).
	guard *connGuard
}

func (l *steadyListener) Accept() (net.Conn, error) {
	delay := 5 * time.Millisecond
	var last string
	for {
		c, err := l.Listener.Accept()
		if err == nil || errors.Is(err, net.ErrClosed) {
			if err == nil && last != "" {
				fmt.Fprintf(l.stderr, "pynox serve: accepting connections again\n")
				last = ""
			}
			if err == nil && l.guard != nil {
				if c = l.guard.admit(c); c == nil {
					continue
				}
			}
			return c, err
		}
		if msg := err.Error(); msg != last {
			fmt.Fprintf(l.stderr, "pynox serve: accept: %v; retrying\n", err)
			last = msg
		}
		time.Sleep(delay)
		delay = min(2*delay, time.Second)
	}
}

// connGuard bounds the TCP connections the server holds open below its
// descriptor limit, keeping a reserve for the pool (its jobs' pipes and
// sockets, its spares) and for clients with work. Without it, a client
// needing no token (GET /healthz, or a connection that sends nothing
// yet) could hold every descriptor with idle keep-alive connections,
// renewing each within the 2 minutes of IdleTimeout: accept then failed
// with EMFILE and no authenticated client got through for as long as it
// lasted (the 35th review: 20000 idle connections). At the bound, a new
// connection closes one that is idle (before its first request or
// between requests), which a client with work never is for long; when
// none is idle, the new connection is closed.
type connGuard struct {
	mu     sync.Mutex
	limit  int
	open   int
	idle   map[*guardedConn]struct{}
	stderr io.Writer
	full   bool // said on stderr that no idle connection could make room
}

// newConnGuard sizes the bound from RLIMIT_NOFILE: a quarter of the
// descriptors (at least 64) stays in reserve.
func newConnGuard(stderr io.Writer) *connGuard {
	g := &connGuard{limit: 1 << 30, idle: map[*guardedConn]struct{}{}, stderr: stderr}
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil && rl.Cur < 1<<30 {
		cur := int(rl.Cur)
		g.limit = max(cur-max(cur/4, 64), 16)
	}
	return g
}

// admit takes a new connection, closing an idle one to make room at the
// bound; it returns nil when it closed c instead.
func (g *connGuard) admit(c net.Conn) net.Conn {
	g.mu.Lock()
	var victim *guardedConn
	if g.open >= g.limit {
		for v := range g.idle {
			victim = v
			break
		}
		if victim == nil {
			if !g.full {
				g.full = true
				fmt.Fprintf(g.stderr, "pynox serve: %d connections are open, none idle (the bound: three quarters of the descriptor limit, RLIMIT_NOFILE); closing new ones until one ends\n", g.open)
			}
			g.mu.Unlock()
			c.Close()
			return nil
		}
		delete(g.idle, victim)
	}
	g.full = false
	g.open++
	gc := &guardedConn{Conn: c, g: g}
	g.idle[gc] = struct{}{} // idle until its first request
	g.mu.Unlock()
	if victim != nil {
		victim.Close()
	}
	return gc
}

// state is the http.Server's ConnState hook: it tracks which connections
// are idle.
func (g *connGuard) state(c net.Conn, st http.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	gc, ok := c.(*guardedConn)
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if st == http.StateIdle && !gc.closed {
		g.idle[gc] = struct{}{}
	} else if st != http.StateNew {
		delete(g.idle, gc)
	}
}

// guardedConn is a connection connGuard counts until it is closed.
type guardedConn struct {
	net.Conn
	g      *connGuard
	closed bool // under g.mu
}

func (c *guardedConn) Close() error {
	c.g.mu.Lock()
	if !c.closed {
		c.closed = true
		c.g.open--
		delete(c.g.idle, c)
	}
	c.g.mu.Unlock()
	return c.Conn.Close()
}
