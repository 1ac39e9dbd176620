package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestOnlyServe: --only=serve measures the WebSocket rows (a real pynox
// serve on loopback, the same jsonl.Client over /v1/pool) and the pipe
// rows they compare to, in one run, and prints no other row.
func TestOnlyServe(t *testing.T) {
	// ~4 CPU-s (a build of pynox serve and a tiny run of each row);
	// TestLimitLoopIsConfined and TestBadFlags run in the quick suite, and
	// serve's WebSocket is probed by cmd/pynox's and jsonl's tests.
	testenv.RequireLong(t, "the bench's serve rows")
	requireBenchable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, []string{"--only=serve", "--n=5", "--warm=2", "--pandas=off"}, &out, &errb)
	require.Equal(t, 0, code, "stderr: %s\nstdout: %s", errb.String(), out.String())
	text := out.String()
	t.Log("\n" + text)
	rows := regexp.MustCompile(`(?m)^([0-9]+|[A-Z][0-9]+)\s+(pynox|limit|naive|cold)`).FindAllStringSubmatch(text, -1)
	var ids []string
	for _, r := range rows {
		ids = append(ids, r[1])
	}
	require.Equal(t, []string{"1", "2", "W1", "W2", "13", "W3"}, ids)
	for _, l := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(l, "W1 "):
			require.Regexp(t, `pynox serve, ws  trivial     gap=2ms\s+5\s.*\d+\.\d\dx vs #1$`, l)
		case strings.HasPrefix(l, "W2 "):
			require.Regexp(t, `\d+\.\d\dx vs #2$`, l)
		case strings.HasPrefix(l, "W3 "):
			require.Regexp(t, `\s5\s+\d+\s+\d+(\.\d+)?ms.*\d+\.\d\dx vs #13$`, l)
		}
	}
	require.Contains(t, text, "pynox-serve ")
}

// TestOnlyMemory: --only=memory samples the templates, spares, job
// children and an idle session's process, and prints only those rows.
func TestOnlyMemory(t *testing.T) {
	// ~4 CPU-s of pools sampled for memory; a speed check, like the tiny runs.
	testenv.RequireLong(t, "the bench's memory rows")
	requireBenchable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, []string{"--only=memory", "--n=5", "--warm=2", "--pandas=off"}, &out, &errb)
	require.Equal(t, 0, code, "stderr: %s\nstdout: %s", errb.String(), out.String())
	text := out.String()
	t.Log("\n" + text)
	for _, id := range []string{"M1", "M2", "M3", "M4", "M11"} {
		require.Regexp(t, `(?m)^`+id+`\s+pynox .*MiB\s+\d+\.\d MiB\s+\d+\.\d MiB`, text, id)
	}
	for _, id := range []string{"M5", "M6", "M7", "M8", "M12"} {
		require.Regexp(t, `(?m)^`+id+`\s+pynox\+pandas .*skipped: --pandas=off`, text, id)
	}
	require.NotRegexp(t, `(?m)^(1|13|M9|M10|L1)\s`, text)
}
