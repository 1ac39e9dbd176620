package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// TestAgentLoop runs the example against real python3 under the real
// sandbox: each conversation's output streams in order, the host tool
// answers, the runaway cell is interrupted and the session keeps its
// variables, and one conversation never sees the other's.
func TestAgentLoop(t *testing.T) {
	testenv.RequireSandbox(t)
	var out strings.Builder
	require.NoError(t, run(&out, testenv.Python()))
	got := out.String()
	require.Contains(t, got, "== alice\n>>> prices = {'apple': 1.2, 'pear': 0.8}\n... sum(prices.values())\n= 2.0\n")
	require.Contains(t, got, "[stdout] apple 12\n[stdout] pear 0\n")
	require.Contains(t, got, "KeyboardInterrupt: ")
	require.Contains(t, got, ">>> sorted(prices)\n= [\"apple\",\"pear\"]\n")
	require.Contains(t, got, "[stdout] step 0\n[stdout] step 1\n[stdout] step 2\n")
	require.Contains(t, got, "NameError: name 'prices' is not defined")
}
