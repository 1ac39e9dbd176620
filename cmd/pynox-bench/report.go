package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

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
	// Limit is pynox as a ratio of the limit loop, measure by measure.
	Limit  []*LimitRow `json:"limit"`
	Memory []*MemRow   `json:"memory"`
	// StartupMS is each server's time from start to its ready line.
	StartupMS map[string]float64 `json:"startup_ms"`
	Elapsed   string             `json:"elapsed"`

	// blocks are the blocks of the interleaved pairs, in the order they
	// ran (not printed).
	blocks []blockRecord
}

// PythonInfo names the interpreter every contender ran.
type PythonInfo struct {
	Requested string `json:"requested"`
	Path      string `json:"path"`
	Version   string `json:"version"`
	Pandas    string `json:"pandas,omitempty"`
	Numpy     string `json:"numpy,omitempty"`
	PandasErr string `json:"pandas_error,omitempty"`
	// Matplotlib is matplotlib's version, MatplotlibErr why it could not
	// be imported.
	Matplotlib    string `json:"matplotlib,omitempty"`
	MatplotlibErr string `json:"matplotlib_error,omitempty"`
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
	// CPU the server's whole process tree used per measured request
	// (user+system, from /proc/<pid>/stat of the tree), and its split:
	// the server process itself (pynox's Go host; the Python loop of the
	// naive server and the limit loop), pynox's templates, and the
	// processes that ran the jobs. Measured from after the warm-up
	// requests to the last answer.
	CPUPerJobUS    float64 `json:"cpu_per_job_us,omitempty"`
	CPUHostUS      float64 `json:"cpu_host_us,omitempty"`
	CPUTemplatesUS float64 `json:"cpu_templates_us,omitempty"`
	CPUChildrenUS  float64 `json:"cpu_children_us,omitempty"`
	// Vs names the pynox row this one is compared to, Ratio the time
	// ratio (above 1: slower than it).
	Vs      string  `json:"vs,omitempty"`
	Ratio   float64 `json:"ratio,omitempty"`
	Skipped string  `json:"skipped,omitempty"`

	rtts []time.Duration
}

// LimitRow is one measure of pynox as a ratio of the same measure of the
// limit loop (limit_loop.py), taken in the same run.
type LimitRow struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// What is compared: CPU per job ("cpu", microseconds), throughput
	// ("jobs/s") or the median client round trip ("rtt", microseconds).
	Measure string `json:"measure"`
	// The rows compared.
	PynoxRow string  `json:"pynox_row"`
	LimitRow string  `json:"limit_row"`
	Pynox    float64 `json:"pynox"`
	Limit    float64 `json:"limit"`
	// Ratio is pynox over the limit: for CPU and round trips the times
	// pynox takes, for throughput the share of the limit's jobs/s pynox
	// reaches.
	Ratio   float64 `json:"ratio,omitempty"`
	Skipped string  `json:"skipped,omitempty"`
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

func (r *Report) limit(id string) *LimitRow {
	for _, x := range r.Limit {
		if x.ID == id {
			return x
		}
	}
	panic("no limit row " + id)
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
	add("L1", lat, "limit loop       trivial     gap=G", "1")
	add("L2", lat, "limit loop       trivial     gap=0", "2")
	add("L3", lat, "limit+pandas     trivial     gap=G", "3")
	add("L4", lat, "limit+pandas     trivial     gap=0", "4")
	add("W1", lat, "pynox serve, ws  trivial     gap=G", "1")
	add("W2", lat, "pynox serve, ws  trivial     gap=0", "2")
	add("6", lat, "naive            trivial     gap=G", "1")
	add("7", lat, "naive            trivial     gap=0", "2")
	add("8", lat, "naive+pandas     trivial     gap=G", "3")
	add("9", lat, "naive+pandas     trivial     gap=0", "4")
	add("10", lat, "naive+pandas     pandas-job  gap=G", "5")
	add("11", lat, "cold python -c   trivial", "1")
	add("12", lat, "cold python -c   import pandas", "5")
	add("13", thr, "pynox            trivial", "")
	add("14", thr, "pynox+pandas     trivial", "13")
	add("L5", thr, "limit loop       trivial", "13")
	add("L6", thr, "limit+pandas     trivial", "14")
	add("W3", thr, "pynox serve, ws  trivial", "13")
	add("15", thr, "naive            trivial", "13")
	add("16", thr, "naive+pandas     trivial", "14")
	add("17", "sessions", "pynox session     step        gap=G", "1")
	add("18", "sessions", "pynox session     step        gap=0", "2")
	add("19", "sessions", "pynox+pandas ses. step        gap=G", "3")
	add("22", "sessions", "pynox session     first step  gap=G", "1")
	add("23", "sessions", "pynox+pandas ses. first step  gap=G", "3")
	add("24", "sessions", "pynox+pandas ses. step        gap=0", "4")
	add("20", "host", "pynox            host call", "")
	add("21", "host", "pynox+pandas     host call", "20")
	add("25", lat, "pynox ro-mount   trivial     gap=G", "1")
	add("26", lat, "pynox            chart-job   gap=G", "")
	add("27", lat, "pynox+pyplot     chart-job   gap=G", "26")
	add("28", lat, "pynox unconfined trivial     gap=G", "")
	add("29", lat, "pynox ro-mount /data trivial gap=G", "28")
	addLimit := func(id, name, measure, pynoxRow, limitRow string) {
		r.Limit = append(r.Limit, &LimitRow{ID: id, Name: name, Measure: measure, PynoxRow: pynoxRow, LimitRow: limitRow})
	}
	addLimit("R1", "CPU per job, at throughput", "cpu", "13", "L5")
	addLimit("R2", "throughput, trivial jobs", "jobs/s", "13", "L5")
	addLimit("R3", "round trip, think time gap=G", "rtt", "1", "L1")
	addLimit("R4", "round trip, back to back", "rtt", "2", "L2")
	addLimit("R5", "CPU per job, think time gap=G", "cpu", "1", "L1")
	addLimit("R6", "+pandas CPU per job, at throughput", "cpu", "14", "L6")
	addLimit("R7", "+pandas throughput, trivial jobs", "jobs/s", "14", "L6")
	addLimit("R8", "+pandas round trip, think time gap=G", "rtt", "3", "L3")
	addLimit("R9", "+pandas round trip, back to back", "rtt", "4", "L4")
	addLimit("R10", "+pandas CPU per job, think time gap=G", "cpu", "3", "L3")
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
	addMem("M11", "pynox        session process, idle", "")
	addMem("M12", "pynox+pandas session process, idle", "")
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
	for _, l := range r.Limit {
		l.Name = strings.ReplaceAll(l.Name, "gap=G", "gap="+g)
		p, q := r.row(l.PynoxRow), r.row(l.LimitRow)
		if l.Skipped != "" || p.Skipped != "" || q.Skipped != "" {
			continue
		}
		switch l.Measure {
		case "cpu":
			l.Pynox, l.Limit = p.CPUPerJobUS, q.CPUPerJobUS
		case "jobs/s":
			l.Pynox, l.Limit = p.JobsPerS, q.JobsPerS
		default:
			l.Pynox, l.Limit = p.MedianUS, q.MedianUS
		}
		if l.Limit > 0 {
			l.Ratio = l.Pynox / l.Limit
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
	if py.Matplotlib != "" {
		fmt.Fprintf(w, ", matplotlib %s", py.Matplotlib)
	} else if py.MatplotlibErr != "" {
		fmt.Fprintf(w, ", matplotlib: %s", py.MatplotlibErr)
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
				fmt.Fprintf(w, "%-4s %-38s %5s %9s %9s %9s %9s %9s   %s\n", "#", "benchmark", "n", "median", "p99", "srv-dur", "srv-queue", "cpu/job", "vs pynox")
			case "throughput":
				fmt.Fprintln(w)
				fmt.Fprintln(w, "THROUGHPUT: trivial jobs, requests kept in flight as stated in the run line; median/p99 = round trip under load")
				fmt.Fprintf(w, "%-4s %-38s %5s %9s %9s %9s %9s %9s   %s\n", "#", "benchmark", "n", "jobs/s", "median", "p99", "srv-dur", "cpu/job", "vs pynox")
			case "sessions":
				fmt.Fprintln(w)
				fmt.Fprintln(w, "SESSIONS: trivial steps in one live session (__main__ kept), sequential, client-side round trip;")
				fmt.Fprintln(w, "          first step = a new session's first request (checkout + first step), one new session per sample")
				fmt.Fprintf(w, "%-4s %-38s %5s %9s %9s %9s %9s %9s   %s\n", "#", "benchmark", "n", "median", "p99", "srv-dur", "srv-queue", "cpu/job", "vs pynox")
			case "host":
				fmt.Fprintln(w)
				fmt.Fprintln(w, "HOST FUNCTIONS: one job calls a host function n times; round trip = client writes a reply until the next call event arrives (a cheap host function, run on the client's reader: jsonl.Client.SetInlineHost)")
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
			fmt.Fprintf(w, "%-4s %-38s %5d %9.0f %9s %9s %9s %9s   %s\n", x.ID, x.Name, x.N, x.JobsPerS,
				fmtMS(x.MedianUS), fmtMS(x.P99US), fmtMS(x.ServerDurUS), fmtMS(x.CPUPerJobUS), vs)
		} else if x.Section == "host" {
			fmt.Fprintf(w, "%-4s %-38s %5d %9s %9s   %s\n", x.ID, x.Name, x.N, fmtMS(x.MedianUS), fmtMS(x.P99US), vs)
		} else {
			fmt.Fprintf(w, "%-4s %-38s %5d %9s %9s %9s %9s %9s   %s\n", x.ID, x.Name, x.N,
				fmtMS(x.MedianUS), fmtMS(x.P99US), fmtMS(x.ServerDurUS), fmtMS(x.ServerQueueUS), fmtMS(x.CPUPerJobUS), vs)
		}
	}
	fmt.Fprintln(w)
	if len(r.Limit) > 0 { // --only leaves it out
		r.printLimit(w)
		fmt.Fprintln(w)
	}
	if len(r.Memory) > 0 {
		fmt.Fprintln(w, "MEMORY: /proc/<pid>/smaps_rollup; PSS splits each shared page among its sharers (a template shares")
		fmt.Fprintln(w, "        nearly all its pages copy-on-write with its spare), USS = private pages, RSS = all resident pages")
		fmt.Fprintf(w, "%-4s %-52s %12s %12s %12s   %s\n", "#", "process", "PSS", "USS", "RSS", "PSS vs pynox")
	}
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
	for _, k := range []string{"pynox", "pynox+pandas", "pynox+pyplot", "pynox-serve", "limit", "limit+pandas", "naive", "naive+pandas"} {
		if v, ok := r.StartupMS[k]; ok {
			fmt.Fprintf(w, "  %s %s", k, fmtMS(v*1000))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "\nratios: time ratio against the pynox row named (above 1 = slower; throughput: pynox jobs/s over this row's);\n")
	fmt.Fprintf(w, "srv-dur/srv-queue: medians of the server's own duration_us/queue_us (naive, limit: hand-over to reap);\n")
	fmt.Fprintf(w, "chart-job (#26, #27): one matplotlib line chart shown as one PNG output, max(5, n/10) samples after at most 2 warm-up jobs;\n")
	fmt.Fprintf(w, "cpu/job: user+system CPU of the server's whole process tree per measured request. total run %s\n", r.Elapsed)
}

// printLimit prints pynox as a ratio of the limit loop.
func (r *Report) printLimit(w io.Writer) {
	fmt.Fprintln(w, "LIMIT: pynox against the minimal confined fork-per-job loop of the same run (limit_loop.py: a spare per")
	fmt.Fprintln(w, "       worker with pynox's seccomp layers, Landlock rules and rlimits; no protocol, cgroups or PID namespace)")
	fmt.Fprintf(w, "%-4s %-38s %9s %9s %12s   %s\n", "#", "measure", "limit", "pynox", "pynox/limit", "CPU split host/templates/children, pynox | limit")
	split := func(x *Row) string {
		f := func(us float64) string { return strconv.FormatFloat(us/1000, 'f', 2, 64) }
		return f(x.CPUHostUS) + "/" + f(x.CPUTemplatesUS) + "/" + f(x.CPUChildrenUS)
	}
	for _, l := range r.Limit {
		if l.Skipped != "" || l.Ratio == 0 {
			reason := l.Skipped
			if reason == "" {
				reason = "not measured"
			}
			fmt.Fprintf(w, "%-4s %-38s %s\n", l.ID, l.Name, "skipped: "+reason)
			continue
		}
		switch l.Measure {
		case "jobs/s":
			fmt.Fprintf(w, "%-4s %-38s %9.0f %9.0f %12s   #%s vs #%s, jobs/s\n", l.ID, l.Name, l.Limit, l.Pynox,
				fmt.Sprintf("%.0f%%", 100*l.Ratio), l.PynoxRow, l.LimitRow)
		case "cpu":
			fmt.Fprintf(w, "%-4s %-38s %9s %9s %12s   #%s vs #%s, %s | %s ms\n", l.ID, l.Name, fmtMS(l.Limit), fmtMS(l.Pynox),
				fmt.Sprintf("%.2fx", l.Ratio), l.PynoxRow, l.LimitRow, split(r.row(l.PynoxRow)), split(r.row(l.LimitRow)))
		default:
			fmt.Fprintf(w, "%-4s %-38s %9s %9s %12s   #%s vs #%s, median\n", l.ID, l.Name, fmtMS(l.Limit), fmtMS(l.Pynox),
				fmt.Sprintf("%.2fx", l.Ratio), l.PynoxRow, l.LimitRow)
		}
	}
}

// setCPU records the CPU c the server's tree used over n requests.
func (row *Row) setCPU(c cpuTimes, n int) {
	if n <= 0 {
		return
	}
	per := func(sec float64) float64 { return sec * 1e6 / float64(n) }
	row.CPUPerJobUS = per(c.total())
	row.CPUHostUS, row.CPUTemplatesUS, row.CPUChildrenUS = per(c.host), per(c.templates), per(c.children)
}

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
