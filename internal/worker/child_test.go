package worker

import (
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
