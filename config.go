package pynox

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pynox/pynox/internal/cgroup"
	"github.com/pynox/pynox/internal/worker"
)

// Default limits: without a configured ceiling these are both the defaults
// and the maximums of every request.
const (
	DefaultWorkers = 2
	// MaxWorkers bounds Config.Workers: each worker is a template
	// process and its spares, a few processes and tens of MiB of their
	// own; more is a mistake (a unit or a zero too many), refused at once
	// rather than forked.
	MaxWorkers         = 1024
	DefaultTimeout     = 30 * time.Second
	DefaultMemory      = 1 << 30
	DefaultMaxOutput   = 1 << 20
	DefaultMaxFileSize = 256 << 20
	DefaultMaxSessions = 16
	DefaultSessionIdle = 10 * time.Minute
	// DefaultThreads is the default of Limits.Threads.
	DefaultThreads = 64
)

// Config configures a [Pool]. Every zero value means something, said on
// the field; [New] validates the whole.
type Config struct {
	// Python is the interpreter. Empty means the first python3 on PATH. A
	// launcher script there (such as a pyenv shim) is resolved once, at New,
	// to the real interpreter it runs, because templates start with a clean
	// environment in which a shim cannot work.
	Python string
	// Workers is the number of templates, hence of jobs running at once,
	// at most MaxWorkers. Zero means DefaultWorkers.
	Workers int
	// Dir is the jobs' working directory and the base of relative paths in
	// requests. Empty means the current directory.
	Dir string
	// Preload lists modules every template imports once, before forking.
	Preload []string
	// PackageDirs are read-only directories on every job's sys.path.
	PackageDirs []string
	// Limits is the ceiling every request must fit in, and supplies the
	// defaults of the fields a request leaves unset.
	Limits Limits
	// Profiles are named presets a request selects with "profile": the
	// profile's fields come first, the request's own are added on top (lists
	// joined, env merged, scalars overridden), then the ceiling applies.
	// A profile's relative paths resolve against Dir, like a request's;
	// jsonl.LoadConfig makes a file's paths absolute against the file's
	// directory first, so a file's profile that says "data" grants the
	// data directory beside the file, which a job (running in Dir) must
	// name by that path.
	Profiles map[string]Profile
	// MaxSessions caps concurrent sessions. Zero means DefaultMaxSessions.
	MaxSessions int
	// SessionIdle closes a session idle this long. Zero means
	// DefaultSessionIdle.
	SessionIdle time.Duration
	// CheckoutTimeout is how long [Pool.Checkout] waits for a free session
	// slot when MaxSessions sessions are open, in order of arrival (a
	// Finish elsewhere hands its slot to the longest waiter), before it
	// fails with ErrExhausted. Zero means it does not wait. It applies to
	// the Go API only: `pynox pool` refuses a session beyond max_sessions
	// at once (the pool protocol's rule), so no configuration key or flag
	// sets it. A negative value is a ConfigError (key "CheckoutTimeout").
	CheckoutTimeout time.Duration
	// SessionIdleDump, when set, is a directory where the pool keeps the
	// state of a session idle for SessionIdle instead of closing it: it
	// dumps the session ([Checkout.Dump]) to a file there, ends its
	// process, and the session's next Feed restores it into a
	// new process (its Result has Restored set). A session whose dump
	// fails is closed as without it. A kept session still counts toward
	// MaxSessions until it is finished. The directory must exist and lie
	// outside every path a job may be granted (the read and write
	// ceilings, package dirs, the interpreter's and the system's paths):
	// New refuses it otherwise.
	SessionIdleDump string
	// EvictIdle lets a new session in beyond MaxSessions by finishing the
	// least recently used idle session (one with no turn in progress and
	// no host call waiting) instead of refusing the new one with
	// ErrExhausted; the evicted checkout's calls then return ErrFinished,
	// and its state is lost. With every session busy, the new one is
	// refused as without it.
	EvictIdle bool
	// Logger receives one record per finished job and the pool's own
	// warnings. Nil means no logging. A job's record has the message "job"
	// and the attributes id, session, step (empty for one-shot jobs),
	// exit, error (the error type, or ""), message, duration_ms, queue_us,
	// cpu_ms, network and truncated, and trace_id when the job has a trace
	// (see TracerProvider): identifiers, outcome and timing, never
	// captured output. jsonl.NewLogHandler renders the records as the
	// pool protocol's JSON log lines.
	Logger *slog.Logger
	// TracerProvider makes the pool's OpenTelemetry spans: one per job
	// (SpanJob), per session step (SpanSessionStep) and per host call
	// (SpanHostCall, a child of its job's or step's span), each a child
	// of the span in the ctx given to Run or Feed (a remote parent
	// included), carrying identifiers and the outcome (see AttrID and the
	// other Attr constants), never code, inputs, arguments or output. Nil
	// means otel.GetTracerProvider(), the program's global provider, which
	// is a no-op until the program installs one: then each job, step and
	// host call costs one no-op Start and End and no attribute is built.
	// A job's log record (see Logger) carries trace_id whenever its span,
	// or the span in its ctx, has one.
	TracerProvider trace.TracerProvider
	// PIDNamespace says whether each template runs as PID 1 of a PID
	// namespace of its own, so that no process of a job or session can
	// outlive its template (see the package docs, "Process lifetime"):
	// "auto" (or empty) uses one where the kernel allows it, "require"
	// makes New fail without one, "off" never uses one.
	PIDNamespace string
	// Cgroups chooses per-job control groups, which bound each job's tasks
	// (Limits.Threads) and memory (its allowance plus its template's
	// anonymous memory and 32 MiB, counting memfd and tmpfs pages, pipe
	// and socket buffers) even for uid 0: "auto" (or empty) uses cgroup
	// v2 where the pool's own cgroup is delegated to it, else cgroup v1's
	// pids and memory hierarchies, else none; "require" makes New fail
	// without them; "off" uses none. The backend in use is reported in
	// the ready event and each result's policy.
	Cgroups string
	// ConfineSelf puts the whole calling process — every thread, and
	// through inheritance every template and job — in a Landlock domain
	// (go-landlock, best effort) before New starts the templates, for the
	// rest of its life: read and execute on the interpreter's runtime and
	// system paths, read on the package dirs, the read ceiling and /proc,
	// read and write on the write ceiling, and no TCP unless the ceiling
	// grants the network; see [SelfConfinement]. Code that escaped a
	// job's own confinement into a template would still find only the
	// ceiling. False (the zero value) leaves the process alone, since an
	// embedding program's own needs are not the pool's to know; `pynox
	// pool` sets it unless [pool] confine_self = false. A process can
	// only be confined further: a second pool in it gets at most what the
	// first one's domain allows.
	ConfineSelf bool
	// ConfineSelfConnectTCP lists TCP ports the pool's own Landlock
	// domain (ConfineSelf) lets the process connect to even when it
	// denies TCP because the ceiling grants no network: `pynox pool` puts
	// its OTLP trace exporter's port here. Landlock's rule names a port,
	// not an address, so code that escaped a job's own confinement into a
	// template could connect to that port on any host; jobs themselves
	// never can (their own domain denies all TCP). Each port must be 1 to
	// 65535. It changes nothing when the domain allows TCP anyway.
	ConfineSelfConnectTCP []uint16
	// PinCPUs pins each template, and so every spare, job and session it
	// forks, to one CPU: template i gets the i-th CPU, round robin, of
	// the set the calling process may run on when New starts (its
	// sched_getaffinity, which a cpuset or taskset bounds), and a
	// replaced template gets its predecessor's. It never names a CPU
	// outside that set, and does nothing when the set holds one CPU. The
	// template pins itself before it imports its preloads, so a wake-up
	// between a template, its spare and its job never crosses CPUs (each
	// such crossing costs tens of microseconds on a small VM); the price
	// is that the scheduler may not move a busy job or session to an idle
	// CPU. Sessions are spread over the templates, hence over the CPUs.
	// A job may widen its own affinity again, within its cpuset (its
	// seccomp filter allows sched_setaffinity on itself): pinning is a
	// performance setting, not a confinement. False (the zero value)
	// leaves the affinity alone, since an embedding program's scheduling
	// is not the pool's to choose; `pynox pool` and `pynox serve` set it
	// unless [pool] pin_cpus = false or --pin-cpus=false.
	PinCPUs bool
	// ScratchDir is the directory in which the pool makes its private
	// scratch directory, which holds one directory per job and session
	// (see the package docs, "Scratch space and mounts"). Empty means
	// /dev/shm when it is a tmpfs the pool can use, else os.TempDir().
	// It must not lie beneath the ceiling: a grant that covers the scratch
	// directory, or lies beneath it, is refused.
	ScratchDir string
	// Source is the configuration file this Config was loaded from (see
	// jsonl.LoadConfig), reported in the ready event. Empty means none. New
	// refuses a source file that lies beneath the write ceiling, and no
	// write grant may cover it.
	Source string
}

// Profile is a preset of request fields; see Config.Profiles. Zero values
// leave the request's (or the ceiling's) value in place.
type Profile struct {
	AllowRead    []string
	AllowWrite   []string
	PackageDirs  []string
	Env          map[string]string
	AllowNetwork bool
	Timeout      time.Duration
	Memory       int64
	MaxOutput    int
	MaxFileSize  int64
}

// Limits is the pool's ceiling. Zero values mean the built-in default.
type Limits struct {
	// AllowRead lists the paths beneath which requests may ask for read
	// access. Nil means the pool's working directory; an empty non-nil
	// slice means none.
	AllowRead []string
	// AllowWrite lists the paths beneath which requests may ask for write
	// access. Nil or empty means none: a pool grants no writes unless its
	// operator names where (a job that may write where the pool's binary or
	// configuration lives could replace what the operator runs next). Write
	// grants that would cover the pool's own executable, its directory or
	// the configuration file are refused even beneath this ceiling.
	AllowWrite []string
	// AllowNetwork lets requests ask for the network.
	AllowNetwork bool
	// Timeout is the default and largest job timeout. Zero means
	// DefaultTimeout.
	Timeout time.Duration
	// Memory is the default and largest job memory allowance in bytes.
	// Zero means DefaultMemory.
	Memory int64
	// MaxOutput is the default and largest number of bytes kept of each
	// output stream. Zero means DefaultMaxOutput.
	MaxOutput int
	// MaxFileSize is the default and largest size of each file a job
	// writes, in bytes (RLIMIT_FSIZE); it applies to requests that do not
	// set one. It bounds each file, not their total: a job may write many
	// files of this size wherever it may write. Zero means
	// DefaultMaxFileSize.
	MaxFileSize int64
	// Threads is the most tasks (threads) one job or session may have at
	// once, enforced by its cgroup's pids.max where Config.Cgroups puts
	// jobs in cgroups; beyond it, starting a thread fails with EAGAIN.
	// It applies to every request. Zero means DefaultThreads.
	Threads int
}

// errEmptyPath explains why an empty path in a ceiling, a profile or the
// package directories is refused: it would stand for the working (or the
// configuration file's) directory, most often by accident.
var errEmptyPath = errors.New(`an empty path (an unset variable?) would stand for the working directory; name the directory, or leave the entry out`)

// withDefaults returns c with every zero field replaced by its default and
// every path made absolute; it checks what can be checked without starting
// anything.
func (c Config) withDefaults() (Config, error) {
	if c.Workers < 0 {
		return c, &ConfigError{Key: "pool.workers", Value: fmt.Sprint(c.Workers), Problem: "expected a positive integer"}
	}
	if c.Workers > MaxWorkers {
		return c, &ConfigError{Key: "pool.workers", Value: fmt.Sprint(c.Workers), Problem: fmt.Sprintf("expected at most %d", MaxWorkers)}
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return c, &ConfigError{Key: "dir", Problem: "cannot find the working directory: " + err.Error()}
		}
		c.Dir = wd
	}
	dir, err := realDir(c.Dir)
	if err != nil {
		return c, &ConfigError{Key: "dir", Value: c.Dir, Problem: pathProblem(err, "an existing directory")}
	}
	c.Dir = dir
	l := &c.Limits
	// An empty path would resolve to the working directory: refuse it
	// rather than widen a ceiling to wherever the pool was started.
	for _, f := range []struct {
		field string
		paths []string
	}{{"allow_read", l.AllowRead}, {"allow_write", l.AllowWrite}, {"package_dirs", c.PackageDirs}} {
		if slices.Contains(f.paths, "") {
			return c, fmt.Errorf("%s: %s", f.field, errEmptyPath)
		}
	}
	for _, name := range c.ProfileNames() {
		pr := c.Profiles[name]
		for _, f := range []struct {
			field string
			paths []string
		}{{"allow_read", pr.AllowRead}, {"allow_write", pr.AllowWrite}, {"package_dirs", pr.PackageDirs}} {
			if slices.Contains(f.paths, "") {
				return c, fmt.Errorf("profile %q: %s: %s", name, f.field, errEmptyPath)
			}
		}
	}
	if l.AllowRead == nil {
		l.AllowRead = []string{c.Dir}
	}
	for _, list := range []struct {
		key, want string
		paths     *[]string
	}{
		{"pool.limits.allow_read", "an existing file or directory", &l.AllowRead},
		{"pool.limits.allow_write", "an existing file or directory", &l.AllowWrite},
		{"pool.package_dirs", "an existing directory", &c.PackageDirs},
	} {
		out := make([]string, 0, len(*list.paths))
		for _, p := range *list.paths {
			r, err := realPath(c.Dir, p)
			if err != nil {
				return c, &ConfigError{Key: list.key, Value: p, Problem: pathProblem(err, list.want)}
			}
			out = append(out, r)
		}
		*list.paths = out
	}
	for _, n := range []struct {
		key string
		v   int64
	}{
		{"pool.limits.timeout", int64(l.Timeout)}, {"pool.limits.memory", l.Memory}, {"pool.limits.max_output", int64(l.MaxOutput)},
		{"pool.limits.max_file_size", l.MaxFileSize}, {"pool.limits.threads", int64(l.Threads)},
		{"pool.max_sessions", int64(c.MaxSessions)}, {"pool.session_idle", int64(c.SessionIdle)},
	} {
		if n.v < 0 {
			return c, &ConfigError{Key: n.key, Value: fmt.Sprint(n.v), Problem: "must not be negative"}
		}
	}
	if l.Timeout == 0 {
		l.Timeout = DefaultTimeout
	}
	if l.Memory == 0 {
		l.Memory = DefaultMemory
	}
	if l.MaxOutput == 0 {
		l.MaxOutput = DefaultMaxOutput
	}
	if l.MaxFileSize == 0 {
		l.MaxFileSize = DefaultMaxFileSize
	}
	if err := chooseMode(&c.PIDNamespace, "pool.pid_namespace",
		worker.PIDNamespaceAuto, worker.PIDNamespaceRequire, worker.PIDNamespaceOff); err != nil {
		return c, err
	}
	if l.Threads == 0 {
		l.Threads = DefaultThreads
	}
	if err := chooseMode(&c.Cgroups, "pool.cgroups", cgroup.Auto, cgroup.Require, cgroup.Off); err != nil {
		return c, err
	}
	for _, port := range c.ConfineSelfConnectTCP {
		if port == 0 {
			return c, &ConfigError{Key: "ConfineSelfConnectTCP", Value: "0", Problem: "must be a TCP port from 1 to 65535"}
		}
	}
	if c.CheckoutTimeout < 0 {
		return c, &ConfigError{Key: "CheckoutTimeout", Value: c.CheckoutTimeout.String(), Problem: "must not be negative"}
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.SessionIdle == 0 {
		c.SessionIdle = DefaultSessionIdle
	}
	if c.SessionIdleDump != "" {
		if err := checkIdleDumpDir(&c); err != nil {
			return c, err
		}
	}
	if c.Source != "" {
		src, err := filepath.EvalSymlinks(c.Source)
		if err != nil {
			return c, &ConfigError{Key: "config", Value: c.Source, Problem: pathProblem(err, "an existing file")}
		}
		for _, w := range l.AllowWrite {
			if beneath(src, w) {
				return c, &ConfigError{Key: "pool.limits.allow_write", Value: w,
					Problem: fmt.Sprintf("the configuration file %s lies beneath the write ceiling, so a job could rewrite the pool's configuration: "+
						"keep the file outside [pool.limits] allow_write (and --allow-write), or narrow them", src)}
			}
		}
		c.Source = src
	}
	for name := range c.Profiles {
		if name == "" {
			return c, &ConfigError{Key: "profiles", Problem: "a profile needs a name"}
		}
	}
	for _, name := range c.ProfileNames() {
		// Checked here, not only when a request names the profile: every
		// such request would be refused, blaming an env it did not send.
		for _, k := range slices.Sorted(maps.Keys(c.Profiles[name].Env)) {
			if !validEnv(k, c.Profiles[name].Env[k]) {
				return c, &ConfigError{Key: "profiles." + name + ".env", Value: k, Problem: envRule}
			}
		}
	}
	for _, m := range c.Preload {
		if m == "" || strings.ContainsAny(m, " /\\") {
			return c, &ConfigError{Key: "pool.preload", Value: m, Problem: "expected a module name, such as \"json\" or \"numpy.linalg\""}
		}
	}
	return c, nil
}

// ConfigError reports a setting that [New] refuses, or a requirement it
// names that the machine does not meet (cgroups or pid_namespace
// "require"), by the key that sets it in a configuration file, so that a
// command can point at the file's line or at its own flag: New returns it
// as the cause (Err) of its KindSpawn [Error].
type ConfigError struct {
	// Key is the setting as a configuration file spells it:
	// "pool.workers", "pool.limits.allow_read" (Config.Limits.AllowRead),
	// "pool.package_dirs", "profiles.NAME.allow_write" and so on; "dir"
	// for Config.Dir and "config" for Config.Source, which no file sets.
	Key string
	// Value is the offending value as configured (one element of a
	// list), or empty when the fault is not one value's.
	Value string
	// Problem says what is wrong and what is expected.
	Problem string
}

// Error formats the error as `key: "value": problem`.
func (e *ConfigError) Error() string {
	if e.Value == "" {
		return e.Key + ": " + e.Problem
	}
	return fmt.Sprintf("%s: %q: %s", e.Key, e.Value, e.Problem)
}

// pathProblem says why a configured path is refused, without Go's
// operation names ("lstat").
func pathProblem(err error, want string) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "does not exist; expected " + want
	case errors.Is(err, fs.ErrPermission):
		return "permission denied; expected " + want + " the pool may read"
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return err.Error() + "; expected " + want
}

// chooseMode checks an "auto"/"require"/"off" setting: empty means
// auto, the first of the three; anything else is a ConfigError naming key.
func chooseMode(v *string, key, auto, require, off string) error {
	switch *v {
	case "":
		*v = auto
	case auto, require, off:
	default:
		return &ConfigError{Key: key, Value: *v, Problem: fmt.Sprintf("expected %q, %q or %q", auto, require, off)}
	}
	return nil
}

// realPath makes p absolute (relative to base) and resolves symlinks; the
// path must exist.
func realPath(base, p string) (string, error) {
	if !filepath.IsAbs(p) {
		p = filepath.Join(base, p)
	}
	return filepath.EvalSymlinks(p)
}

func realDir(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	r, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(r)
	if err != nil {
		return "", err
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory", r)
	}
	return r, nil
}

// FindPython finds the interpreter binary New would run for
// Config.Python = name: the named one (a path, or a command looked up on
// PATH) or, for an empty name, the first python3 on PATH. It follows
// symlinks and asks a launcher script (such as a pyenv shim) once which
// binary it runs, and returns that binary's absolute path.
func FindPython(name string) (string, error) {
	if name == "" {
		name = "python3"
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("python interpreter %q not found: %w", name, err)
	}
	path, err = filepath.Abs(path)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	if isELF(real) {
		return real, nil
	}
	// A launcher script (pyenv shim, wrapper): it needs the caller's
	// environment to choose its interpreter, so ask it here, once.
	out, err := exec.Command(path, "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		return "", fmt.Errorf("python %s is a launcher script and failed to report its interpreter: %w", path, err)
	}
	exe := strings.TrimSpace(string(out))
	if exe == "" {
		return "", fmt.Errorf("python %s reported no sys.executable", path)
	}
	real, err = filepath.EvalSymlinks(exe)
	if err != nil {
		return "", err
	}
	if !isELF(real) {
		return "", fmt.Errorf("python %s runs %s, which is not an executable binary", path, real)
	}
	return real, nil
}

func isELF(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	if _, err := f.Read(magic[:]); err != nil {
		return false
	}
	return bytes.Equal(magic[:], []byte("\x7fELF"))
}

// ProfileNames returns the configured profile names, sorted.
func (c Config) ProfileNames() []string {
	names := make([]string, 0, len(c.Profiles))
	for n := range c.Profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
