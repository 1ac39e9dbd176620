// Command pynox-bench measures pynox against the alternatives a user would
// otherwise reach for, in one run on one machine, and prints a table.
//
// Usage:
//
//	go run ./cmd/pynox-bench [--python=/usr/bin/python3] [--n=500] [--pandas=auto|on|off] [--gap=2ms] [--json]
//
// What it measures, all as client-side wall-clock time:
//
//   - pynox: the real `pynox pool` binary (built with `go build` into a
//     temporary directory, or --pynox=PATH), driven over its JSON Lines
//     protocol. Latency is sequential: one request outstanding, a think
//     time of --gap between a result and the next request (a real agent
//     pauses between calls, which lets the pool's pre-forked spare get
//     ready), and again with no gap at all. Throughput keeps --inflight
//     requests outstanding against 2 workers.
//   - The same with --preload=pandas: a trivial job and a small pandas job.
//   - A naive fork-per-request Python server shipped with this command
//     (naive_server.py, embedded), measured the same way, with and without
//     pandas imported at its start.
//   - Cold interpreters: `python3 -c 'print(sum(range(100)))'` and
//     `python3 -c 'import pandas'`, fork/exec'd from Go per run.
//   - Memory: PSS, private (USS) and RSS from /proc/<pid>/smaps_rollup of
//     the pool's processes, found as descendants of the pool process: idle
//     templates, their pre-forked spares, and a job child caught while it
//     runs (a job that sleeps), with and without pandas preloaded.
//
// Every ratio is a time ratio against the pynox row it names: above 1 means
// slower (or, for throughput, fewer jobs per second) than pynox. Nothing is
// asserted; the numbers are for reading.
//
// Sessions: sequential trivial steps in one live session. Host functions:
// one job calling a host function n times, each call answered by this
// command as a JSON Lines client would.
package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/buildinfo"
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
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
	"golang.org/x/sys/unix"
)

// pandasRows are the rows, and memory rows, that need pandas.
var pandasRows = []string{"3", "4", "5", "8", "9", "10", "12", "14", "16", "19", "21", "M5", "M6", "M7", "M8", "M9", "M10"}

//go:embed naive_server.py
var naiveServer []byte

// The workloads.
const (
	trivialCode  = "print(sum(range(100)))"
	trivialOut   = "4950\n"
	pandasCode   = "import pandas as pd; print(pd.DataFrame({'a':[1,2]}).a.sum())"
	pandasOut    = "3\n"
	sleepingCode = "print(sum(range(100))); import time; time.sleep(1)"
	importPandas = "import pandas"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	python      string
	pynox       string
	n           int
	coldN       int
	coldPandasN int
	warm        int
	gap         time.Duration
	inflight    int
	workers     int
	pandas      string
	json        bool
	skipMemory  bool
	verbose     bool
	progress    io.Writer
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pynox-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	defPython := "python3"
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		defPython = "/usr/bin/python3"
	}
	fs.StringVar(&o.python, "python", defPython, "the interpreter every contender runs (a launcher script such as a pyenv shim is resolved to the binary it runs)")
	fs.StringVar(&o.pynox, "pynox", "", "a prebuilt pynox binary (default: go build ./cmd/pynox into a temporary directory)")
	fs.IntVar(&o.n, "n", 500, "measured requests per latency and throughput series")
	fs.IntVar(&o.coldN, "cold-n", 0, "runs of cold `python3 -c` (default n/5, at least 3)")
	fs.IntVar(&o.coldPandasN, "cold-pandas-n", 20, "runs of cold `python3 -c 'import pandas'`")
	fs.IntVar(&o.warm, "warm", 0, "unmeasured requests before each series (default min(20, n))")
	fs.DurationVar(&o.gap, "gap", 2*time.Millisecond, "think time between a result and the next request in the sequential series (a gap=0 series is always measured too)")
	fs.IntVar(&o.inflight, "inflight", 8, "requests kept outstanding in the throughput series")
	fs.IntVar(&o.workers, "workers", 2, "workers of the pynox pool and the naive server")
	fs.StringVar(&o.pandas, "pandas", "auto", "pandas rows: auto (when the python can import pandas), on (required), off")
	fs.BoolVar(&o.json, "json", false, "print the results as one JSON document instead of the table")
	fs.BoolVar(&o.skipMemory, "skip-memory", false, "skip the memory rows")
	fs.BoolVar(&o.verbose, "v", false, "report progress on stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pynox-bench: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	switch o.pandas {
	case "auto", "on", "off":
	default:
		fmt.Fprintf(stderr, "pynox-bench: --pandas must be auto, on or off, not %q\n", o.pandas)
		return 2
	}
	if o.n < 1 || o.inflight < 1 || o.workers < 1 || o.coldPandasN < 1 || o.gap < 0 {
		fmt.Fprintln(stderr, "pynox-bench: --n, --inflight, --workers and --cold-pandas-n must be positive, --gap not negative")
		return 2
	}
	if o.coldN == 0 {
		o.coldN = max(3, o.n/5)
	}
	if o.warm == 0 {
		o.warm = min(20, o.n)
	}
	o.progress = io.Discard
	if o.verbose {
		o.progress = stderr
	}

	rep, err := bench(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "pynox-bench: %v\n", err)
		return 1
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "pynox-bench: %v\n", err)
			return 1
		}
		return 0
	}
	rep.print(stdout)
	return 0
}

// ---------------------------------------------------------------- report

// Report is everything one run measured; --json prints it.
type Report struct {
	Date     string     `json:"date"`
	Nproc    int        `json:"nproc"`
	Go       string     `json:"go"`
	Kernel   string     `json:"kernel"`
	CPU      string     `json:"cpu"`
	Python   PythonInfo `json:"python"`
	Pynox    string     `json:"pynox"`
	Settings string     `json:"settings"`
	Rows     []*Row     `json:"rows"`
	Memory   []*MemRow  `json:"memory"`
	// StartupMS is each server's time from start to its ready line.
	StartupMS map[string]float64 `json:"startup_ms"`
	Elapsed   string             `json:"elapsed"`
}

// PythonInfo names the interpreter every contender ran.
type PythonInfo struct {
	Requested string `json:"requested"`
	Path      string `json:"path"`
	Version   string `json:"version"`
	Pandas    string `json:"pandas,omitempty"`
	Numpy     string `json:"numpy,omitempty"`
	PandasErr string `json:"pandas_error,omitempty"`
}

// Row is one timing series.
type Row struct {
	ID      string `json:"id"`
	Section string `json:"section"`
	Name    string `json:"name"`
	N       int    `json:"n"`
	// Client-side round trip (latency rows) or per-request round trip
	// under load (throughput rows), in microseconds.
	MedianUS float64 `json:"median_us"`
	P99US    float64 `json:"p99_us"`
	JobsPerS float64 `json:"jobs_per_s,omitempty"`
	// The server's own account, when it gives one: the job's duration
	// and (pynox) the queue time before hand-over, medians.
	ServerDurUS   float64 `json:"server_duration_us,omitempty"`
	ServerQueueUS float64 `json:"server_queue_us,omitempty"`
	// Vs names the pynox row this one is compared to, Ratio the time
	// ratio (above 1: slower than it).
	Vs      string  `json:"vs,omitempty"`
	Ratio   float64 `json:"ratio,omitempty"`
	Skipped string  `json:"skipped,omitempty"`

	rtts []time.Duration
}

// MemRow is one process's memory.
type MemRow struct {
	ID      string  `json:"id"`
	Name    string  `json:"name"`
	Pid     int     `json:"pid,omitempty"`
	PSSKiB  int64   `json:"pss_kib"`
	USSKiB  int64   `json:"uss_kib"`
	RSSKiB  int64   `json:"rss_kib"`
	Vs      string  `json:"vs,omitempty"`
	Ratio   float64 `json:"ratio,omitempty"`
	Skipped string  `json:"skipped,omitempty"`
}

func (r *Report) row(id string) *Row {
	for _, x := range r.Rows {
		if x.ID == id {
			return x
		}
	}
	panic("no row " + id)
}

func (r *Report) mem(id string) *MemRow {
	for _, x := range r.Memory {
		if x.ID == id {
			return x
		}
	}
	panic("no memory row " + id)
}

// newReport lays out every row up front, so a skipped one still prints.
func newReport() *Report {
	r := &Report{StartupMS: map[string]float64{}}
	lat := "latency"
	thr := "throughput"
	add := func(id, section, name, vs string) {
		r.Rows = append(r.Rows, &Row{ID: id, Section: section, Name: name, Vs: vs})
	}
	add("1", lat, "pynox            trivial     gap=G", "")
	add("2", lat, "pynox            trivial     gap=0", "1")
	add("3", lat, "pynox+pandas     trivial     gap=G", "1")
	add("4", lat, "pynox+pandas     trivial     gap=0", "3")
	add("5", lat, "pynox+pandas     pandas-job  gap=G", "")
	add("6", lat, "naive            trivial     gap=G", "1")
	add("7", lat, "naive            trivial     gap=0", "2")
	add("8", lat, "naive+pandas     trivial     gap=G", "3")
	add("9", lat, "naive+pandas     trivial     gap=0", "4")
	add("10", lat, "naive+pandas     pandas-job  gap=G", "5")
	add("11", lat, "cold python -c   trivial", "1")
	add("12", lat, "cold python -c   import pandas", "5")
	add("13", thr, "pynox            trivial", "")
	add("14", thr, "pynox+pandas     trivial", "13")
	add("15", thr, "naive            trivial", "13")
	add("16", thr, "naive+pandas     trivial", "14")
	add("17", "sessions", "pynox session     step        gap=G", "1")
	add("18", "sessions", "pynox session     step        gap=0", "2")
	add("19", "sessions", "pynox+pandas ses. step        gap=G", "3")
	add("20", "host", "pynox            host call", "")
	add("21", "host", "pynox+pandas     host call", "20")
	addMem := func(id, name, vs string) {
		r.Memory = append(r.Memory, &MemRow{ID: id, Name: name, Vs: vs})
	}
	addMem("M1", "pynox        template, idle", "")
	addMem("M2", "pynox        spare child, idle", "")
	addMem("M3", "pynox        job child, running", "")
	addMem("M4", "pynox        whole pool (Go + templates + children)", "")
	addMem("M5", "pynox+pandas template, idle", "")
	addMem("M6", "pynox+pandas spare child, idle", "")
	addMem("M7", "pynox+pandas job child, running", "")
	addMem("M8", "pynox+pandas whole pool (Go + templates + children)", "")
	addMem("M9", "naive+pandas server, idle", "")
	addMem("M10", "naive+pandas job child, running", "M7")
	return r
}

func (r *Report) finish(gap time.Duration) {
	g := gap.String()
	if gap%time.Millisecond == 0 {
		g = strconv.FormatInt(gap.Milliseconds(), 10) + "ms"
	}
	for _, x := range r.Rows {
		x.Name = strings.ReplaceAll(x.Name, "gap=G", "gap="+g)
		if x.Skipped != "" || x.Vs == "" {
			continue
		}
		base := r.row(x.Vs)
		if base.Skipped != "" {
			continue
		}
		if x.Section == "throughput" {
			if x.JobsPerS > 0 {
				x.Ratio = base.JobsPerS / x.JobsPerS
			}
		} else if base.MedianUS > 0 {
			x.Ratio = x.MedianUS / base.MedianUS
		}
	}
	for _, m := range r.Memory {
		if m.Skipped != "" || m.Vs == "" {
			continue
		}
		base := r.mem(m.Vs)
		if base.Skipped == "" && base.PSSKiB > 0 {
			m.Ratio = float64(m.PSSKiB) / float64(base.PSSKiB)
		}
	}
}

func fmtMS(us float64) string {
	if us == 0 {
		return "-"
	}
	ms := us / 1000
	switch {
	case ms >= 100:
		return fmt.Sprintf("%.0fms", ms)
	case ms >= 10:
		return fmt.Sprintf("%.1fms", ms)
	}
	return fmt.Sprintf("%.2fms", ms)
}

func fmtMiB(kib int64) string {
	return fmt.Sprintf("%.1f MiB", float64(kib)/1024)
}

func (r *Report) print(w io.Writer) {
	fmt.Fprintf(w, "pynox-bench  %s  nproc=%d  %s  kernel %s\n", r.Date, r.Nproc, r.Go, r.Kernel)
	if r.CPU != "" {
		fmt.Fprintf(w, "cpu:    %s\n", r.CPU)
	}
	py := r.Python
	fmt.Fprintf(w, "python: %s (requested %s), CPython %s", py.Path, py.Requested, py.Version)
	if py.Pandas != "" {
		fmt.Fprintf(w, ", pandas %s, numpy %s", py.Pandas, py.Numpy)
	} else if py.PandasErr != "" {
		fmt.Fprintf(w, ", pandas: %s", py.PandasErr)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "pynox:  %s\n", r.Pynox)
	fmt.Fprintf(w, "run:    %s\n\n", r.Settings)

	section := ""
	for _, x := range r.Rows {
		if x.Section != section {
			section = x.Section
			switch section {
			case "latency":
				fmt.Fprintln(w, "LATENCY: sequential, one request outstanding, client-side round trip; gap = think time before each request")
				fmt.Fprintf(w, "%-4s %-38s %5s %9s %9s %9s %9s   %s\n", "#", "benchmark", "n", "median", "p99", "srv-dur", "srv-queue", "vs pynox")
			case "throughput":
				fmt.Fprintln(w)
				fmt.Fprintln(w, "THROUGHPUT: trivial jobs, requests kept in flight as stated in the run line; median/p99 = round trip under load")
				fmt.Fprintf(w, "%-4s %-38s %5s %9s %9s %9s %9s   %s\n", "#", "benchmark", "n", "jobs/s", "median", "p99", "srv-dur", "vs pynox")
			case "sessions":
				fmt.Fprintln(w)
				fmt.Fprintln(w, "SESSIONS: trivial steps in one live session (__main__ kept), sequential, client-side round trip")
				fmt.Fprintf(w, "%-4s %-38s %5s %9s %9s %9s %9s   %s\n", "#", "benchmark", "n", "median", "p99", "srv-dur", "srv-queue", "vs pynox")
			case "host":
				fmt.Fprintln(w)
				fmt.Fprintln(w, "HOST FUNCTIONS: one job calls a host function n times; round trip = client writes a reply until the next call event arrives")
				fmt.Fprintf(w, "%-4s %-38s %5s %9s %9s   %s\n", "#", "benchmark", "n", "median", "p99", "vs pynox")
			}
		}
		if x.Skipped != "" {
			fmt.Fprintf(w, "%-4s %-38s %s\n", x.ID, x.Name, "skipped: "+x.Skipped)
			continue
		}
		vs := "baseline"
		if x.Vs != "" {
			vs = "-"
			if x.Ratio > 0 {
				vs = fmt.Sprintf("%.2fx vs #%s", x.Ratio, x.Vs)
			}
		}
		if x.Section == "throughput" {
			fmt.Fprintf(w, "%-4s %-38s %5d %9.0f %9s %9s %9s   %s\n", x.ID, x.Name, x.N, x.JobsPerS,
				fmtMS(x.MedianUS), fmtMS(x.P99US), fmtMS(x.ServerDurUS), vs)
		} else if x.Section == "host" {
			fmt.Fprintf(w, "%-4s %-38s %5d %9s %9s   %s\n", x.ID, x.Name, x.N, fmtMS(x.MedianUS), fmtMS(x.P99US), vs)
		} else {
			fmt.Fprintf(w, "%-4s %-38s %5d %9s %9s %9s %9s   %s\n", x.ID, x.Name, x.N,
				fmtMS(x.MedianUS), fmtMS(x.P99US), fmtMS(x.ServerDurUS), fmtMS(x.ServerQueueUS), vs)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "MEMORY: /proc/<pid>/smaps_rollup; PSS splits each shared page among its sharers (a template shares")
	fmt.Fprintln(w, "        nearly all its pages copy-on-write with its spare), USS = private pages, RSS = all resident pages")
	fmt.Fprintf(w, "%-4s %-52s %12s %12s %12s   %s\n", "#", "process", "PSS", "USS", "RSS", "PSS vs pynox")
	for _, m := range r.Memory {
		if m.Skipped != "" {
			fmt.Fprintf(w, "%-4s %-52s %s\n", m.ID, m.Name, "skipped: "+m.Skipped)
			continue
		}
		vs := ""
		if m.Ratio > 0 {
			vs = fmt.Sprintf("%.2fx vs #%s", m.Ratio, m.Vs)
		}
		fmt.Fprintf(w, "%-4s %-52s %12s %12s %12s   %s\n", m.ID, m.Name, fmtMiB(m.PSSKiB), fmtMiB(m.USSKiB), fmtMiB(m.RSSKiB), vs)
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, "start to ready line (one sample each):")
	for _, k := range []string{"pynox", "pynox+pandas", "naive", "naive+pandas"} {
		if v, ok := r.StartupMS[k]; ok {
			fmt.Fprintf(w, "  %s %s", k, fmtMS(v*1000))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "\nratios: time ratio against the pynox row named (above 1 = slower; throughput: pynox jobs/s over this row's);\n")
	fmt.Fprintf(w, "srv-dur/srv-queue: medians of the server's own duration_us/queue_us (naive: fork to reap). total run %s\n", r.Elapsed)
}

// ---------------------------------------------------------------- the run

func bench(ctx context.Context, o options) (*Report, error) {
	began := time.Now()
	rep := newReport()
	rep.Date = began.Format(time.RFC3339)
	rep.Nproc = runtime.NumCPU()
	rep.Go = runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	rep.Kernel = kernelRelease()
	rep.CPU = cpuModel()
	rep.Settings = fmt.Sprintf("n=%d warm=%d gap=%s inflight=%d workers=%d cold-n=%d cold-pandas-n=%d pandas=%s",
		o.n, o.warm, o.gap, o.inflight, o.workers, o.coldN, o.coldPandasN, o.pandas)
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
			} else {
				rep.row(id).Skipped = reason
			}
		}
	}
	if !withPandas {
		skip(noPandas, pandasRows...)
	}
	if o.skipMemory {
		skip("--skip-memory", "M1", "M2", "M3", "M4", "M5", "M6", "M7", "M8", "M9", "M10")
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
		if err := s.latency(rep.row(gapID), trivialCode, trivialOut, "", o.n, o.warm, o.gap); err != nil {
			return err
		}
		return s.latency(rep.row(zeroID), trivialCode, trivialOut, "", o.n, o.warm, 0)
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
	s, err := startServer(ctx, rep, "pynox", bin, pynoxArgs(""), work)
	if err != nil {
		return nil, err
	}
	err = func() error {
		if err := gapRows(s, "1", "2"); err != nil {
			return err
		}
		if err := s.throughput(rep.row("13"), trivialCode, trivialOut, o.n, o.warm, o.inflight); err != nil {
			return err
		}
		if err := s.sessionLatency(rep.row("17"), o.n, o.warm, o.gap); err != nil {
			return err
		}
		if err := s.sessionLatency(rep.row("18"), o.n, o.warm, 0); err != nil {
			return err
		}
		if err := s.hostCalls(rep.row("20"), o.n, o.warm); err != nil {
			return err
		}
		if !o.skipMemory {
			return s.memory(rep, "M1", "M2", "M3", "M4")
		}
		return nil
	}()
	s.close()
	if err != nil {
		return nil, err
	}

	if withPandas {
		logf("pynox pool --preload=pandas")
		s, err := startServer(ctx, rep, "pynox+pandas", bin, pynoxArgs("pandas"), work)
		if err != nil {
			return nil, err
		}
		err = func() error {
			if err := gapRows(s, "3", "4"); err != nil {
				return err
			}
			if err := s.latency(rep.row("5"), pandasCode, pandasOut, "", o.n, o.warm, o.gap); err != nil {
				return err
			}
			if err := s.throughput(rep.row("14"), trivialCode, trivialOut, o.n, o.warm, o.inflight); err != nil {
				return err
			}
			if err := s.sessionLatency(rep.row("19"), o.n, o.warm, o.gap); err != nil {
				return err
			}
			if err := s.hostCalls(rep.row("21"), o.n, o.warm); err != nil {
				return err
			}
			if !o.skipMemory {
				return s.memory(rep, "M5", "M6", "M7", "M8")
			}
			return nil
		}()
		s.close()
		if err != nil {
			return nil, err
		}
	}

	// The naive server.
	logf("naive server")
	s, err = startServer(ctx, rep, "naive", py.Path, naiveArgs(""), work)
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
		s, err := startServer(ctx, rep, "naive+pandas", py.Path, naiveArgs("pandas"), work)
		if err != nil {
			return nil, err
		}
		err = func() error {
			if err := gapRows(s, "8", "9"); err != nil {
				return err
			}
			if err := s.latency(rep.row("10"), pandasCode, pandasOut, "", o.n, o.warm, o.gap); err != nil {
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

	rep.finish(o.gap)
	rep.Elapsed = time.Since(began).Round(100 * time.Millisecond).String()
	return rep, nil
}

// ---------------------------------------------------------------- python

const probeScript = `import json, sys
d = {"version": "%d.%d.%d" % sys.version_info[:3]}
try:
    import pandas, numpy
    d["pandas"] = pandas.__version__
    d["numpy"] = numpy.__version__
except BaseException as e:
    d["pandas_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(d))
`

func pythonInfo(name string) (PythonInfo, error) {
	path, err := pynox.FindPython(name)
	if err != nil {
		return PythonInfo{}, err
	}
	out, err := exec.Command(path, "-c", probeScript).Output()
	if err != nil {
		return PythonInfo{}, fmt.Errorf("%s: %w", path, err)
	}
	info := PythonInfo{Requested: name, Path: path}
	if err := json.Unmarshal(out, &info); err != nil {
		return PythonInfo{}, fmt.Errorf("%s: %w (%q)", path, err, out)
	}
	info.Requested, info.Path = name, path
	return info, nil
}

// cold runs `python -c code` n times from Go, fork/exec to exit.
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

// ---------------------------------------------------------------- JSONL servers

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

// latency measures n sequential round trips after warm unmeasured ones,
// sleeping gap before each. extra adds JSON fields to every request; with
// a session's name in it, the i-th answer must be the session's step i+1.
func (s *server) latency(row *Row, code, want, extra string, n, warm int, gap time.Duration) error {
	session := strings.Contains(extra, `"session"`)
	var durs, queues []float64
	for i := range warm + n {
		if gap > 0 {
			time.Sleep(gap)
		}
		r, d, err := s.roundTrip(code, want, extra)
		if err != nil {
			return err
		}
		if session && r.Step != i+1 {
			return fmt.Errorf("%s: session step %d answered as step %d: the session did not live on", s.name, i+1, r.Step)
		}
		if i < warm {
			continue
		}
		row.rtts = append(row.rtts, d)
		durs = append(durs, float64(r.DurationUS))
		queues = append(queues, float64(r.QueueUS))
	}
	row.summarize(durs, queues)
	return nil
}

// throughput keeps inflight requests outstanding until n have completed.
func (s *server) throughput(row *Row, code, want string, n, warm, inflight int) error {
	for range warm {
		if _, _, err := s.roundTrip(code, want, ""); err != nil {
			return err
		}
	}
	var mu sync.Mutex
	sent := map[string]time.Time{}
	sem := make(chan struct{}, inflight)
	werr := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	lines := make([][]byte, n)
	ids := make([]string, n)
	for i := range n {
		var id int
		lines[i], id = s.request(code, "")
		ids[i] = strconv.Itoa(id)
	}
	t0 := time.Now()
	go func() {
		for i := range n {
			select {
			case sem <- struct{}{}:
			case <-stop:
				return
			}
			mu.Lock()
			sent[ids[i]] = time.Now()
			mu.Unlock()
			if _, err := s.stdin.Write(lines[i]); err != nil {
				werr <- fmt.Errorf("%s: write: %v", s.name, err)
				return
			}
		}
		werr <- nil
	}()
	var durs []float64
	for range n {
		r, err := s.read()
		if err != nil {
			return err
		}
		now := time.Now()
		if err := s.check(r, want); err != nil {
			return err
		}
		mu.Lock()
		st, ok := sent[r.ID.String()]
		delete(sent, r.ID.String())
		mu.Unlock()
		if !ok {
			return fmt.Errorf("%s: result for unknown id %s", s.name, r.ID)
		}
		row.rtts = append(row.rtts, now.Sub(st))
		durs = append(durs, float64(r.DurationUS))
		<-sem
	}
	elapsed := time.Since(t0)
	if err := <-werr; err != nil {
		return err
	}
	row.summarize(durs, nil)
	row.JobsPerS = float64(n) / elapsed.Seconds()
	return nil
}

// sessionLatency measures n sequential trivial steps in one session,
// after warm+1 unmeasured ones (the first starts the session), then
// closes it.
func (s *server) sessionLatency(row *Row, n, warm int, gap time.Duration) error {
	s.sessions++
	name := `"bench-` + strconv.Itoa(s.sessions) + `"`
	if err := s.latency(row, trivialCode, trivialOut, `,"session":`+name, n, warm+1, gap); err != nil {
		return err
	}
	if _, err := s.stdin.Write([]byte(`{"id":0,"session":` + name + `,"close":true}` + "\n")); err != nil {
		return err
	}
	r, err := s.read()
	if err != nil {
		return err
	}
	if !r.Closed {
		return fmt.Errorf("%s: close answered %+v", s.name, r)
	}
	return nil
}

// hostCalls runs one job that calls a host function warm+n times and
// times each call's round trip as the client sees it: from writing the
// reply to one call until the next call event arrives.
func (s *server) hostCalls(row *Row, n, warm int) error {
	code := fmt.Sprintf("from pynox_host import f\nx = 0\nfor i in range(%d):\n    x = f(x)\nprint(x)", warm+n+1)
	line, id := s.request(code, `,"functions":["f"]`)
	if _, err := s.stdin.Write(line); err != nil {
		return fmt.Errorf("%s: write: %v", s.name, err)
	}
	var sent time.Time
	for i := 0; ; i++ {
		r, err := s.read()
		now := time.Now()
		if err != nil {
			return err
		}
		if r.Event != "call" {
			if r.ID.String() != strconv.Itoa(id) {
				return fmt.Errorf("%s: got %s, want the host-call job %d", s.name, r.ID, id)
			}
			if err := s.check(r, strconv.Itoa(warm+n+1)+"\n"); err != nil {
				return err
			}
			break
		}
		if i > warm {
			row.rtts = append(row.rtts, now.Sub(sent))
		}
		var args []int
		if err := json.Unmarshal(r.Args, &args); err != nil || len(args) != 1 {
			return fmt.Errorf("%s: call args %s", s.name, r.Args)
		}
		reply := []byte(`{"reply":{"call_id":` + r.CallID.String() + `,"result":` + strconv.Itoa(args[0]+1) + "}}\n")
		sent = time.Now()
		if _, err := s.stdin.Write(reply); err != nil {
			return err
		}
	}
	if len(row.rtts) != n {
		return fmt.Errorf("%s: measured %d host calls, want %d", s.name, len(row.rtts), n)
	}
	row.summarize(nil, nil)
	return nil
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

// ---------------------------------------------------------------- statistics

func (row *Row) summarize(durs, queues []float64) {
	us := make([]float64, len(row.rtts))
	for i, d := range row.rtts {
		us[i] = float64(d.Nanoseconds()) / 1000
	}
	row.N = len(us)
	row.MedianUS = percentile(us, 50)
	row.P99US = percentile(us, 99)
	row.ServerDurUS = percentile(durs, 50)
	row.ServerQueueUS = percentile(queues, 50)
}

// percentile is the nearest-rank percentile; 0 for no samples.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// ---------------------------------------------------------------- memory

type procInfo struct {
	pid, ppid int
	name      string
	depth     int // below the root
	mem       smaps
}

type smaps struct{ rss, pss, uss int64 }

func readSmaps(pid int) (smaps, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return smaps{}, err
	}
	var m smaps
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Rss:":
			m.rss = v
		case "Pss:":
			m.pss = v
		case "Private_Clean:", "Private_Dirty:":
			m.uss += v
		}
	}
	return m, nil
}

// descendants lists root's descendant processes with their memory.
func descendants(root int) []procInfo {
	ents, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	status := map[int]procInfo{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		p := procInfo{pid: pid}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			v = strings.TrimSpace(v)
			switch k {
			case "Name":
				p.name = v
			case "PPid":
				p.ppid, _ = strconv.Atoi(v)
			}
		}
		parent[pid] = p.ppid
		status[pid] = p
	}
	var out []procInfo
	for pid, p := range status {
		d := 0
		for q := pid; q != 0 && q != root && d < 64; q = parent[q] {
			d++
			if parent[q] == root {
				p.depth = d
				break
			}
		}
		if p.depth == 0 {
			continue
		}
		m, err := readSmaps(pid)
		if err != nil {
			continue // gone already
		}
		p.mem = m
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b procInfo) int { return a.pid - b.pid })
	return out
}

func (m *MemRow) set(p procInfo) {
	m.Pid, m.PSSKiB, m.USSKiB, m.RSSKiB = p.pid, p.mem.pss, p.mem.uss, p.mem.rss
}

// memory samples the pool's process tree idle and while a job runs.
// Templates are the pool's children and spares theirs. A job child is
// told from a spare without relying on how far a spare confines itself
// ahead of time: it is one of the spares that existed before the sleeping
// job was sent, and it is the one blocked in a sleep (or, failing that,
// the one whose template has since forked a replacement).
func (s *server) memory(rep *Report, tplID, spareID, jobID, totalID string) error {
	// Let the spares of the last jobs settle.
	time.Sleep(200 * time.Millisecond)
	root := s.cmd.Process.Pid
	var tpl, spare *procInfo
	before := map[int]bool{}
	for _, p := range descendants(root) {
		switch {
		case p.depth == 1 && tpl == nil:
			tpl = &p
		case p.depth == 2:
			before[p.pid] = true
			if spare == nil {
				spare = &p
			}
		}
	}
	if tpl == nil || spare == nil {
		var tree []string
		for _, p := range descendants(root) {
			tree = append(tree, fmt.Sprintf("pid %d ppid %d depth %d %s", p.pid, p.ppid, p.depth, p.name))
		}
		return fmt.Errorf("%s: could not find an idle template and its spare below pid %d; its descendants: %s", s.name, root, strings.Join(tree, "; "))
	}
	rep.mem(tplID).set(*tpl)
	rep.mem(spareID).set(*spare)

	line, id := s.request(sleepingCode, "")
	if _, err := s.stdin.Write(line); err != nil {
		return err
	}
	found := false
	deadline := time.Now().Add(900 * time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	for !found && time.Now().Before(deadline) {
		tree := descendants(root)
		if job := findJobChild(tree, before); job != nil {
			rep.mem(jobID).set(*job)
			found = true
			var total procInfo
			total.pid = root
			if m, err := readSmaps(root); err == nil {
				total.mem = m
			}
			for _, p := range tree {
				total.mem.pss += p.mem.pss
				total.mem.uss += p.mem.uss
				total.mem.rss += p.mem.rss
			}
			rep.mem(totalID).set(total)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	r, err := s.read()
	if err != nil {
		return err
	}
	if r.ID.String() != strconv.Itoa(id) {
		return fmt.Errorf("%s: got result %s, want %d", s.name, r.ID, id)
	}
	if err := s.check(r, trivialOut); err != nil {
		return err
	}
	if !found {
		rep.mem(jobID).Skipped = "the running job child was not found"
		rep.mem(totalID).Skipped = "the running job child was not found"
	}
	return nil
}

// findJobChild picks the running job child out of a pool's tree: a
// grandchild that was a spare before the job was sent (before) and is now
// asleep, or else whose template has forked a newer child since.
func findJobChild(tree []procInfo, before map[int]bool) *procInfo {
	var cands []procInfo
	for _, p := range tree {
		if p.depth == 2 && before[p.pid] {
			cands = append(cands, p)
		}
	}
	for _, p := range cands {
		if sleepingSyscalls[currentSyscall(p.pid)] {
			return &p
		}
	}
	var found []procInfo
	for _, p := range cands {
		for _, q := range tree {
			if q.depth == 2 && q.ppid == p.ppid && !before[q.pid] {
				found = append(found, p)
				break
			}
		}
	}
	if len(found) == 1 {
		return &found[0]
	}
	return nil
}

// sleepingSyscalls are the calls time.sleep blocks in.
var sleepingSyscalls = map[int]bool{
	unix.SYS_CLOCK_NANOSLEEP: true, unix.SYS_NANOSLEEP: true, unix.SYS_PSELECT6: true, unix.SYS_PPOLL: true,
}

// currentSyscall is the system call pid is blocked in, or -1.
func currentSyscall(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/syscall")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return -1
	}
	return n
}

// naiveMemory samples the naive server idle and one of its job children
// while it runs.
func (s *server) naiveMemory(idle, job *MemRow) error {
	root := s.cmd.Process.Pid
	m, err := readSmaps(root)
	if err != nil {
		return err
	}
	idle.set(procInfo{pid: root, mem: m})
	line, id := s.request(sleepingCode, "")
	if _, err := s.stdin.Write(line); err != nil {
		return err
	}
	time.Sleep(300 * time.Millisecond)
	found := false
	for _, p := range descendants(root) {
		if p.depth == 1 {
			job.set(p)
			found = true
			break
		}
	}
	r, err := s.read()
	if err != nil {
		return err
	}
	if r.ID.String() != strconv.Itoa(id) {
		return fmt.Errorf("%s: got result %s, want %d", s.name, r.ID, id)
	}
	if !found {
		job.Skipped = "the running job child was not found"
	}
	return s.check(r, trivialOut)
}

// ---------------------------------------------------------------- helpers

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

// vcsInfo describes the commit a Go binary was built from.
func vcsInfo(bin string) string {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return ""
	}
	var rev, modified string
	for _, st := range bi.Settings {
		switch st.Key {
		case "vcs.revision":
			rev = st.Value
		case "vcs.modified":
			modified = st.Value
		}
	}
	if rev == "" {
		return ""
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		return " (commit " + rev + " plus uncommitted changes)"
	}
	return " (commit " + rev + ")"
}

// gitInfo describes the checkout the current directory is in, for
// binaries built with -buildvcs=false.
func gitInfo() string {
	rev, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	st, err := exec.Command("git", "status", "--porcelain").Output()
	if err != nil {
		return ""
	}
	if len(bytes.TrimSpace(st)) > 0 {
		return " (commit " + strings.TrimSpace(string(rev)) + " plus uncommitted or untracked changes)"
	}
	return " (commit " + strings.TrimSpace(string(rev)) + ")"
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if k, v, ok := strings.Cut(string(line), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
