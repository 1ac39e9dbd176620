package testenv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// PynoxBinary builds cmd/pynox once per test binary (a package's tests
// cannot import package main) and returns its path.
func PynoxBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(buildPynox)
	require.NoError(t, binErr)
	return binPath
}

// buildPynox builds cmd/pynox into a new temporary directory: binPath, or
// binErr with go build's output. It runs once (binOnce).
func buildPynox() {
	dir, err := os.MkdirTemp("", "pynox-testenv-bin")
	if err != nil {
		binErr = err
		return
	}
	binPath = filepath.Join(dir, "pynox")
	out, err := exec.Command("go", "build", "-o", binPath, "github.com/pynox/pynox/cmd/pynox").CombinedOutput()
	if err != nil {
		binErr = fmt.Errorf("go build ./cmd/pynox: %v: %s", err, out)
	}
}

// PrebuildPynox starts PynoxBinary's build in the background when the
// whole package runs (RunsAll), so that the tests before the first one
// that needs the binary run while it links. A package's TestMain calls it
// before m.Run, and RemovePynox after.
func PrebuildPynox() {
	if RunsAll() {
		go binOnce.Do(buildPynox)
	}
}

// RemovePynox waits for a build PrebuildPynox started, then removes
// PynoxBinary's build, if any. A package's TestMain calls it after m.Run.
func RemovePynox() {
	binOnce.Do(func() {})
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
}

// Server is a running `pynox serve`, killed when the test ends.
type Server struct {
	Cmd *exec.Cmd
	// Addr is the address it listens on, HOST:PORT.
	Addr string
	// Stderr is what it printed on stderr.
	Stderr *SyncBuffer
	exited chan struct{}
}

// URL is the server's WebSocket endpoint, ws://ADDR/v1/pool.
func (s *Server) URL() string { return "ws://" + s.Addr + "/v1/pool" }

// Kill ends the server with SIGKILL (its templates and jobs die with it)
// and waits for it to exit.
func (s *Server) Kill() {
	_ = s.Cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
}

// StartServe starts `pynox serve --listen=listen args...` in dir with the
// tests' interpreter, and waits until it prints the address it serves.
func StartServe(t testing.TB, dir, listen string, args ...string) *Server {
	t.Helper()
	RequireSandbox(t)
	argv := []string{"serve", "--listen=" + listen}
	if py := Python(); py != "" {
		argv = append(argv, "--python="+py)
	}
	cmd := exec.Command(PynoxBinary(t), append(argv, args...)...)
	cmd.Dir = dir
	pipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	s := &Server{Cmd: cmd, Stderr: &SyncBuffer{}, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(s.Stderr, line)
			if a, ok := strings.CutPrefix(line, "pynox serve: listening on http://"); ok {
				addr <- a
			}
		}
		close(addr)
		_ = cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(s.Kill)
	a, ok := <-addr
	require.True(t, ok, "pynox serve printed no address; stderr: %s", s.Stderr.String())
	s.Addr = a
	return s
}
