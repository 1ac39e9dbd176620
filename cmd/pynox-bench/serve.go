package main

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/jsonl"
)

// onlyGroups are the values of --only: a few rows measured alone, for a
// quick look (each group also measures the pipe rows its rows compare to).
var onlyGroups = map[string][]string{
	// A trivial job over `pynox serve`'s WebSocket on loopback, against
	// the same job over the pipe, in the same run.
	"serve": {"1", "2", "13", "W1", "W2", "W3"},
	// The memory of templates, spares, job children and idle sessions,
	// with and without pandas (README, "Sizing").
	"memory": {"M1", "M2", "M3", "M4", "M5", "M6", "M7", "M8", "M11", "M12"},
	// Trivial jobs on pynox and on the limit loop (no preloads): rows 1,
	// 2 and 13 against L1, L2 and L5, with the limit rows R1-R5.
	"limit": {"1", "2", "13", "L1", "L2", "L5", "R1", "R2", "R3", "R4", "R5"},
	// Steps of one live session, with and without think time, and host
	// function calls (no preloads), against rows 1 and 2.
	"sessions": {"1", "2", "17", "18", "20"},
	// Virtual mounts: a job with one read-only mount at /data against a
	// plain job, both on a pool with confine_self = false.
	"mounts": {"28", "29"},
}

// onlyNames lists the groups of --only, for its help and its error.
func onlyNames() string {
	var names []string
	for k := range onlyGroups {
		names = append(names, k)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// benchOnly measures the rows of the --only group o.only (pynox is built
// and the python checked by then), and leaves the other rows out of the
// report.
func benchOnly(ctx context.Context, rep *Report, o options, bin, python, tmp, work string, withPandas bool, noPandas string,
	skip func(string, ...string), began time.Time) (*Report, error) {
	logf := func(format string, args ...any) { fmt.Fprintf(o.progress, "pynox-bench: "+format+"\n", args...) }
	pool := func(preload string) []string {
		a := []string{"pool", "--workers=" + strconv.Itoa(o.workers), "--python=" + python}
		if preload != "" {
			a = append(a, "--preload="+preload)
		}
		return a
	}
	gapRows := func(s *server, gapID, zeroID string) error {
		if err := s.latency(rep.row(gapID), trivialCode, trivialOut, o.n, o.warm, o.gap); err != nil {
			return err
		}
		return s.latency(rep.row(zeroID), trivialCode, trivialOut, o.n, o.warm, 0)
	}
	// plain runs f on a pool without preloads, which it then stops.
	plain := func(f func(s *server) error) error {
		logf("pynox pool")
		s, err := startServer(ctx, rep, "pynox", bin, pool(""), work, nil)
		if err != nil {
			return err
		}
		defer s.close()
		return f(s)
	}
	switch o.only {
	case "limit":
		err := plain(func(s *server) error {
			return limitPairs(ctx, rep, o, s, python, "", tmp, work, [6]string{"1", "2", "13", "L1", "L2", "L5"}, nil, logf)
		})
		if err != nil {
			return nil, err
		}
	case "sessions":
		err := plain(func(s *server) error {
			if err := gapRows(s, "1", "2"); err != nil {
				return err
			}
			if err := s.sessionLatency(rep.row("17"), o.n, o.warm, o.gap); err != nil {
				return err
			}
			if err := s.sessionLatency(rep.row("18"), o.n, o.warm, 0); err != nil {
				return err
			}
			return s.hostCalls(rep.row("20"), o.n, o.warm)
		})
		if err != nil {
			return nil, err
		}
	case "mounts":
		if err := virtualMountRows(ctx, rep, bin, pool(""), work, o, skip, logf); err != nil {
			return nil, err
		}
	case "serve":
		err := plain(func(s *server) error {
			if err := gapRows(s, "1", "2"); err != nil {
				return err
			}
			return s.throughput(rep.row("13"), trivialCode, trivialOut, o.n, o.warm, o.inflight)
		})
		if err != nil {
			return nil, err
		}
		if err := serveRows(ctx, rep, o, bin, python, work, logf); err != nil {
			return nil, err
		}
	case "memory":
		measure := func(name, preload string, ids [5]string) error {
			logf("pynox pool %s (memory)", preload)
			s, err := startServer(ctx, rep, name, bin, pool(preload), work, nil)
			if err != nil {
				return err
			}
			defer s.close()
			// Warm: the spares of a few jobs, as after the other rows.
			for range o.warm {
				if _, _, err := s.run(pynox.Job{Code: trivialCode}, trivialOut); err != nil {
					return err
				}
			}
			if err := s.memory(rep, ids[0], ids[1], ids[2], ids[3]); err != nil {
				return err
			}
			return s.sessionMemory(rep.mem(ids[4]))
		}
		if err := measure("pynox", "", [5]string{"M1", "M2", "M3", "M4", "M11"}); err != nil {
			return nil, err
		}
		if withPandas {
			if err := measure("pynox+pandas", "pandas", [5]string{"M5", "M6", "M7", "M8", "M12"}); err != nil {
				return nil, err
			}
		} else {
			for _, id := range []string{"M5", "M6", "M7", "M8", "M12"} {
				rep.mem(id).Skipped = noPandas
			}
		}
	}
	rep.finish(o.gap)
	keep := onlyGroups[o.only]
	rep.Rows = slices.DeleteFunc(rep.Rows, func(r *Row) bool { return !slices.Contains(keep, r.ID) })
	rep.Memory = slices.DeleteFunc(rep.Memory, func(m *MemRow) bool { return !slices.Contains(keep, m.ID) })
	rep.Limit = slices.DeleteFunc(rep.Limit, func(l *LimitRow) bool { return !slices.Contains(keep, l.ID) })
	rep.Elapsed = time.Since(began).Round(100 * time.Millisecond).String()
	return rep, nil
}

// serveRows measures rows W1-W3: `pynox serve` on a loopback port, driven
// over one WebSocket on /v1/pool by the same protocol client as the pipe
// rows (jsonl.Client), with the pipe rows' settings.
func serveRows(ctx context.Context, rep *Report, o options, bin, python, work string, logf func(string, ...any)) error {
	logf("pynox serve (WebSocket on loopback)")
	s, stop, err := startServe(ctx, rep, bin, []string{"serve", "--listen=127.0.0.1:0", "--workers=" + strconv.Itoa(o.workers), "--python=" + python}, work)
	if err != nil {
		return err
	}
	defer stop()
	if err := s.latency(rep.row("W1"), trivialCode, trivialOut, o.n, o.warm, o.gap); err != nil {
		return err
	}
	if err := s.latency(rep.row("W2"), trivialCode, trivialOut, o.n, o.warm, 0); err != nil {
		return err
	}
	return s.throughput(rep.row("W3"), trivialCode, trivialOut, o.n, o.warm, o.inflight)
}

// startServe starts `pynox serve` (args) in dir, waits for the address it
// prints, and connects a jsonl.Client to its /v1/pool over a WebSocket.
// The function it returns ends the connection, then SIGTERMs the server
// and waits for it.
func startServe(ctx context.Context, rep *Report, bin string, args []string, dir string) (*server, func(), error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	s := &server{name: "pynox-serve", cmd: cmd, stderr: &tail{}, tpl: true}
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return nil, nil, err
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	s.pid = cmd.Process.Pid
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(s.stderr, line)
			if a, ok := strings.CutPrefix(line, "pynox serve: listening on http://"); ok {
				addr <- a
			}
		}
		close(addr)
	}()
	a, ok := <-addr
	if !ok {
		_ = cmd.Wait()
		return nil, nil, fmt.Errorf("pynox serve did not start; its stderr: %s", s.stderr.String())
	}
	// The protocol client the remote Go pool uses, on one connection; no
	// keepalive stats request lands among the measured ones.
	s.c, err = jsonl.DialClient(ctx, "ws://"+a+"/v1/pool", jsonl.DialOptions{Keepalive: -1})
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, nil, fmt.Errorf("pynox serve: dialing ws://%s/v1/pool: %v; its stderr: %s", a, err, s.stderr.String())
	}
	s.ready = time.Since(t0)
	rep.StartupMS[s.name] = float64(s.ready.Microseconds()) / 1000
	stop := func() {
		s.close()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	return s, stop, nil
}

// sessionMemory opens a session, runs one trivial step in it, and samples
// the session's process while it waits idle for the next step. The
// session's process is the spare its template gave it: one of the spares
// that existed before, the one whose template has since forked a newer
// child.
func (s *server) sessionMemory(row *MemRow) error {
	time.Sleep(200 * time.Millisecond)
	root := s.cmd.Process.Pid
	before := map[int]bool{}
	for _, p := range descendants(root) {
		if p.depth == 2 {
			before[p.pid] = true
		}
	}
	s.sessions++
	sess := s.c.Session("bench-memory-"+strconv.Itoa(s.sessions), pynox.Job{})
	r, err := sess.Run(context.Background(), pynox.Step{Code: "x = sum(range(100))\nprint(x)"})
	if err != nil {
		return s.failed(err)
	}
	if err := s.check(r, trivialOut); err != nil {
		return err
	}
	time.Sleep(300 * time.Millisecond)
	tree := descendants(root)
	var found []procInfo
	for _, p := range tree {
		if p.depth != 2 || !before[p.pid] {
			continue
		}
		for _, q := range tree {
			if q.depth == 2 && q.ppid == p.ppid && !before[q.pid] {
				found = append(found, p)
				break
			}
		}
	}
	if len(found) == 1 {
		row.set(found[0])
	} else {
		row.Skipped = fmt.Sprintf("the idle session's process was not told apart (%d candidates)", len(found))
	}
	if err := sess.Close(context.Background()); err != nil {
		return s.failed(err)
	}
	return nil
}
