package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pynox/pynox"
)

// server is a running JSON Lines job server: pynox pool or the naive one.
// Both take {"id", "code"} lines and answer {"id", "exit", "stdout", ...}.
type server struct {
	name     string
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	out      *bufio.Reader
	stderr   *tail
	nextID   int
	sessions int // sessions opened, for unique names
	ready    time.Duration
}

type result struct {
	ID         json.Number      `json:"id"`
	Event      string           `json:"event"`
	Exit       int              `json:"exit"`
	Stdout     string           `json:"stdout"`
	Stderr     string           `json:"stderr"`
	DurationUS int64            `json:"duration_us"`
	QueueUS    int64            `json:"queue_us"`
	Step       int              `json:"step"`
	Closed     bool             `json:"closed"`
	CallID     json.Number      `json:"call_id"`
	Args       json.RawMessage  `json:"args"`
	Error      *pynox.ErrorInfo `json:"error"`
}

func startServer(ctx context.Context, rep *Report, name, bin string, args []string, dir string) (*server, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	s := &server{name: name, cmd: cmd, stdin: stdin, out: bufio.NewReaderSize(stdout, 1<<20), stderr: &tail{}}
	cmd.Stderr = s.stderr
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	r, err := s.read()
	if err != nil {
		s.close()
		return nil, err
	}
	if r.Event != "ready" {
		s.close()
		return nil, fmt.Errorf("%s: first line is not a ready event", name)
	}
	s.ready = time.Since(t0)
	if rep != nil {
		rep.StartupMS[name] = float64(s.ready.Microseconds()) / 1000
	}
	return s, nil
}

func (s *server) read() (*result, error) {
	line, err := s.out.ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("%s: reading a result: %v; its stderr: %s", s.name, err, s.stderr.String())
	}
	var r result
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, fmt.Errorf("%s: bad result line %q: %v", s.name, line, err)
	}
	return &r, nil
}

// request builds one request line and returns its id.
func (s *server) request(code string, extra string) ([]byte, int) {
	s.nextID++
	c, _ := json.Marshal(code)
	return []byte(`{"id":` + strconv.Itoa(s.nextID) + `,"code":` + string(c) + extra + "}\n"), s.nextID
}

func (s *server) check(r *result, want string) error {
	if r.Exit != 0 || r.Error != nil || (want != "" && r.Stdout != want) {
		msg := ""
		if r.Error != nil {
			msg = r.Error.Type + ": " + r.Error.Message
		}
		return fmt.Errorf("%s: job %s failed: exit %d %s stdout %q stderr %q", s.name, r.ID, r.Exit, msg, r.Stdout, r.Stderr)
	}
	return nil
}

// roundTrip sends one request (extra: more JSON fields) and waits for its
// result.
func (s *server) roundTrip(code, want, extra string) (*result, time.Duration, error) {
	line, id := s.request(code, extra)
	t0 := time.Now()
	if _, err := s.stdin.Write(line); err != nil {
		return nil, 0, fmt.Errorf("%s: write: %v", s.name, err)
	}
	r, err := s.read()
	d := time.Since(t0)
	if err != nil {
		return nil, 0, err
	}
	if r.ID.String() != strconv.Itoa(id) {
		return nil, 0, fmt.Errorf("%s: got result %s, want %d", s.name, r.ID, id)
	}
	return r, d, s.check(r, want)
}

func (s *server) close() {
	s.stdin.Close()
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

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
