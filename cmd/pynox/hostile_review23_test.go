package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReview23ProfileEnvCheckedAtStart: a profile whose env holds a name
// no environment can carry ("A=B", "", a NUL) was accepted at start, and
// every request naming the profile was then refused with `env: invalid
// variable "A=B"`, blaming an env the request never sent. The pool now
// refuses the file at start, naming the file, the line, the profile's key
// and the variable, and says what a variable must be.
func TestReview23ProfileEnvCheckedAtStart(t *testing.T) {
	t.Parallel()
	bin := pynoxBinary(t)
	dir := t.TempDir()
	for i, tc := range []struct{ env, want string }{
		{`env = { "A=B" = "x" }`, `:4: profiles.a.env: "A=B": expected a non-empty name without "=" or NUL, and a value without NUL`},
		{`env = { "" = "x" }`, `:4: profiles.a.env: expected a non-empty name`},
		{`env = { A = "x\u0000y" }`, `:4: profiles.a.env: "A": expected a non-empty name`},
	} {
		cfg := filepath.Join(dir, "p"+string(rune('0'+i))+".toml")
		require.NoError(t, os.WriteFile(cfg, []byte("[pool]\nworkers = 1\n[profiles.a]\n"+tc.env+"\n"), 0o644))
		var out, errb strings.Builder
		cmd := exec.Command(bin, "pool", "--config="+cfg)
		cmd.Dir = dir
		cmd.Stdin = strings.NewReader(`{"id": 1, "code": "print(1)", "profile": "a"}` + "\n")
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		require.Error(t, err, "a profile env of %s was accepted: %s", tc.env, out.String())
		require.Equal(t, 1, cmd.ProcessState.ExitCode(), errb.String())
		require.True(t, strings.HasPrefix(errb.String(), "pynox pool: "+cfg+tc.want), "%s", errb.String())
		require.Empty(t, out.String(), "no ready line")
	}
}
