package worker

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTrimUTF8(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"abc", "abc"},
		{"é", "é"},
		{"a\xc3", "a"},           // é cut after its first byte
		{"a\xe2\x9c", "a"},       // ✓ cut after two of three bytes
		{"a\xf0\x9f\x90", "a"},   // 🐍 cut after three of four bytes
		{"a🐍", "a🐍"},             // whole
		{"\xff\xfe", "\xff\xfe"}, // invalid bytes are not a cut character
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, string(trimUTF8([]byte(tc.in))), "%q", tc.in)
	}
}

func TestPathBeneath(t *testing.T) {
	require.True(t, pathBeneath("/usr/lib/python3", "/usr/lib"))
	require.False(t, pathBeneath("/usr/lib", "/usr/lib"), "a path is not beneath itself")
	require.False(t, pathBeneath("/usr/lib64", "/usr/lib"))
	require.True(t, pathBeneath("/x", "/"))
}

// The template recognises the host's fork requests by their exact bytes and
// treats any other frame as a protocol error: both sides must agree.
func TestForkFramesMatchRunner(t *testing.T) {
	for kind, payload := range forkFrames {
		require.True(t, json.Valid(payload), "kind %d", kind)
		want := fmt.Sprintf(`b'%s': "%s"`, payload, kindNames[kind])
		require.Contains(t, runnerSource, want, "runner.py's _FORK_KINDS must hold the host's frame")
	}
}
