package pynox

import (
	"encoding/json"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Job is one request: a piece of Python code and the permissions and
// limits it runs under. Field names and meanings are those of the pool
// protocol's request line, whose JSON tags the fields carry; durations and
// sizes are time.Duration and bytes here, as in [Limits], and the protocol
// layer (jsonl.Serve) turns the line's "5s" and "512m" into them. Zero
// values mean "not set": the pool's ceiling supplies the default.
type Job struct {
	// ID is echoed in the result as given: a string or a number (in JSON,
	// kept exactly as written). Nil is echoed as null.
	ID any `json:"id,omitempty"`
	// Code is inline Python source. Exactly one of Code and Script is
	// required.
	Code string `json:"code,omitempty"`
	// Script is the path of a Python file, read by the pool (not by the
	// job); it must lie beneath the ceiling. Relative paths resolve against
	// the pool's working directory.
	Script string `json:"script,omitempty"`
	// Name is the file name tracebacks and error locations use for inline
	// code; it defaults to "<code>" (and to the script's path for scripts).
	Name string `json:"name,omitempty"`
	// Args become sys.argv[1:].
	Args []string `json:"args,omitempty"`
	// AllowRead lists files and directories the job may read.
	AllowRead []string `json:"allow_read,omitempty"`
	// AllowWrite lists files and directories the job may read and write.
	AllowWrite []string `json:"allow_write,omitempty"`
	// Mounts give the job host directories or files, read-only or
	// read-write (see [MountSpec]); they are grants like AllowRead and
	// AllowWrite, checked against the same ceiling.
	Mounts []MountSpec `json:"mounts,omitempty"`
	// PackageDirs are read-only directories put first on sys.path for this
	// job only; they must lie beneath the ceiling's read paths.
	PackageDirs []string `json:"package_dirs,omitempty"`
	// Env is added to the job's minimal fixed environment.
	Env map[string]string `json:"env,omitempty"`
	// AllowNetwork lets the job create TCP/UDP (IPv4 and IPv6) sockets; the
	// ceiling must allow it.
	AllowNetwork bool `json:"allow_network,omitempty"`
	// Timeout is the job's wall-clock limit, from hand-over to its child
	// process until its result.
	Timeout time.Duration `json:"-"`
	// Memory is the job's memory allowance on top of the template it
	// shares (see the package docs, "Limits"), in bytes.
	Memory int64 `json:"-"`
	// MaxOutput is how many bytes of each of stdout and stderr are kept.
	MaxOutput int `json:"max_output,omitempty"`
	// MaxFileSize is the largest size of each file the job writes; a write
	// beyond it fails with OSError (EFBIG). It bounds each file, not the
	// total a job writes. In bytes.
	MaxFileSize int64 `json:"-"`
	// Profile names one of the pool's profiles, whose fields come first;
	// this request's own fields are added on top.
	Profile string `json:"profile,omitempty"`
	// Functions declares the host functions the job may call: each name
	// becomes a function of the job's pynox_host module. At most
	// MaxFunctions names, each a Python identifier not starting with "_".
	Functions []string `json:"functions,omitempty"`
	// Tools declares host functions with a docstring and a signature (see
	// [Tool]), beside Functions; a name may appear in only one of them,
	// and both together hold at most MaxFunctions. The pool protocol
	// carries them as objects in "functions".
	Tools []Tool `json:"-"`
	// Inputs become globals of the job's __main__ before its code runs:
	// each name an ASCII Python identifier that is not a keyword nor a
	// dunder name, each value anything encoding/json encodes (it arrives
	// as Python's json module decodes it), all together at most
	// MaxInputsBytes of JSON. Anything else is a RequestError.
	Inputs map[string]any `json:"inputs,omitempty"`
	// Collect names files to attach to the result (Result.Files): glob
	// patterns (filepath.Match, per path component), absolute, relative
	// to the pool's directory, or beginning with "$TMPDIR/" (the job's
	// scratch directory), each beneath one of the job's write grants or
	// its scratch directory; at most MaxCollectPatterns. Files the job
	// writes to $PYNOX_OUTPUTS are attached without being named. A
	// Checkout's job takes none: each Step names its own.
	Collect []string `json:"collect,omitempty"`
	// Host answers the job's calls to its Functions and Tools. [Pool.Run] needs it
	// when Functions are declared; a [Checkout] without it hands each call
	// to its caller as a [TurnEvent].
	Host HostFunc `json:"-"`
	// OnOutput, when set, receives the job's stdout and stderr while it
	// runs, besides the Result's Stdout and Stderr; see [OutputFunc] for
	// the order, the bound on memory and what a slow callback does. For a
	// [Checkout], it is the default of each Step's OnOutput.
	OnOutput OutputFunc `json:"-"`
	// OnDisplay, when set, receives the job's rich outputs (figures,
	// tables: see Result.Outputs) while it runs, besides the Result's
	// Outputs; see [DisplayFunc]. For a [Checkout], it is the default of
	// each Step's OnDisplay.
	OnDisplay DisplayFunc `json:"-"`

	// trace is the span context of the job's span (or of its step's),
	// whose trace id the job's log record carries.
	trace trace.SpanContext
}

// withProfile merges the named profile under j's own fields: lists are
// joined (profile first), env merged (the request wins), the network
// granted if either grants it, and the request's scalars override.
func (j Job) withProfile(p Profile) Job {
	join := func(a, b []string) []string {
		if len(a) == 0 {
			return b
		}
		return append(append([]string(nil), a...), b...)
	}
	j.AllowRead = join(p.AllowRead, j.AllowRead)
	j.AllowWrite = join(p.AllowWrite, j.AllowWrite)
	j.PackageDirs = join(p.PackageDirs, j.PackageDirs)
	if len(p.Env) > 0 {
		env := make(map[string]string, len(p.Env)+len(j.Env))
		for k, v := range p.Env {
			env[k] = v
		}
		for k, v := range j.Env {
			env[k] = v
		}
		j.Env = env
	}
	j.AllowNetwork = j.AllowNetwork || p.AllowNetwork
	if j.Timeout == 0 {
		j.Timeout = p.Timeout
	}
	if j.Memory == 0 {
		j.Memory = p.Memory
	}
	if j.MaxOutput == 0 {
		j.MaxOutput = p.MaxOutput
	}
	if j.MaxFileSize == 0 {
		j.MaxFileSize = p.MaxFileSize
	}
	return j
}

// Result is the answer to one [Job]. Its JSON form is the result line of
// `pynox pool`.
type Result struct {
	// ID is the job's ID, as given.
	ID any `json:"id"`
	// Exit is the process's exit status when it ended on its own (0 for
	// success, 1 for an uncaught exception, n for sys.exit(n)); -1 when the
	// job never ran or was killed (RequestError, TimeoutError, SignalError,
	// SandboxSetupError, PoolWorkerError).
	Exit int `json:"exit"`
	// Stdout and Stderr hold what the job wrote to descriptors 1 and 2, up
	// to MaxOutput bytes each. The traceback of an uncaught exception is in
	// Stderr.
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Error describes why the job failed, or is nil.
	Error *ErrorInfo `json:"error"`
	// StdoutTruncated and StderrTruncated report output dropped beyond
	// MaxOutput.
	StdoutTruncated bool `json:"stdout_truncated"`
	StderrTruncated bool `json:"stderr_truncated"`
	// DurationMS and DurationUS are the job's run time, from hand-over to
	// its child process until its result, in milliseconds (rounded) and
	// microseconds.
	DurationMS int64 `json:"duration_ms"`
	DurationUS int64 `json:"duration_us"`
	// QueueUS is the time from accepting the request to hand-over.
	QueueUS int64 `json:"queue_us"`
	// Runtime describes the interpreter that ran the job.
	Runtime Runtime `json:"runtime"`
	// Policy is what was enforced for the job; nil when nothing ran
	// because the request was refused.
	Policy *Policy `json:"policy"`
	// Session and Step identify a session's step (the first step of a
	// session's process is 1); both are empty for one-shot jobs.
	Session string `json:"session,omitempty"`
	Step    int    `json:"step,omitempty"`
	// SessionEnded is set when the step ended the session's process (an
	// exit, a timeout, a crash): the session's next step starts a new one.
	SessionEnded bool `json:"session_ended,omitempty"`
	// Restarted is set on the first step (Step 1) of a session's
	// replacement process: the one started after an earlier process of
	// the same session ended (an exit, a crash, a timeout, a cancelled
	// step, or its template's death between steps), so __main__ starts
	// empty again. It is never set on the first process of a session.
	Restarted bool `json:"restarted,omitempty"`
	// Restored is set on the first step after the pool restored the
	// session from the dump it made when the session was idle (see
	// Config.SessionIdleDump).
	Restored bool `json:"restored,omitempty"`
	// Calls counts the host-function calls the job (or step) made.
	Calls int `json:"calls,omitempty"`
	// Value is the JSON encoding of the value of the code's last
	// statement, when that is an expression (REPL style) whose value is
	// not None and json.dumps encodes it, within MaxValueBytes, as every
	// client reads it back the same. Otherwise such a value's repr, cut to
	// MaxValueReprBytes, is in ValueRepr. Both are empty when the code
	// did not end in an expression, its value was None, or it raised.
	// The value is computed and encoded in the job's own confined process
	// and is not printed.
	Value     json.RawMessage `json:"value,omitempty"`
	ValueRepr string          `json:"value_repr,omitempty"`
	// Files are the files the job (or step) left that Collect named or
	// that it wrote to $PYNOX_OUTPUTS, read by the pool without following
	// any link (see File); FilesTruncated is set when some were left out
	// or listed without their contents (MaxFiles, MaxFilesBytes).
	Files          []File `json:"files,omitempty"`
	FilesTruncated bool   `json:"files_truncated,omitempty"`
	// Usage is the job's (or step's) resource usage as the kernel counted
	// it (see Usage); nil when nothing ran or the figures could not be
	// read.
	Usage *Usage `json:"usage,omitempty"`
	// Outputs are the job's rich outputs, in the order it showed them:
	// each matplotlib figure shown with plt.show() or still open when the
	// code ends (image/png), each object passed to pynox_display.display,
	// and the HTML table of a pandas DataFrame (any value with a rich
	// representation) that is the last expression's value. They are
	// bounded by MaxOutputs and MaxOutputsBytes; when some were dropped
	// (beyond the bounds, or refused by the pool's checks) OutputsDropped
	// counts them and a text/plain marker ends Outputs.
	Outputs        []Output `json:"outputs,omitempty"`
	OutputsDropped int      `json:"outputs_dropped,omitempty"`

	kind Kind // set by the pool: tells a Python TimeoutError from the pool's
	// cancelled marks a job a cancel request ended (counted apart: its
	// code neither raised nor exited).
	cancelled bool
}

// ErrorInfo describes a failed job.
type ErrorInfo struct {
	// Type is the Python exception class, or one of RequestError,
	// TimeoutError, SignalError, SandboxSetupError, PoolWorkerError. A
	// job's exception class named like one of those five is qualified by
	// its module ("builtins.TimeoutError", "__main__.RequestError"), so
	// the five bare names are only ever the pool's verdicts.
	Type string `json:"type"`
	// Message is the exception's message, or the pool's explanation.
	Message string `json:"message"`
	// File and Line locate the error in the script or inline code, when
	// known.
	File *string `json:"file"`
	Line *int    `json:"line"`
	// Hint suggests a fix for permission, memory and file-size errors.
	Hint string `json:"hint,omitempty"`
}

// Runtime describes the interpreter of a result.
type Runtime struct {
	Name             string   `json:"name"`   // always "pynox"
	Python           string   `json:"python"` // e.g. "3.11.2"
	Mode             string   `json:"mode"`   // "pool"
	PreloadedModules []string `json:"preloaded_modules"`
}

// Policy reports the confinement a job ran under.
type Policy struct {
	AllowRead    []string `json:"allow_read"`   // absolute, symlink-free paths
	AllowWrite   []string `json:"allow_write"`  // absolute, symlink-free paths
	Network      string   `json:"network"`      // "allow" or "deny"
	Subprocesses string   `json:"subprocesses"` // always "deny"
	TimeoutMS    int64    `json:"timeout_ms"`
	MemoryBytes  int64    `json:"memory_bytes"`
	Backend      string   `json:"backend"` // "landlock+seccomp"
	// Cgroups is the per-job cgroup backend that bounded the job's tasks
	// and memory: "v2", "v1" or "none" (see Config.Cgroups).
	Cgroups string `json:"cgroups"`
	// Mounts are the job's mounts as enforced: host paths resolved (and
	// symlink-free), modes explicit. They are also listed in AllowRead or
	// AllowWrite.
	Mounts []MountSpec `json:"mounts,omitempty"`
	// Scratch is the job's private scratch directory (its TMPDIR and
	// HOME), removed when the job or session ends.
	Scratch string `json:"scratch,omitempty"`
}

// Err returns the result's failure as an *Error (nil for a job that
// exited 0), so that callers can test it with errors.Is against the
// sentinels: a Python exception or non-zero exit is ErrRuntime.
func (r *Result) Err() error {
	if r.Error == nil {
		if r.Exit == 0 {
			return nil
		}
		return &Error{Kind: KindRuntime, Type: "SystemExit", Message: "exit status " + strconv.Itoa(r.Exit)}
	}
	k := r.kind
	if k == 0 {
		k = KindRuntime
		for kind, name := range kindNames {
			if name == r.Error.Type && kind >= KindRequest && kind <= KindCrashed {
				k = kind
			}
		}
	}
	return &Error{Kind: k, Type: r.Error.Type, Message: r.Error.Message}
}
