package testenv

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
// cannot import package main) and returns its path: BuildPynox's shared
// build.
func PynoxBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(buildPynox)
	require.NoError(t, binErr)
	return binPath
}

// buildPynox sets binPath and binErr from BuildPynox. It runs once
// (binOnce).
func buildPynox() { binPath, binErr = BuildPynox() }

// BuildPynox builds cmd/pynox (a plain `go build`, which stamps the VCS
// revision as -buildvcs=auto does) and returns the path of the build.
//
// Every package's tests of one checkout share that build: it lives in a
// directory of the temporary directory named for the checkout, and stays
// there after the tests, so that the next package (or the next run) only
// asks go build whether it is up to date (a third of a second) instead of
// linking it again (seconds of CPU each time). go build replaces a stale
// build by renaming a new file over it, so a process that runs the old
// one is not disturbed; a lock file serializes the builds of test
// binaries that run at once. When that directory cannot be used safely
// (it is not a directory this user owns), the build goes to a new
// temporary directory instead, which nothing removes either.
func BuildPynox() (string, error) {
	dir, err := sharedBuildDir()
	if err != nil {
		if dir, err = os.MkdirTemp("", "pynox-testenv-bin"); err != nil {
			return "", err
		}
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "pynox")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/pynox/pynox/cmd/pynox").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/pynox: %v: %s", err, out)
	}
	return bin, nil
}

// sharedBuildDir returns BuildPynox's directory for this checkout,
// $TMPDIR/pynox-testenv-<hash of the checkout's path>, made if missing; an
// error when it is not a directory of this user's, mode 0700.
func sharedBuildDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", errors.New("testenv: no source path to name the checkout")
	}
	sum := sha256.Sum256([]byte(filepath.Dir(filepath.Dir(filepath.Dir(file)))))
	dir := filepath.Join(os.TempDir(), "pynox-testenv-"+hex.EncodeToString(sum[:8]))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || fi.Mode().Perm() != 0o700 || !ok || int(st.Uid) != os.Getuid() {
		return "", fmt.Errorf("testenv: %s is not a directory of this user's, mode 0700", dir)
	}
	return dir, nil
}

// PrebuildPynox starts PynoxBinary's build in the background when the
// whole package runs (RunsAll), so that the tests before the first one
// that needs the binary run while it links. A package's TestMain calls it
// before m.Run, and WaitPynox after.
func PrebuildPynox() {
	if RunsAll() {
		go binOnce.Do(buildPynox)
	}
}

// WaitPynox waits for a build PrebuildPynox started (the build itself
// stays for the next package's tests: BuildPynox). A package's TestMain
// calls it after m.Run.
func WaitPynox() {
	binOnce.Do(func() {})
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
