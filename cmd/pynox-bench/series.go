package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pynox/pynox"
)

func bench(ctx context.Context, o options) (*Report, error) {
	began := time.Now()
	rep := newReport()
	rep.Date = began.Format(time.RFC3339)
	rep.Nproc = runtime.NumCPU()
	rep.Go = runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	rep.Kernel = kernelRelease()
	rep.CPU = cpuModel()
	rep.Settings = fmt.Sprintf("n=%d warm=%d gap=%s inflight=%d workers=%d cold-n=%d cold-pandas-n=%d pandas=%s matplotlib=%s chart-n=%d blocks=%d",
		o.n, o.warm, o.gap, o.inflight, o.workers, o.coldN, o.coldPandasN, o.pandas, o.matplotlib, chartN(o.n), o.blocks)
	logf := func(format string, args ...any) { fmt.Fprintf(o.progress, "pynox-bench: "+format+"\n", args...) }

	py, err := pythonInfo(o.python)
	if err != nil {
		return nil, err
	}
	rep.Python = py
	withPandas := false
	var noPandas string
	switch {
	case o.pandas == "off":
		noPandas = "--pandas=off"
	case py.Pandas == "" && o.pandas == "on":
		return nil, fmt.Errorf("--pandas=on, but %s cannot import pandas: %s", py.Path, py.PandasErr)
	case py.Pandas == "":
		noPandas = "pandas is not importable by " + py.Path
	default:
		withPandas = true
	}
	withCharts := false
	var noCharts string
	switch {
	case o.matplotlib == "off":
		noCharts = "--matplotlib=off"
	case py.Matplotlib == "" && o.matplotlib == "on":
		return nil, fmt.Errorf("--matplotlib=on, but %s cannot import matplotlib: %s", py.Path, py.MatplotlibErr)
	case py.Matplotlib == "":
		noCharts = "matplotlib is not importable by " + py.Path
	default:
		withCharts = true
	}

	tmp, err := os.MkdirTemp("", "pynox-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin := o.pynox
	if bin == "" {
		logf("building pynox")
		bin = filepath.Join(tmp, "pynox")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/pynox/pynox/cmd/pynox")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build github.com/pynox/pynox/cmd/pynox (run from inside the module, or pass --pynox): %v\n%s", err, out)
		}
		rep.Pynox = "built from this module with go build"
		if v := vcsInfo(bin); v != "" {
			rep.Pynox += v
		} else {
			rep.Pynox += gitInfo()
		}
	} else {
		rep.Pynox = bin + vcsInfo(bin)
	}
	naivePath := filepath.Join(tmp, "naive_server.py")
	if err := os.WriteFile(naivePath, naiveServer, 0o644); err != nil {
		return nil, err
	}
	work := filepath.Join(tmp, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		return nil, err
	}

	skip := func(reason string, ids ...string) {
		for _, id := range ids {
			if strings.HasPrefix(id, "M") {
				rep.mem(id).Skipped = reason
			} else if strings.HasPrefix(id, "R") {
				rep.limit(id).Skipped = reason
			} else {
				rep.row(id).Skipped = reason
			}
		}
	}
	if !withPandas {
		skip(noPandas, pandasRows...)
	}
	if !withCharts {
		skip(noCharts, chartRows...)
	}
	if o.skipMemory {
		skip("--skip-memory", "M1", "M2", "M3", "M4", "M5", "M6", "M7", "M8", "M9", "M10", "M11", "M12")
	}

	pynoxArgs := func(preload string) []string {
		a := []string{"pool", "--workers=" + strconv.Itoa(o.workers), "--python=" + py.Path}
		if preload != "" {
			a = append(a, "--preload="+preload)
		}
		return a
	}
	naiveArgs := func(preload string) []string {
		a := []string{naivePath, "--workers=" + strconv.Itoa(o.workers)}
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

	if o.only != "" {
		return benchOnly(ctx, rep, o, bin, py.Path, tmp, work, withPandas, noPandas, skip, began)
	}

	// Cold interpreters.
	logf("cold python -c x%d", o.coldN)
	if err := cold(ctx, rep.row("11"), py.Path, trivialCode, trivialOut, o.coldN); err != nil {
		return nil, err
	}
	if withPandas {
		logf("cold python -c 'import pandas' x%d", o.coldPandasN)
		if err := cold(ctx, rep.row("12"), py.Path, importPandas, "", o.coldPandasN); err != nil {
			return nil, err
		}
	}

	// pynox without preloads.
	logf("pynox pool")
	s, err := startServer(ctx, rep, "pynox", bin, pynoxArgs(""), work, nil)
	if err != nil {
		return nil, err
	}
	err = func() error {
		// Rows 1, 2 and 13 interleaved with the limit loop's L1, L2 and L5
		// (rows 25 and 26 in between, measured alone); the loop stops
		// before the session and memory rows.
		err := limitPairs(ctx, rep, o, s, py.Path, "", tmp, work, [6]string{"1", "2", "13", "L1", "L2", "L5"}, func() error {
			if err := s.mountLatency(rep.row("25"), work, o.n, o.warm, o.gap); err != nil {
				return err
			}
			if withCharts {
				return s.chartLatency(rep.row("26"), o.n, o.warm, o.gap)
			}
			return nil
		}, logf)
		if err != nil {
			return err
		}
		if err := s.poolRows(rep, o, poolRowIDs{"", "17", "18", "22", "20", [4]string{"M1", "M2", "M3", "M4"}}); err != nil || o.skipMemory {
			return err
		}
		return s.sessionMemory(rep.mem("M11"))
	}()
	s.close()
	if err != nil {
		return nil, err
	}
	if err := virtualMountRows(ctx, rep, bin, pynoxArgs(""), work, o, skip, logf); err != nil {
		return nil, err
	}

	if withPandas {
		logf("pynox pool --preload=pandas")
		s, err := startServer(ctx, rep, "pynox+pandas", bin, pynoxArgs("pandas"), work, nil)
		if err != nil {
			return nil, err
		}
		err = func() error {
			// Rows 3, 4 and 14 interleaved with L3, L4 and L6, row 5 in between.
			err := limitPairs(ctx, rep, o, s, py.Path, "pandas", tmp, work, [6]string{"3", "4", "14", "L3", "L4", "L6"}, func() error {
				return s.latency(rep.row("5"), pandasCode, pandasOut, o.n, o.warm, o.gap)
			}, logf)
			if err != nil {
				return err
			}
			if err := s.poolRows(rep, o, poolRowIDs{"", "19", "24", "23", "21", [4]string{"M5", "M6", "M7", "M8"}}); err != nil || o.skipMemory {
				return err
			}
			return s.sessionMemory(rep.mem("M12"))
		}()
		s.close()
		if err != nil {
			return nil, err
		}
	}

	if withCharts {
		logf("pynox pool --preload=%s", chartPreload)
		s, err := startServer(ctx, rep, "pynox+pyplot", bin, pynoxArgs(chartPreload), work, nil)
		if err != nil {
			return nil, err
		}
		err = s.chartLatency(rep.row("27"), o.n, o.warm, o.gap)
		s.close()
		if err != nil {
			return nil, err
		}
	}

	// The naive server.
	logf("naive server")
	s, err = startServer(ctx, rep, "naive", py.Path, naiveArgs(""), work, nil)
	if err != nil {
		return nil, err
	}
	err = func() error {
		if err := gapRows(s, "6", "7"); err != nil {
			return err
		}
		return s.throughput(rep.row("15"), trivialCode, trivialOut, o.n, o.warm, o.inflight)
	}()
	s.close()
	if err != nil {
		return nil, err
	}
	if withPandas {
		logf("naive server --preload=pandas")
		s, err := startServer(ctx, rep, "naive+pandas", py.Path, naiveArgs("pandas"), work, nil)
		if err != nil {
			return nil, err
		}
		err = func() error {
			if err := gapRows(s, "8", "9"); err != nil {
				return err
			}
			if err := s.latency(rep.row("10"), pandasCode, pandasOut, o.n, o.warm, o.gap); err != nil {
				return err
			}
			if err := s.throughput(rep.row("16"), trivialCode, trivialOut, o.n, o.warm, o.inflight); err != nil {
				return err
			}
			if !o.skipMemory {
				return s.naiveMemory(rep.mem("M9"), rep.mem("M10"))
			}
			return nil
		}()
		s.close()
		if err != nil {
			return nil, err
		}
	}

	// pynox serve, over a WebSocket on loopback.
	if err := serveRows(ctx, rep, o, bin, py.Path, work, logf); err != nil {
		return nil, err
	}

	rep.finish(o.gap)
	rep.Elapsed = time.Since(began).Round(100 * time.Millisecond).String()
	return rep, nil
}

func cold(ctx context.Context, row *Row, python, code, want string, n int) error {
	// One unmeasured run fills the page cache.
	if out, err := exec.CommandContext(ctx, python, "-c", code).Output(); err != nil {
		return fmt.Errorf("%s -c %q: %v", python, code, err)
	} else if want != "" && string(out) != want {
		return fmt.Errorf("%s -c %q printed %q, want %q", python, code, out, want)
	}
	for range n {
		cmd := exec.CommandContext(ctx, python, "-c", code)
		t0 := time.Now()
		out, err := cmd.Output()
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("%s -c %q: %v", python, code, err)
		}
		if want != "" && string(out) != want {
			return fmt.Errorf("%s -c %q printed %q, want %q", python, code, out, want)
		}
		row.rtts = append(row.rtts, d)
	}
	row.summarize(nil, nil)
	return nil
}

// latency measures n sequential round trips of code after warm
// unmeasured ones, sleeping gap before each.
func (s *server) latency(row *Row, code, want string, n, warm int, gap time.Duration) error {
	return s.series(row, n, warm, gap, func(int) (*pynox.Result, time.Duration, error) {
		return s.run(pynox.Job{Code: code}, want)
	})
}

// mountLatency is latency for a trivial job given one read-only mount (a
// directory beside the pool's working directory's files, at its host
// path: the pool refuses virtual paths for now).
func (s *server) mountLatency(row *Row, work string, n, warm int, gap time.Duration) error {
	dir := filepath.Join(work, "mnt")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	job := pynox.Job{Code: trivialCode, Mounts: []pynox.MountSpec{{HostPath: dir, Mode: pynox.ReadOnly}}}
	return s.series(row, n, warm, gap, func(int) (*pynox.Result, time.Duration, error) {
		return s.run(job, trivialOut)
	})
}

// virtualMountRows measures rows 28 and 29, interleaved, on a pool
// started with confine_self = false (as when these rows were added, so
// that the rows compare across runs): a plain trivial job, and the same
// job given one read-only mount at a virtual path (/data), which takes a mount
// namespace of its own (a prepared one the mounter attaches the mount
// to) and the template's ready process for such jobs. Both rows are
// skipped, saying why, where the pool reports that it cannot build
// mount namespaces.
func virtualMountRows(ctx context.Context, rep *Report, bin string, args []string, work string, o options,
	skip func(string, ...string), logf func(string, ...any)) error {
	cfg := filepath.Join(work, "unconfined.toml")
	if err := os.WriteFile(cfg, []byte("[pool]\nconfine_self = false\n"), 0o644); err != nil {
		return err
	}
	logf("pynox pool (confine_self = false)")
	s, err := startServer(ctx, rep, "pynox-unconfined", bin, append(slices.Clone(args), "--config="+cfg), work, nil)
	if err != nil {
		return err
	}
	defer s.close()
	if m := s.c.Ready().Mounts; !m.VirtualPaths {
		skip("the pool cannot build mount namespaces: "+m.Missing, "28", "29")
		return nil
	}
	dir := filepath.Join(work, "vmnt")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	job := pynox.Job{Code: trivialCode, Mounts: []pynox.MountSpec{{HostPath: dir, Path: "/data", Mode: pynox.ReadOnly}}}
	// The two rows take turns on the pool, in blocks (interleave).
	return interleave(rep, s.latencyLeg(rep.row("28"), pynox.Job{Code: trivialCode}, trivialOut, o.warm, o.gap),
		s.latencyLeg(rep.row("29"), job, trivialOut, o.warm, o.gap), o.n, o.blocks, logf)
}

// chartN is how many chart jobs a chart row measures: a tenth of n, at
// least 5 (a chart job without the preload takes about a second).
func chartN(n int) int { return max(5, n/10) }

// chartLatency is latency for a chart job, chartN(n) samples after at most
// 2 warm-up jobs; each result must carry exactly one output, a PNG.
func (s *server) chartLatency(row *Row, n, warm int, gap time.Duration) error {
	return s.series(row, chartN(n), min(warm, 2), gap, func(int) (*pynox.Result, time.Duration, error) {
		r, d, err := s.run(pynox.Job{Code: chartCode}, "")
		if err != nil {
			return r, d, err
		}
		return r, d, checkChart(s.name, r)
	})
}

// checkChart checks that a chart job's result holds one PNG output and
// nothing else.
func checkChart(name string, r *pynox.Result) error {
	if len(r.Outputs) != 1 || r.Outputs[0].MIME != "image/png" {
		mimes := make([]string, len(r.Outputs))
		for i, o := range r.Outputs {
			mimes[i] = o.MIME
		}
		return fmt.Errorf("%s: chart job %v: want one image/png output, got %d %v (stderr %q)", name, r.ID, len(r.Outputs), mimes, r.Stderr)
	}
	png, err := base64.StdEncoding.DecodeString(r.Outputs[0].Data)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		return fmt.Errorf("%s: chart job %v: its image/png output is not base64 of a PNG (%v)", name, r.ID, err)
	}
	return nil
}

// series times warm+n sequential round trips made by once, sleeping gap
// before each, and summarizes the last n.
func (s *server) series(row *Row, n, warm int, gap time.Duration, once func(i int) (*pynox.Result, time.Duration, error)) error {
	if err := s.latencyBlock(nil, 0, warm, gap, once); err != nil {
		return err
	}
	a := &acc{row: row}
	cpu0 := s.cpu()
	if err := s.latencyBlock(a, warm, n, gap, once); err != nil {
		return err
	}
	a.cpu = s.cpu().sub(cpu0)
	a.finish()
	return nil
}

// throughput keeps inflight requests outstanding until n have completed.
func (s *server) throughput(row *Row, code, want string, n, warm, inflight int) error {
	for range warm {
		if _, _, err := s.run(pynox.Job{Code: code}, want); err != nil {
			return err
		}
	}
	a := &acc{row: row, throughput: true}
	cpu0 := s.cpu()
	err := s.throughputBlock(a, code, want, n, inflight)
	cpu := s.cpu().sub(cpu0)
	if err != nil {
		return err
	}
	a.cpu = cpu
	a.finish()
	return nil
}

// sessionLatency measures n sequential trivial steps in one session,
// after warm+1 unmeasured ones (the first starts the session), then
// closes it. The i-th answer must be the session's step i+1.
func (s *server) sessionLatency(row *Row, n, warm int, gap time.Duration) error {
	s.sessions++
	sess := s.c.Session("bench-"+strconv.Itoa(s.sessions), pynox.Job{})
	err := s.series(row, n, warm+1, gap, func(i int) (*pynox.Result, time.Duration, error) {
		// Each step's source differs (a comment naming it), as an agent's
		// steps do: the session process keeps the compiled code of a
		// source it ran before, which a repeated step would measure.
		code := trivialCode + " # step " + strconv.Itoa(i)
		t0 := time.Now()
		r, err := sess.Run(context.Background(), pynox.Step{Code: code})
		d := time.Since(t0)
		if err != nil {
			return nil, 0, s.failed(err)
		}
		if err := s.check(r, trivialOut); err != nil {
			return nil, 0, err
		}
		if r.Step != i+1 {
			return nil, 0, fmt.Errorf("%s: session step %d answered as step %d: the session did not live on", s.name, i+1, r.Step)
		}
		return r, d, nil
	})
	if err != nil {
		return err
	}
	if err := sess.Close(context.Background()); err != nil {
		return s.failed(err)
	}
	return nil
}

// sessionFirstStep measures the first step of n new sessions, after warm
// unmeasured ones: each sample is a new session's first request, which
// checks the session out and runs its first step. Each session is closed
// after its sample, unmeasured (before the gap of the next one).
func (s *server) sessionFirstStep(row *Row, n, warm int, gap time.Duration) error {
	return s.series(row, n, warm, gap, func(int) (*pynox.Result, time.Duration, error) {
		s.sessions++
		sess := s.c.Session("bench-first-"+strconv.Itoa(s.sessions), pynox.Job{})
		t0 := time.Now()
		r, err := sess.Run(context.Background(), pynox.Step{Code: trivialCode})
		d := time.Since(t0)
		if err != nil {
			return nil, 0, s.failed(err)
		}
		if err := s.check(r, trivialOut); err != nil {
			return nil, 0, err
		}
		if r.Step != 1 || r.Restarted {
			return nil, 0, fmt.Errorf("%s: a new session's first step answered as step %d (restarted %v)", s.name, r.Step, r.Restarted)
		}
		if err := sess.Close(context.Background()); err != nil {
			return nil, 0, s.failed(err)
		}
		return r, d, nil
	})
}

// hostCalls runs one job that calls a host function warm+n+1 times and
// times each call's round trip as the client sees it: from answering one
// call until the next call reaches the client's host function. The host
// function returns at once, and the client is told so
// (jsonl.Client.SetInlineHost): it runs each call on the goroutine that
// read it.
func (s *server) hostCalls(row *Row, n, warm int) error {
	s.c.SetInlineHost(true)
	defer s.c.SetInlineHost(false)
	code := fmt.Sprintf("from pynox_host import f\nx = 0\nfor i in range(%d):\n    x = f(x)\nprint(x)", warm+n+1)
	var mu sync.Mutex // the calls come one at a time
	var sent time.Time
	calls := 0
	host := func(_ context.Context, call *pynox.Call) (any, error) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if calls > warm {
			row.rtts = append(row.rtts, now.Sub(sent))
		}
		calls++
		var args []int
		if err := json.Unmarshal(call.Args, &args); err != nil || len(args) != 1 {
			return nil, fmt.Errorf("call args %s", call.Args)
		}
		sent = time.Now()
		return args[0] + 1, nil
	}
	if _, _, err := s.run(pynox.Job{Code: code, Functions: []string{"f"}, Host: host}, strconv.Itoa(warm+n+1)+"\n"); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	if len(row.rtts) != n {
		return fmt.Errorf("%s: measured %d host calls, want %d", s.name, len(row.rtts), n)
	}
	row.summarize(nil, nil)
	return nil
}

// poolRowIDs names the rows a pynox pool's series fill after its latency
// rows: throughput, session steps with think time and back to back, a
// session's first step, host calls, and the four memory rows.
type poolRowIDs struct {
	throughput, stepGap, stepB2B, firstStep, hostCall string
	memory                                            [4]string
}

// poolRows measures, on a running pynox pool, the rows ids names, in
// that order.
func (s *server) poolRows(rep *Report, o options, ids poolRowIDs) error {
	if ids.throughput != "" { // "": measured with the limit loop's, interleaved
		if err := s.throughput(rep.row(ids.throughput), trivialCode, trivialOut, o.n, o.warm, o.inflight); err != nil {
			return err
		}
	}
	if err := s.sessionLatency(rep.row(ids.stepGap), o.n, o.warm, o.gap); err != nil {
		return err
	}
	if err := s.sessionLatency(rep.row(ids.stepB2B), o.n, o.warm, 0); err != nil {
		return err
	}
	if err := s.sessionFirstStep(rep.row(ids.firstStep), o.n, o.warm, o.gap); err != nil {
		return err
	}
	if err := s.hostCalls(rep.row(ids.hostCall), o.n, o.warm); err != nil {
		return err
	}
	if o.skipMemory {
		return nil
	}
	return s.memory(rep, ids.memory[0], ids.memory[1], ids.memory[2], ids.memory[3])
}
