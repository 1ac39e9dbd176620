package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// The eighth review's probes of the check that jobs cannot read the
// server's secrets (jobsReachServer/secretReadable).

// serveRefused runs pynox serve in dir with args and returns its stderr,
// requiring that it refused to start.
func serveRefused(t *testing.T, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var errb bytes.Buffer
	cmd := exec.CommandContext(ctx, pynoxBinary(t), append([]string{"serve", "--listen=127.0.0.1:0", "--python=" + testenv.Python()}, args...)...)
	cmd.Dir, cmd.Stderr = dir, &errb
	require.Error(t, cmd.Run())
	require.Equal(t, 1, cmd.ProcessState.ExitCode(), "the server started: %s", errb.String())
	return errb.String()
}

// A token file or TLS key beneath the interpreter's own paths (with
// Debian's python3, sys.prefix is /usr, so every job reads all of /usr:
// /usr/local/etc, /usr/share) passed the check, which knew only the fixed
// system paths; jobs read it. Now the server refuses it.
func TestServeReview8SecretUnderInterpreterPaths(t *testing.T) {
	t.Parallel()
	testenv.RequireSandbox(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to write beneath /usr/local/share")
	}
	out, err := exec.Command(testenv.Python(), "-c", "import sys; print(sys.prefix)").Output()
	require.NoError(t, err)
	if string(bytes.TrimSpace(out)) != "/usr" {
		t.Skipf("the interpreter's prefix is %s, not /usr", out)
	}
	base, err := os.MkdirTemp("/usr/local/share", "pynox-review8-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	tokens := filepath.Join(base, "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("tok\n"), 0o600))
	msg := serveRefused(t, t.TempDir(), "--token-file="+tokens)
	require.Contains(t, msg, "--token-file="+tokens+" lies beneath")
	require.Contains(t, msg, "interpreter")
}

// A token file kept outside every path a job may read, but with a hard
// link beneath the read ceiling, passed the check: a job read it through
// the link. Now a secret with more than one link is refused.
func TestServeReview8SecretHardLinked(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	testenv.RequireSandbox(t)
	dir, outside := t.TempDir(), t.TempDir()
	tokens := filepath.Join(outside, "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("tok\n"), 0o600))
	require.NoError(t, os.Link(tokens, filepath.Join(dir, "copy")))
	msg := serveRefused(t, dir, "--token-file="+tokens)
	require.Contains(t, msg, "--token-file="+tokens+" has 2 hard links")
}

// childrenOf lists the pids whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, c)
		}
	}
	return out
}

// The readers of the token file and TLS key run outside the server's
// confinement: killed with SIGKILL, the server leaves none of them
// behind (each ends at EOF on its request pipe), and a job cannot
// signal them (they are outside its Landlock domain and pid namespace).
func TestServeReview8SecretReadersEndWithServer(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	testenv.RequireSandbox(t)
	dir, outside := t.TempDir(), t.TempDir()
	tokens := filepath.Join(outside, "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("tok-a\n"), 0o600))
	certPath, keyPath, _ := writeSelfSigned(t, outside, "pynox-review8")
	s := startServe(t, dir, "--token-file="+tokens, "--tls-cert="+certPath, "--tls-key="+keyPath)
	var readers []int
	for _, c := range childrenOf(s.cmd.Process.Pid) {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(c) + "/cmdline"); err == nil && bytes.Contains(b, []byte(tokenReaderArg)) {
			readers = append(readers, c)
		}
	}
	require.Len(t, readers, 3, "expected a reader each for the tokens, the certificate and the key")
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGKILL))
	_ = s.cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	// A reader that exited is gone or a zombie (empty cmdline) until
	// whoever it was reparented to reaps it.
	alive := func(r int) bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(r) + "/cmdline")
		return err == nil && bytes.Contains(b, []byte(tokenReaderArg))
	}
	for _, r := range readers {
		for alive(r) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		require.False(t, alive(r), "reader %d outlived the server", r)
	}
}
