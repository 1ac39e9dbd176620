package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/jsonl"
)

// server is a running JSON Lines job server — pynox pool, the limit loop or
// the naive server — and the jsonl.Client that drives it. All take {"id", "code"} lines and
// answer {"id", "exit", "stdout", ...}; only pynox pool takes sessions and
// host functions.
type server struct {
	name     string
	cmd      *exec.Cmd
	c        *jsonl.Client
	stderr   *tail
	sessions int // sessions opened, for unique names
	ready    time.Duration
	pid      int  // the server process, root of the tree whose CPU is measured
	tpl      bool // the server's children are templates (pynox pool, the limit loop)
}

// startServer starts bin with args in dir, with env as its whole
// environment (nil: this process's), and waits for its ready line.
func startServer(ctx context.Context, rep *Report, name, bin string, args []string, dir string, env []string) (*server, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	s := &server{name: name, cmd: cmd, stderr: &tail{}}
	cmd.Stderr = s.stderr
	t0 := time.Now()
	c, err := jsonl.StartCmd(cmd)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w; its stderr: %s", name, err, s.stderr.String())
	}
	s.c = c
	s.ready = time.Since(t0)
	s.pid = cmd.Process.Pid
	s.tpl = strings.HasPrefix(name, "pynox") || strings.HasPrefix(name, "limit")
	if rep != nil {
		rep.StartupMS[name] = float64(s.ready.Microseconds()) / 1000
	}
	return s, nil
}

func (s *server) check(r *pynox.Result, want string) error {
	if r.Exit != 0 || r.Error != nil || (want != "" && r.Stdout != want) {
		msg := ""
		if r.Error != nil {
			msg = r.Error.Type + ": " + r.Error.Message
		}
		return fmt.Errorf("%s: job %v failed: exit %d %s stdout %q stderr %q", s.name, r.ID, r.Exit, msg, r.Stdout, r.Stderr)
	}
	return nil
}

// run sends one job, waits for its result and checks it, timing the
// round trip as the client sees it.
func (s *server) run(job pynox.Job, want string) (*pynox.Result, time.Duration, error) {
	t0 := time.Now()
	r, err := s.c.Run(context.Background(), job)
	d := time.Since(t0)
	if err != nil {
		return nil, 0, s.failed(err)
	}
	return r, d, s.check(r, want)
}

// failed says that the server gave no answer, with what it wrote last.
func (s *server) failed(err error) error {
	return fmt.Errorf("%s: %v; its stderr: %s", s.name, err, s.stderr.String())
}

func (s *server) close() { _ = s.c.Close() }

// cpu reads the CPU the server's process tree has used so far.
func (s *server) cpu() cpuTimes { return treeCPU(s.pid, s.tpl) }

// tail keeps the last 8 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

// Write keeps the tail of what is written.
func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 8<<10 {
		t.buf = t.buf[len(t.buf)-8<<10:]
	}
	return len(p), nil
}

// String returns the kept tail.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}
