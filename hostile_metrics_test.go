package pynox

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// TestHostileMetricsLabels: a job names its own exception classes, so
// their names must not become label values: a session whose steps raise
// 40 classes of their own, with names built to break the exposition
// format (quotes, braces, a newline, a forged sample), leaves
// pynox_jobs_total with the labels "other" (and "none"), and the scrape
// still parses with Prometheus' text parser.
func TestHostileMetricsLabels(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	reg := prometheus.NewRegistry()
	reg.MustRegister(p.Collector())
	ctx := context.Background()
	co, err := p.Checkout(ctx, Job{})
	require.NoError(t, err)
	defer co.Finish(ctx)
	names := []string{`x"} 1\npynox_fake_total 99\n#`, "{}", `a\"b`, "ÿ" + strings.Repeat("z", 300)}
	for i := range 36 {
		names = append(names, fmt.Sprintf("Custom%dError", i))
	}
	for _, n := range names {
		ev, err := co.Feed(ctx, Step{Code: fmt.Sprintf("raise type(%q, (Exception,), {})()", n)})
		require.NoError(t, err)
		requireErrorType(t, ev.Result, n)
	}
	ev, err := co.Feed(ctx, Step{Code: "print(1)"})
	require.NoError(t, err)
	requireOK(t, ev.Result)

	fams := gatherPynox(t, reg)
	jobs := fams["pynox_jobs_total"]
	require.Len(t, jobs.GetMetric(), 2, "%v", jobs)
	v, _ := metricValue(jobs, map[string]string{"outcome": "failed", "error_type": "other"})
	require.Equal(t, float64(len(names)), v)
	v, _ = metricValue(jobs, map[string]string{"outcome": "ok", "error_type": "none"})
	require.Equal(t, 1.0, v)
	requireMetricsMatchStats(t, fams, p.Stats())

	// The text exposition of the same registry parses, and holds no
	// forged family.
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var text strings.Builder
	enc := expfmt.NewEncoder(&text, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		require.NoError(t, enc.Encode(mf))
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(strings.NewReader(text.String()))
	require.NoError(t, err, text.String())
	require.NotContains(t, parsed, "pynox_fake_total")
	require.Len(t, parsed, len(mfs))
}
