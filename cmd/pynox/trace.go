package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// traceFlushTimeout bounds how long the exit waits for the last spans to
// be exported.
const traceFlushTimeout = 5 * time.Second

// tracing is the OTLP/HTTP trace pipeline of `pynox pool` and `pynox
// serve`: nil when no exporter endpoint is configured.
type tracing struct {
	tp   *sdktrace.TracerProvider
	port uint16 // the endpoint's TCP port, for the self-confinement
}

// otlpEndpoint returns the OTLP/HTTP traces endpoint the standard
// environment configures, and the variable that names it; "" when none
// does, or when OTEL_SDK_DISABLED is true.
func otlpEndpoint() (endpoint, variable string) {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return "", ""
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if e := os.Getenv(v); e != "" {
			return e, v
		}
	}
	return "", ""
}

// endpointPort is the TCP port an OTLP/HTTP endpoint URL names, or its
// scheme's default.
func endpointPort(endpoint string) (uint16, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return 0, fmt.Errorf("%q: expected an http:// or https:// URL, such as http://localhost:4318", endpoint)
	}
	if ps := u.Port(); ps != "" {
		port, err := strconv.ParseUint(ps, 10, 16)
		if err != nil || port == 0 {
			return 0, fmt.Errorf("%q: the port %q is not a TCP port (1 to 65535)", endpoint, ps)
		}
		return uint16(port), nil
	}
	if u.Scheme == "https" {
		return 443, nil
	}
	return 80, nil
}

// startTracing installs the OTLP/HTTP exporter when the standard
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is
// set (the exporter reads its other OTEL_EXPORTER_OTLP_* settings
// itself), and returns nil, with no exporter and no cost, otherwise.
// Export errors go to log (nil: stderr).
func startTracing(logger *slog.Logger, stderr func(string)) (*tracing, error) {
	endpoint, variable := otlpEndpoint()
	if endpoint == "" {
		return nil, nil
	}
	port, err := endpointPort(endpoint)
	if err != nil {
		return nil, fmt.Errorf("%s=%v", variable, err)
	}
	exp, err := otlptracehttp.New(context.Background())
	if err != nil {
		return nil, fmt.Errorf("%s=%q: the OTLP/HTTP trace exporter: %v", variable, endpoint, err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", serviceName())))
	if err != nil {
		res = resource.Default()
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		if logger != nil {
			logger.Warn("exporting traces failed", "err", err.Error())
		} else {
			stderr("exporting traces failed: " + err.Error())
		}
	}))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &tracing{tp: tp, port: port}, nil
}

// serviceName is OTEL_SERVICE_NAME, or "pynox".
func serviceName() string {
	if s := os.Getenv("OTEL_SERVICE_NAME"); s != "" {
		return s
	}
	return "pynox"
}

// shutdown flushes the spans not yet exported and stops the exporter.
func (t *tracing) shutdown() {
	if t == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	_ = t.tp.Shutdown(ctx)
}
