package pynox_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pynox/pynox"
)

// An embedder registers the pool's collector in a registry of its own
// and serves it; the pool registers nothing globally.
func ExamplePool_Collector() {
	pool, err := pynox.New(exampleConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(pool.Collector())
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer metrics.Close()

	ctx := context.Background()
	for _, code := range []string{"print(1)", "1/0"} {
		if _, err := pool.Run(ctx, pynox.Job{Code: code}); err != nil {
			log.Fatal(err)
		}
	}
	resp, err := http.Get(metrics.URL)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "pynox_jobs_total") {
			fmt.Println(line)
		}
	}
	// Output:
	// pynox_jobs_total{error_type="ZeroDivisionError",outcome="failed"} 1
	// pynox_jobs_total{error_type="none",outcome="ok"} 1
}
