package mcpserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
	"github.com/pynox/pynox/mcpserver"
)

// TestReview23ArgumentKeysExact: run_python's arguments were decoded by
// encoding/json, which matches keys case-insensitively (with Unicode
// folding) and keeps the last of two: "Profile" selected a profile, a
// permission preset, that a gateway vetting "profile" by exact key would
// not see, and "Session" named a session. The pool protocol refuses such
// keys; so does run_python now, by name.
func TestReview23ArgumentKeysExact(t *testing.T) {
	testenv.RequireSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := profilePool(t)
	cs := connect(t, ctx, mcpserver.New(p, "test"), "c")
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"code": "import os; os.listdir('.')", "Profile": "p1"}, `argument names are exact and case-sensitive: did you mean "profile"?`},
		{map[string]any{"code": "x = 1", "Session": "s"}, `Session: not an argument`},
		{map[string]any{"code": "1", "ſession": "s"}, `ſession: not an argument`},
		{map[string]any{"Code": "1"}, `Code: not an argument`},
	} {
		text, isErr := call(t, ctx, cs, "run_python", tc.args)
		require.True(t, isErr, "%v was accepted: %s", tc.args, text)
		require.Contains(t, text, tc.want, "%v", tc.args)
	}
	require.Zero(t, p.Stats().SessionsActive, "no session was opened under a folded key")
	// reset_session's arguments go through the SDK's schema check (its
	// input schema takes no other property), which is exact.
	text, isErr := call(t, ctx, cs, "reset_session", map[string]any{"session": "a", "Session": "b"})
	require.True(t, isErr, "reset_session took a folded key: %s", text)
}
