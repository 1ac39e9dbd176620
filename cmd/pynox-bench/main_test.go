package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/sandbox"
	"github.com/stretchr/testify/require"
)

// requireBenchable skips where the bench cannot run: short mode (it builds
// pynox and starts real pools), no Landlock (every pynox job would fail
// closed), or no Go toolchain to build pynox with.
func requireBenchable(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real pools and interpreters; skipped with -short")
	}
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock, so pynox jobs cannot run confined: %v", err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build pynox with")
	}
	if _, err := pynox.FindPython(defaultPython()); err != nil {
		t.Skipf("no python: %v", err)
	}
}

func defaultPython() string {
	if _, err := exec.LookPath("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return "python3"
}

var tiny = []string{"--n=5", "--warm=2", "--cold-n=3", "--pandas=off"}

// TestTinyRunPrintsEveryRow runs the whole bench in a tiny mode without
// pandas and checks the table has every row: measured rows with numbers,
// pandas rows marked skipped, the later issues marked not measured.
func TestTinyRunPrintsEveryRow(t *testing.T) {
	requireBenchable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, tiny, &out, &errb)
	require.Equal(t, 0, code, "stderr: %s\nstdout: %s", errb.String(), out.String())
	text := out.String()
	t.Log("\n" + text)

	for _, header := range []string{"pynox-bench ", "nproc=", "python: ", "CPython ", "LATENCY", "THROUGHPUT", "MEMORY", "SESSIONS", "HOST FUNCTIONS"} {
		require.Contains(t, text, header)
	}
	lines := strings.Split(text, "\n")
	lineOf := func(id, name string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, id+" ") && strings.Contains(l, name) {
				return l
			}
		}
		t.Fatalf("no row #%s %q in:\n%s", id, name, text)
		return ""
	}
	number := regexp.MustCompile(`\d+(\.\d+)?ms`)
	rep := newReport()
	rep.finish(2 * time.Millisecond)
	for _, r := range rep.Rows {
		l := lineOf(r.ID, r.Name)
		if slices.Contains(pandasRows, r.ID) {
			require.Contains(t, l, "skipped: --pandas=off", "row #%s", r.ID)
			continue
		}
		require.GreaterOrEqual(t, len(number.FindAllString(l, -1)), 2, "row #%s should show median and p99: %s", r.ID, l)
		if r.Vs == "" {
			require.Contains(t, l, "baseline", "row #%s", r.ID)
		} else {
			require.Regexp(t, `\d+\.\d\dx vs #`+r.Vs+`$`, l, "row #%s", r.ID)
		}
		if r.Section == "throughput" {
			require.Regexp(t, `\s5\s+\d+\s+\d+(\.\d+)?ms`, l, "row #%s should show n=5, jobs/s and the median", r.ID)
		}
	}
	for _, m := range rep.Memory {
		l := lineOf(m.ID, m.Name)
		if m.ID != "M1" && m.ID != "M2" && m.ID != "M3" && m.ID != "M4" {
			require.Contains(t, l, "skipped: --pandas=off", "row %s", m.ID)
		} else {
			require.Regexp(t, `MiB\s+\d+\.\d MiB\s+\d+\.\d MiB`, l, "row %s", m.ID)
		}
	}
}

// TestTinyRunJSON checks that --json prints the same rows as one JSON
// document.
func TestTinyRunJSON(t *testing.T) {
	requireBenchable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, append(append([]string{}, tiny...), "--json", "--skip-memory"), &out, &errb)
	require.Equal(t, 0, code, "stderr: %s", errb.String())
	var rep Report
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())
	require.Len(t, rep.Rows, len(newReport().Rows))
	require.NotEmpty(t, rep.Python.Version)
	for _, r := range rep.Rows {
		if r.Skipped != "" {
			continue
		}
		want := 5
		if strings.HasPrefix(r.Name, "cold") {
			want = 3 // --cold-n
		}
		require.Equal(t, want, r.N, "row #%s", r.ID)
		require.Positive(t, r.MedianUS, "row #%s", r.ID)
		require.GreaterOrEqual(t, r.P99US, r.MedianUS, "row #%s", r.ID)
	}
	for _, m := range rep.Memory {
		require.Equal(t, "--skip-memory", m.Skipped)
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	require.Equal(t, 3.0, percentile(xs, 50))
	require.Equal(t, 5.0, percentile(xs, 99))
	require.Equal(t, 1.0, percentile(xs, 1))
	require.Equal(t, 0.0, percentile(nil, 50))
	require.Equal(t, []float64{5, 1, 4, 2, 3}, xs, "percentile must not reorder its input")
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--pandas=maybe"}, {"--n=0"}, {"extra"}, {"--nope"}} {
		var out, errb bytes.Buffer
		require.Equal(t, 2, run(context.Background(), args, &out, &errb), "%v", args)
		require.NotEmpty(t, errb.String(), "%v", args)
	}
}
