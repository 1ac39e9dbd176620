package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// An empty path flag (--allow-write=$UNSET) is refused, naming the flag,
// instead of standing for the working directory.
func TestPoolEmptyPathFlags(t *testing.T) {
	for _, flag := range []string{"--allow-write=", "--allow-read=", "--package-dir="} {
		var stderr strings.Builder
		code := run([]string{"pool", flag}, strings.NewReader(""), &strings.Builder{}, &stderr)
		require.Equal(t, 2, code, "%s: %s", flag, stderr.String())
		require.Contains(t, stderr.String(), strings.TrimSuffix(strings.TrimPrefix(flag, "-"), "="), flag)
		require.Contains(t, stderr.String(), "empty path", flag)
	}
}
