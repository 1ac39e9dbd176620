// Command pynox-bench measures pynox against the alternatives a user would
// otherwise reach for, in one run on one machine, and prints a table.
//
// Usage:
//
//	go run ./cmd/pynox-bench [--python=/usr/bin/python3] [--n=500] [--pandas=auto|on|off] [--matplotlib=auto|on|off] [--gap=2ms] [--blocks=6] [--json] [--only=serve|memory|limit|sessions|mounts]
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
//   - The limit of pynox's design: a minimal confined fork-per-job loop
//     shipped with this command (limit_loop.py, embedded), with pynox's
//     process layout (a warm template per worker, one pre-forked spare
//     each) and the same confinement as a pynox job: the seccomp programs,
//     Landlock rules and handled rights, capability drop and rlimits come
//     from pynox's own packages (internal/worker.Policy), so nothing is
//     left out of the yardstick but pynox's protocol, cgroups, PID
//     namespaces and features. Measured like pynox, with and without
//     pandas, interleaved with pynox's rows (below); the LIMIT section
//     gives pynox as a ratio of it: CPU per job (at throughput and with
//     think time), throughput, round trip with think time and back to
//     back.
//   - Cold interpreters: `python3 -c 'print(sum(range(100)))'` and
//     `python3 -c 'import pandas'`, fork/exec'd from Go per run.
//   - Memory: PSS, private (USS) and RSS from /proc/<pid>/smaps_rollup of
//     the pool's processes, found as descendants of the pool process: idle
//     templates, their pre-forked spares, and a job child caught while it
//     runs (a job that sleeps), with and without pandas preloaded.
//
// CPU per job (cpu/job) is the user+system CPU of the server's whole
// process tree over a series (from /proc: each live process's own time,
// with nanosecond resolution, and the time of what it reaped, in ticks)
// divided by the requests measured, split into the server process (pynox's
// Go host), the templates and the job processes.
//
// Interleaved pairs: the rows a target's ratio compares are measured in
// the same stretch of time, because the speed of a shared VM drifts by
// 10-30% over minutes and a ratio of rows measured minutes apart mixes that
// drift with the difference. Rows 1, 2 and 13 against the limit loop's L1,
// L2 and L5 (R1-R5), rows 3, 4 and 14 against L3, L4 and L6 (R6-R10), and
// row 28 against row 29 (one pool, plain and mount jobs) are measured in
// pairs: both servers running (an idle one uses no CPU: -v prints what
// each used outside its own blocks), each row warmed up as usual, then the
// two rows take turns in --blocks blocks each of about n/blocks requests,
// in ABBA order (A B B A A B ...; an even number cancels a linear drift).
// A row's samples are pooled over its blocks; its CPU per job is what its
// server's tree used over its own blocks, each read from its start until
// the tree is quiet after its last answer (no process came or went, its
// CPU moved by less than 50 µs in 10 ms); a throughput row's jobs/s is its
// jobs over its blocks' summed wall time (each block starts with the
// spares ready and ends draining the last requests: once per block
// instead of once per series, alike for both rows of a pair).
// --blocks=1 measures each row of a pair in one block, one after the
// other. The other rows are measured one series after another.
//
// Every ratio is a time ratio against the pynox row it names: above 1 means
// slower (or, for throughput, fewer jobs per second) than pynox. Nothing is
// asserted; the numbers are for reading.
//
// Charts (rows 26 and 27): a job that draws a line with matplotlib.pyplot
// and shows it, checked to come back as exactly one image/png output,
// sequential with think time, through a pool without preloads and one
// with --preload=matplotlib.pyplot. A chart job without the preload
// imports matplotlib itself (about a second), so these rows take
// max(5, n/10) samples after at most 2 warm-up jobs.
//
// Sessions: sequential trivial steps in one live session, and the first
// step of a new session (its checkout included), one new session per
// sample, closed after it unmeasured. Host functions:
// one job calling a host function n times, each call answered by this
// command as a JSON Lines client would. Mounts (row 25): trivial jobs given
// one read-only mount each, against row 1 (a plain trivial job).
//
// pynox serve (rows W1-W3): `pynox serve` on a loopback port, driven over
// one WebSocket on /v1/pool by the same protocol client (jsonl.Client),
// trivial jobs with and without think time and at throughput, against
// rows 1, 2 and 13 over the pipe. Sessions' memory (M11, M12): a
// session's process idle after one step. --only=serve or --only=memory
// measures just those rows (and the pipe rows W1-W3 compare to).
// Virtual mounts (rows 28, 29): on a pool with confine_self = false,
// trivial jobs given one read-only mount at /data (a mount namespace
// each), against plain trivial jobs on the same pool.
package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

// pandasRows are the rows, and memory rows, that need pandas.
var pandasRows = []string{"3", "4", "5", "8", "9", "10", "12", "14", "16", "19", "21", "23", "24", "L3", "L4", "L6",
	"R6", "R7", "R8", "R9", "R10", "M5", "M6", "M7", "M8", "M9", "M10", "M12"}

// chartRows are the rows that need matplotlib.
var chartRows = []string{"26", "27"}

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
	chartCode    = "import matplotlib.pyplot as plt; plt.plot([1, 2, 3]); plt.show()"
	chartPreload = "matplotlib.pyplot"
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
	blocks      int
	workers     int
	pandas      string
	matplotlib  string
	json        bool
	skipMemory  bool
	only        string
	verbose     bool
	progress    io.Writer
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, ok := parseOptions(args, stderr)
	if !ok {
		return 2
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

// parseOptions parses the command line, filling in the defaults that
// depend on other flags; on a bad one it says why on stderr and returns
// false.
func parseOptions(args []string, stderr io.Writer) (options, bool) {
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
	fs.IntVar(&o.blocks, "blocks", defaultBlocks, "blocks per row of an interleaved pair (the rows of R1-R10, rows 28 and 29): the pair's rows take turns in blocks of about n/blocks requests, in ABBA order; 1 measures one row, then the other")
	fs.IntVar(&o.inflight, "inflight", 8, "requests kept outstanding in the throughput series")
	fs.IntVar(&o.workers, "workers", 2, "workers of the pynox pool and the naive server")
	fs.StringVar(&o.pandas, "pandas", "auto", "pandas rows: auto (when the python can import pandas), on (required), off")
	fs.StringVar(&o.matplotlib, "matplotlib", "auto", "chart rows (#26, #27): auto (when the python can import matplotlib), on (required), off")
	fs.BoolVar(&o.json, "json", false, "print the results as one JSON document instead of the table")
	fs.BoolVar(&o.skipMemory, "skip-memory", false, "skip the memory rows")
	fs.StringVar(&o.only, "only", "", "measure only one group of rows: serve (W1-W3, a trivial job over pynox serve's WebSocket on loopback, with rows 1, 2 and 13 over the pipe to compare), memory (M1-M8, M11, M12: templates, spares, job children and idle sessions), limit (rows 1, 2, 13 against the limit loop's L1, L2, L5, with R1-R5), sessions (session steps 17, 18 and host calls 20, with rows 1 and 2) or mounts (rows 28, 29: a job with a read-only mount at /data against a plain job)")
	fs.BoolVar(&o.verbose, "v", false, "report progress on stderr")
	if err := fs.Parse(args); err != nil {
		return o, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pynox-bench: unexpected argument %q\n", fs.Arg(0))
		return o, false
	}
	switch o.pandas {
	case "auto", "on", "off":
	default:
		fmt.Fprintf(stderr, "pynox-bench: --pandas must be auto, on or off, not %q\n", o.pandas)
		return o, false
	}
	if _, ok := onlyGroups[o.only]; o.only != "" && !ok {
		fmt.Fprintf(stderr, "pynox-bench: --only=%s: expected one of %s\n", o.only, onlyNames())
		return o, false
	}
	switch o.matplotlib {
	case "auto", "on", "off":
	default:
		fmt.Fprintf(stderr, "pynox-bench: --matplotlib must be auto, on or off, not %q\n", o.matplotlib)
		return o, false
	}
	if o.n < 1 || o.inflight < 1 || o.workers < 1 || o.coldPandasN < 1 || o.blocks < 1 || o.gap < 0 {
		fmt.Fprintln(stderr, "pynox-bench: --n, --inflight, --workers, --cold-pandas-n and --blocks must be positive, --gap not negative")
		return o, false
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
	return o, true
}
