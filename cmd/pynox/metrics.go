package main

import (
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxScrapes bounds the /metrics requests served at once; more get 503.
const maxScrapes = 4

// setupMetrics makes the server's registry, of its own (nothing is
// registered globally): the pool's collector (pynox_*, see
// pynox.Pool.Collector), the WebSocket connections of /v1/pool, the Go
// runtime's metrics (go_*) and the process's (process_*), and the handler
// that serves it.
func (s *httpServer) setupMetrics() {
	s.wsConns = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pynox_serve_websocket_connections",
		Help: "WebSocket connections of GET /v1/pool being served.",
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.p.Collector(), s.wsConns, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		MaxRequestsInFlight: maxScrapes,
		// A collector that fails (the process collector, where /proc
		// cannot be read) costs its own metrics, logged, not the scrape.
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      log.New(s.stderr, "pynox serve: GET /metrics: ", 0),
	})
}

// guardMetrics admits a request to /metrics with a valid bearer token
// (when the server has tokens) and not from a web page, as guard does for
// /v1/*; unlike /v1/*, a scrape holds no --max-conns slot and is answered
// while the server drains, so that the drain can be watched.
func (s *httpServer) guardMetrics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(w, r) {
			return
		}
		if msg := s.browserProblem(r); msg != "" {
			writeJSON(w, http.StatusForbidden, map[string]any{"error": msg})
			return
		}
		next.ServeHTTP(w, r)
	})
}
