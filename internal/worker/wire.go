package worker

// The types that cross the worker boundary: a job, its limits and host
// calls going in, the outcome coming out, and the control frames between.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Limits are the request-dependent rlimits of a job.
type Limits struct {
	Memory  int64 `json:"memory"` // address space on top of the template's
	Fsize   int64 `json:"fsize"`  // RLIMIT_FSIZE
	CPUSecs int64 `json:"cpu"`    // RLIMIT_CPU backstop
	// SessionCPU is a session's hard RLIMIT_CPU: the CPU time of its whole
	// life. Run sets it to SessionCPU when it is zero.
	SessionCPU int64 `json:"session_cpu,omitempty"`
}

// SessionCPU is the CPU time, in seconds, of a session's whole life: its
// hard RLIMIT_CPU. A process cannot raise its own hard limit (nor can the
// pool without CAP_SYS_RESOURCE, which root in a container often lacks),
// so a session's is set once, when it is confined, and bounds what its
// code can get by raising its soft limit and ignoring SIGXCPU. Each turn
// is held to its own allowance (its CPUSecs) by the pool, which reads the
// process's CPU clock while the turn runs. A session that reaches it is
// killed, and the next step starts a new process.
const SessionCPU = 3600

// Job is what a child needs to confine itself and run one piece of code.
type Job struct {
	Code    string            // source text
	Name    string            // file name for tracebacks
	Script  bool              // the code came from a script file (__file__ is set)
	Argv    []string          // sys.argv[1:]
	Env     map[string]string // added to the base environment
	Path    []string          // package dirs, first on sys.path
	Grants  []Grant           // Landlock rules beyond the runtime's
	Network bool
	Limits  Limits

	Timeout   time.Duration // killed after this long; 0 = no timeout
	MaxOutput int           // bytes kept of each of stdout and stderr
	Output    OutputFunc    // streams stdout and stderr as they come, or nil
	Display   DisplayFunc   // streams rich outputs as they come, or nil

	// Session keeps the process and its __main__ after the code ends, for
	// RunStep.
	Session bool
	// Functions are the host functions the job may call (pynox_host).
	Functions []string
	// Tools describe some of the Functions: docstring and signature.
	Tools    []Tool
	Host     HostFunc // answers the calls of the first turn
	MaxCalls int      // calls allowed per turn
	// Inputs is a JSON object whose members become globals of __main__
	// before the code runs; the caller checked it (names, size).
	Inputs json.RawMessage

	// Ctx, when set, is the parent of the turn's host calls' contexts:
	// they carry its values and end with it (and at the turn's deadline).
	Ctx context.Context
	// Interrupt, when closed, sends the running code SIGINT (see
	// Step.Interrupt); nil for none.
	Interrupt <-chan struct{}

	// Namespace, when set, holds the user and mount namespace the child
	// enters before its Landlock and seccomp job layers (a child taken
	// with Template.TakeNS); the caller keeps the descriptors open until
	// Run returns.
	Namespace *Namespace

	// Restore is a session dump's pickle (Child.Dump's output) that the
	// process loads into its __main__, inside its sandbox, before the
	// first code runs; nil for none. It travels in a sealed memfd.
	Restore []byte
}

// Tool describes a host function for the runner: its docstring and its
// parsed signature (pynox.Signature as JSON; nil for none).
type Tool struct {
	Name      string          `json:"name"`
	Doc       string          `json:"doc,omitempty"`
	Signature json.RawMessage `json:"signature,omitempty"`
}

// MaxCall bounds a host call's JSON arguments and its JSON result.
const MaxCall = 1 << 20

// Call is a host-function call a job made.
type Call struct {
	Function string
	Args     json.RawMessage // a JSON array
	Kwargs   json.RawMessage // a JSON object
}

// Reply answers a Call: a JSON result, or an error message that the job
// sees as pynox_host.HostError.
type Reply struct {
	Result json.RawMessage
	Error  *string
	// ErrorType names the builtin exception type the job sees with Error
	// (one of the runner's HOST_ERROR_TYPES; the class it raises derives
	// from that type and from HostError). Empty for HostError itself.
	ErrorType string
}

// HostFunc answers a job's host call. It runs on its own goroutine and
// must return soon after ctx ends (the turn ended: its reply is no longer
// wanted).
type HostFunc func(ctx context.Context, call Call) Reply

// Grant is one Landlock rule: an O_PATH descriptor the host opened and
// verified, and the rights it gives. Run sends the descriptor; the caller
// still owns it.
type Grant struct {
	Fd     int
	Access uint64
}

// ErrorInfo is the child's account of a Python exception, as its runner
// reports it. It is not pynox.ErrorInfo: Errno and Filename are read only
// for the pool's hint and never reach a result, and the hint is the
// pool's, not the child's (result.go converts one into the other).
type ErrorInfo struct {
	Type     string  `json:"type"`
	Message  string  `json:"message"`
	File     *string `json:"file"`
	Line     *int    `json:"line"`
	Errno    *int    `json:"errno,omitempty"`
	Filename *string `json:"filename,omitempty"`
}

// Outcome is everything the host learned about one job.
type Outcome struct {
	Started     bool        // the child confined itself and began running user code
	SetupError  string      // a confinement step failed; no user code ran
	Done        bool        // the child reported completion
	Exit        int         // exit status the child reported (when Done)
	Error       *ErrorInfo  // the exception the child reported (when Done)
	Status      *ExitStatus // how the process ended, when known
	TimedOut    bool        // killed at Job.Timeout
	CPUExceeded bool        // a session's turn killed for using more CPU time than its allowance
	Canceled    bool        // killed because the caller's cancel channel closed
	Interrupted bool        // sent SIGINT because the Interrupt channel closed
	// InterruptKilled: killed because it had not ended InterruptGrace
	// after its interrupt.
	InterruptKilled bool
	Violation       string // the child broke the control protocol and was killed
	Stdout          []byte
	Stderr          []byte
	StdoutTrunc     bool
	StderrTrunc     bool
	Start           time.Time // when the job was handed to the child
	End             time.Time
	// Alive: the step ended and the session's process waits for the next.
	Alive bool
	Calls int // host calls the turn made
	// OOMKilled: the process died of SIGKILL and its cgroup's OOM counter
	// says the kernel killed it for exceeding its memory limit.
	OOMKilled bool
	// MemoryLimit is the memory limit of the child's cgroup in bytes; zero
	// without cgroups.
	MemoryLimit int64
	// Value is the JSON value of the code's last expression, checked
	// (MaxValue, checkCallJSON); ValueRepr its repr when it has none
	// (at most MaxValueRepr bytes). Both are empty when the code did not
	// end in an expression, or its value was None.
	Value     json.RawMessage
	ValueRepr string
	// Skipped: for a dump (Child.Dump), the globals that did not pickle.
	Skipped []string
	// Usage is the turn's resource usage as the kernel counted it (see
	// usage.go), or nil when it could not be read.
	Usage *Usage
	// Outputs are the turn's rich outputs, checked, in order (at most
	// MaxOutputs, MaxOutputsBytes of data); OutputsDropped counts those
	// refused or beyond the bounds, and DroppedWhy says why the first was.
	Outputs        []Output
	OutputsDropped int
	DroppedWhy     string

	// doneUsage holds the process's counters read when it reported its
	// end, before it was killed (turn.handle); nil when they could not be.
	doneUsage *Usage
}

type jobFrame struct {
	T       string            `json:"t"`
	Code    string            `json:"code"`
	Name    string            `json:"name"`
	Script  bool              `json:"script"`
	Argv    []string          `json:"argv"`
	Env     map[string]string `json:"env"`
	Path    []string          `json:"path"`
	Rules   []uint64          `json:"rules"`
	Network bool              `json:"network"`
	Limits  Limits            `json:"limits"`

	Session   bool     `json:"session,omitempty"`
	Step      int      `json:"step"`
	Functions []string `json:"functions,omitempty"`
	Tools     []Tool   `json:"tools,omitempty"`

	Inputs  json.RawMessage `json:"inputs,omitempty"`
	Restore bool            `json:"restore,omitempty"` // the last descriptor is a dump to load

	// NS: the two descriptors after the grants are the job's user and
	// mount namespaces (Job.Namespace); NSRules are Landlock rules on
	// paths inside it, opened after entering it.
	NS      bool     `json:"ns,omitempty"`
	NSRules []NSRule `json:"ns_rules,omitempty"`
	// NSEntered: the child entered its namespace before the job (an
	// "enter" frame), and the job's mounts are attached to it now; the
	// job brings no namespace descriptors.
	NSEntered bool `json:"ns_entered,omitempty"`
	// NSWait: the job's mounts are being attached; an "attached" frame
	// follows once they are (Namespace.Attach).
	NSWait bool `json:"ns_wait,omitempty"`
}

type stepFrame struct {
	T    string   `json:"t"`
	Step int      `json:"step"`
	Code string   `json:"code"`
	Name string   `json:"name"`
	Argv []string `json:"argv"`
	CPU  int64    `json:"cpu"`

	Inputs json.RawMessage `json:"inputs,omitempty"`
}

type replyFrame struct {
	T         string          `json:"t"`
	ID        int64           `json:"id"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *string         `json:"error,omitempty"`
	ErrorType string          `json:"error_type,omitempty"`
}

type childMsg struct {
	T     string     `json:"t"`
	Msg   string     `json:"msg"`
	Exit  *int       `json:"exit"`
	Error *ErrorInfo `json:"error"`
	Step  int        `json:"step"`
	Final bool       `json:"final"`
	// Skipped: a dump's report names the globals that did not pickle.
	Skipped []string `json:"skipped"`

	ID       int64           `json:"id"` // a call's id, unique in the child's life
	Function string          `json:"function"`
	Args     json.RawMessage `json:"args"`
	Kwargs   json.RawMessage `json:"kwargs"`

	Value     json.RawMessage `json:"value"`
	ValueRepr *string         `json:"value_repr"`

	// A display frame's output: its MIME type and data (a JSON string,
	// checked by checkOutput), or Dropped for one the runner did not send.
	MIME    string          `json:"mime"`
	Data    json.RawMessage `json:"data"`
	Dropped bool            `json:"dropped"`
}

// Step is one later piece of code for a session's process.
type Step struct {
	Code      string
	Name      string
	Argv      []string
	Timeout   time.Duration
	MaxOutput int
	CPUSecs   int64    // the step's CPU-time backstop
	Host      HostFunc // answers the step's host calls
	MaxCalls  int

	// Output streams the step's output as it comes, or is nil.
	Output OutputFunc
	// Display streams the step's rich outputs as they come, or is nil.
	Display DisplayFunc
	Inputs  json.RawMessage // as Job.Inputs
	// Ctx, when set, is the parent of the step's host calls' contexts:
	// they carry its values and end with it (and at the step's deadline).
	Ctx context.Context
	// Interrupt, when closed while the step runs, sends the process
	// SIGINT: the runner raises KeyboardInterrupt in the step's code (only
	// there: never in its own code, and a host call in flight finishes
	// first). A step that has not ended InterruptGrace later is killed.
	Interrupt <-chan struct{}
}

// MaxCallDepth bounds how deeply a host call's arguments nest (arrays and
// objects): Python's json module, in the client that answers the call,
// fails on a line nested some thousand levels deep.
const MaxCallDepth = 256

// MaxCallNumber bounds the length of a number in a host call's arguments:
// CPython refuses to convert an integer of more than 4,300 digits by
// default, so its json module fails on the line that holds one.
const MaxCallNumber = 4300

// checkCallJSON checks JSON that Go has already found valid (a call's
// arguments, written by the job) against what every client can decode:
// valid UTF-8, at most MaxCallDepth levels, numbers of at most
// MaxCallNumber characters, and no object that repeats a key (which
// parsers read differently). Honest calls pass: the runner encodes them
// with Python's json module, as ASCII, from Python lists and dicts.
func checkCallJSON(raw json.RawMessage) error {
	if !utf8.Valid(raw) {
		// Outside its strings JSON is ASCII: the bad bytes are in a string.
		return errors.New("a string is not valid UTF-8")
	}
	depth, num := 0, 0
	// colons counts the keys of the objects (a key is followed by a colon
	// outside strings): an object repeats one only when there are two,
	// and then alone is repeatedKey's decoding worth its cost (a call's
	// arguments are mostly a short array and an empty object).
	colons := 0
	inString, escaped := false, false
	for _, ch := range raw {
		if inString {
			switch {
			case escaped:
				escaped = false
			case ch == '\\':
				escaped = true
			case ch == '"':
				inString = false
			}
			continue
		}
		if ch == '-' || ch == '+' || ch == '.' || ch == 'e' || ch == 'E' || ('0' <= ch && ch <= '9') {
			// Outside strings these bytes belong to numbers only (the
			// literals true, false and null aside, which are short).
			if num++; num > MaxCallNumber {
				return fmt.Errorf("a number is longer than %d characters", MaxCallNumber)
			}
			continue
		}
		num = 0
		switch ch {
		case '"':
			inString = true
		case '[', '{':
			if depth++; depth > MaxCallDepth {
				return fmt.Errorf("they nest deeper than %d levels", MaxCallDepth)
			}
		case ']', '}':
			depth--
		case ':':
			colons++
		}
	}
	if colons < 2 {
		return nil
	}
	if key, ok := repeatedKey(raw); ok {
		return fmt.Errorf("an object repeats the key %q (parsers disagree on which value counts)", key)
	}
	return nil
}

// repeatedKey reports the first key that an object in raw (valid JSON)
// holds twice, compared as decoded: Python's json and encoding/json keep
// the last of two equal keys, other parsers the first, so a host that
// vets arguments with one and acts with another would be bypassed.
func repeatedKey(raw json.RawMessage) (string, bool) {
	type level struct {
		keys    map[string]struct{} // nil for an array
		wantKey bool
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var stack []level
	// done marks the end of a value: its object then expects a key.
	done := func() {
		if n := len(stack); n > 0 && stack[n-1].keys != nil {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false // io.EOF; raw was checked valid before
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				stack = append(stack, level{keys: map[string]struct{}{}, wantKey: true})
			case '[':
				stack = append(stack, level{})
			default:
				stack = stack[:len(stack)-1]
				done()
			}
		case string:
			if n := len(stack); n > 0 && stack[n-1].keys != nil && stack[n-1].wantKey {
				if _, dup := stack[n-1].keys[v]; dup {
					return v, true
				}
				stack[n-1].keys[v] = struct{}{}
				stack[n-1].wantKey = false
				continue
			}
			done()
		default:
			done()
		}
	}
}

// jsonIs reports whether raw is a JSON value starting with the byte b ('['
// for an array, '{' for an object).
func jsonIs(raw json.RawMessage, b byte) bool {
	for _, ch := range raw {
		switch ch {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return ch == b
	}
	return false
}
