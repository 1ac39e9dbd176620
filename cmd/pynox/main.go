// Command pynox runs confined CPython jobs. `pynox pool` serves the pool
// protocol (JSON Lines on stdin and stdout); see the pynox package docs.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/jsonl"
)

func main() {
	var stdin io.Reader = os.Stdin
	var stdout io.Writer = os.Stdout
	if len(os.Args) > 1 && (os.Args[1] == "pool" || os.Args[1] == "mcp") {
		reapOrphans()
		if os.Args[1] == "pool" {
			// Raw reads and writes of the pipes (rawio.go).
			stdin, stdout = rawStdin(), pollableStdout()
		} else {
			stdin = pollableStdin()
		}
	}
	os.Exit(run(os.Args[1:], stdin, stdout, os.Stderr))
}

const usage = `pynox runs untrusted Python code in confined CPython processes.

Usage:
  pynox pool [flags]     serve the pool protocol: JSON requests on stdin, JSON results on stdout
  pynox mcp [flags]      serve the Model Context Protocol on stdin and stdout (tools run_python, reset_session)
  pynox serve [flags]    serve the pool protocol over HTTP: WebSocket /v1/pool, POST /v1/run
  pynox version          print the version and VCS revision (also --version)
  pynox help [command]   show help (also --help, -h)

Example:
  echo '{"id": 1, "code": "print(6 * 7)"}' | pynox pool

Run "pynox help pool" for the pool's flags, "pynox help mcp" for the MCP server.
`

// poolUsage is `pynox pool --help`. Every flag the pool defines is listed
// here (TestHelp checks it), with the configuration key it overrides.
const poolUsage = `Usage: pynox pool [flags]

Serves the pool protocol: one JSON request per line on stdin, one JSON
result per line on stdout, in completion order. The first line out is the
"ready" event. End of input, SIGTERM and SIGINT drain the accepted jobs and
exit 0; a second SIGTERM or SIGINT kills the jobs still running.

Example (one request, one result):
  echo '{"id": 1, "code": "print(6 * 7)", "timeout": "5s"}' | pynox pool

Flags (each overrides the configuration file's key in brackets):
  --config=FILE        TOML configuration: [pool], [pool.limits], [profiles.NAME];
                       its relative paths resolve against the file's directory
  --workers=N          templates, hence jobs running at once (default 2)       [pool] workers
  --preload=a,b        modules each template imports once, before any job       [pool] preload
  --package-dir=DIR    read-only directory on every job's sys.path (repeatable) [pool] package_dirs
  --allow-read=DIR     the read ceiling: requests may read beneath it
                       (repeatable; default the working directory)              [pool.limits] allow_read
  --allow-write=DIR    the write ceiling: requests may write beneath it
                       (repeatable; default none)                               [pool.limits] allow_write
  --python=PATH        the interpreter (default the first python3 on PATH)      [pool] python
  --cgroups=MODE       per-job cgroups: auto (default), require or off          [pool] cgroups
  --log=json           one JSON line per finished job on stderr                 [pool] log
  --pin-cpus=BOOL      pin each template and its jobs to one CPU of the
                       process's allowed set, round robin (default true)       [pool] pin_cpus
  -h, --help           show this help

Paths given as flags, and relative paths in requests, resolve against the
working directory; a job runs in it too.

Traces: with OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
set, each job, session step and host call is an OpenTelemetry span exported
over OTLP/HTTP (a request's "traceparent" is the parent); without it, none.
`

// keyFlags maps the configuration keys that a flag overrides to the flag.
var keyFlags = map[string]string{
	"config":                  "config",
	"pool.workers":            "workers",
	"pool.preload":            "preload",
	"pool.package_dirs":       "package-dir",
	"pool.limits.allow_read":  "allow-read",
	"pool.limits.allow_write": "allow-write",
	"pool.python":             "python",
	"pool.cgroups":            "cgroups",
	"pool.log":                "log",
	"pool.pin_cpus":           "pin-cpus",
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "pool":
		return pool(args[1:], stdin, stdout, stderr)
	case "mcp":
		return mcpCommand(args[1:], stdin, stdout, stderr)
	case "serve":
		return serve(args[1:], stdout, stderr)
	case "version", "--version", "-version", "-v":
		if len(args) > 1 {
			fmt.Fprintf(stderr, "pynox version: unexpected argument %q\n", args[1])
			return 2
		}
		fmt.Fprintln(stdout, version())
		return 0
	case "-h", "--help", "-help", "help":
		if len(args) > 1 {
			switch args[1] {
			case "pool":
				fmt.Fprint(stdout, poolUsage)
				return 0
			case "mcp":
				fmt.Fprint(stdout, mcpUsage)
				return 0
			case "serve":
				fmt.Fprint(stdout, serveUsage)
				return 0
			case "version", "help":
				fmt.Fprint(stdout, usage)
				return 0
			}
			fmt.Fprintf(stderr, "pynox help: unknown command %q\n\n%s", args[1], usage)
			return 2
		}
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "pynox: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// version reports the module version and the VCS revision the binary was
// built from, as the Go toolchain recorded them: "(devel)" is a build from
// a source tree (go build, go run) rather than from a tagged module, and
// a build outside a checkout, or with -buildvcs=false (go run's default),
// records no revision.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "pynox: no build information (built without module support)"
	}
	return formatVersion(bi)
}

// formatVersion renders what version reports from build information.
func formatVersion(bi *debug.BuildInfo) string {
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, when string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	out := fmt.Sprintf("pynox %s", v)
	switch {
	case rev == "":
		out += ", no VCS revision recorded (built by go run, outside a git checkout or in a git worktree, or with -buildvcs=false)"
	default:
		out += ", revision " + rev
		if when != "" {
			out += " (" + when + ")"
		}
		if modified {
			out += " with uncommitted changes"
		}
	}
	return out + ", " + bi.GoVersion
}

type listFlag []string

// String joins the values (flag.Value).
func (l *listFlag) String() string { return strings.Join(*l, ",") }

// Set adds one value (flag.Value). Every listFlag holds paths, and an
// empty one (--allow-write=$UNSET) would stand for the working directory:
// it is refused.
func (l *listFlag) Set(v string) error {
	if v == "" {
		return errors.New("an empty path (an unset variable?) would stand for the working directory; name the directory, or leave the flag out")
	}
	*l = append(*l, v)
	return nil
}

func pool(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return servePool("pool", poolUsage, args, stdout, stderr, func(ctx context.Context, p *pynox.Pool) error {
		return jsonl.Serve(ctx, p, stdin, stdout)
	})
}

// servePool parses the pool's flags and configuration file for the
// command `pynox <command>` (whose --help is help), starts the pool and
// hands it to serve until serve returns; the first SIGTERM or SIGINT
// shuts the pool down gracefully.
func servePool(command, help string, args []string, stdout, stderr io.Writer, serve func(context.Context, *pynox.Pool) error) int {
	return withPool(command, help, args, stdout, stderr, nil, nil, func(p *pynox.Pool) int {
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		shutdown := shutdownOnSignal(p, stop)
		defer shutdown()
		if err := serve(ctx, p); err != nil {
			fmt.Fprintf(stderr, "pynox %s: %v\n", command, err)
			return 1
		}
		return 0
	})
}

// withPool parses the pool's flags for the command cmd (whose help is
// help), and those flags adds, loads the configuration, runs before
// (when it returns ok == false, withPool returns its code without
// starting anything), starts the pool and returns what body returns.
func withPool(cmd, help string, args []string, stdout, stderr io.Writer, flags func(*flag.FlagSet), before func() (code int, ok bool), body func(p *pynox.Pool) int) int {
	name := "pynox " + cmd
	if len(args) > 0 && args[0] == "help" {
		fmt.Fprint(stdout, help)
		return 0
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	configPath := fs.String("config", "", "TOML configuration file ([pool], [pool.limits], [profiles.NAME])")
	workers := fs.Int("workers", 0, "templates, hence jobs running at once (default 2)")
	preload := fs.String("preload", "", "comma-separated modules each template imports once")
	python := fs.String("python", "", "the interpreter (default: the first python3 on PATH)")
	logFmt := fs.String("log", "", `"json": one line per finished job on stderr`)
	cgroups := fs.String("cgroups", "", `per-job cgroups: "auto" (default), "require" or "off"`)
	pinCPUs := fs.Bool("pin-cpus", true, "pin each template and its jobs to one CPU of the allowed set (default true)")
	if flags != nil {
		flags(fs)
	}
	var pkgDirs, allowRead, allowWrite listFlag
	fs.Var(&pkgDirs, "package-dir", "read-only directory on every job's sys.path (repeatable)")
	fs.Var(&allowRead, "allow-read", "the read ceiling: requests may read beneath it (repeatable; default the working directory; overrides [pool.limits] allow_read)")
	fs.Var(&allowWrite, "allow-write", "the write ceiling: requests may write beneath it (repeatable; default none; overrides [pool.limits] allow_write)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, help)
			return 0
		}
		fmt.Fprintf(stderr, "%s: %s\nRun \"%s --help\" for the flags.\n", name, describeFlagError(err), name)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q: %s takes flags only\nRun \"%s --help\" for the flags.\n", name, fs.Arg(0), name, name)
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["config"] && *configPath == "" {
		// --config=$UNSET would start the pool without the file's
		// ceilings and profiles.
		fmt.Fprintf(stderr, "%s: --config=: an empty path (an unset variable?) names no configuration file; name the file, or leave the flag out\nRun \"%s --help\" for the flags.\n", name, name)
		return 2
	}
	// The command confines its own process (and so every template and
	// job) unless the configuration file says confine_self = false.
	// It pins each template to a CPU unless told not to (PinCPUs).
	cfg := pynox.Config{ConfineSelf: true, PinCPUs: true}
	var file *jsonl.File
	logMode := ""
	if *configPath != "" {
		f, err := jsonl.LoadConfig(*configPath)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %s\n", name, describeStartError(err, nil, set))
			return 1
		}
		file = f
		cfg, logMode = f.Config, f.Log
		cfg.ConfineSelf = f.ConfineSelf
		cfg.PinCPUs = f.PinCPUs
	}
	if set["pin-cpus"] {
		cfg.PinCPUs = *pinCPUs
	}
	// The command line overrides [pool].
	if set["workers"] {
		if *workers <= 0 {
			fmt.Fprintf(stderr, "%s: --workers=%d: expected a positive integer\n", name, *workers)
			return 2
		}
		if *workers > pynox.MaxWorkers {
			fmt.Fprintf(stderr, "%s: --workers=%d: expected at most %d\n", name, *workers, pynox.MaxWorkers)
			return 2
		}
		cfg.Workers = *workers
	}
	if set["python"] {
		cfg.Python = *python
	}
	if set["package-dir"] {
		cfg.PackageDirs = pkgDirs
	}
	// Ceiling paths given here are relative to the working directory.
	if set["allow-read"] {
		cfg.Limits.AllowRead = allowRead
	}
	if set["allow-write"] {
		cfg.Limits.AllowWrite = allowWrite
	}
	if set["preload"] {
		cfg.Preload = nil
		for _, m := range strings.Split(*preload, ",") {
			if m = strings.TrimSpace(m); m != "" {
				cfg.Preload = append(cfg.Preload, m)
			}
		}
	}
	if set["log"] {
		logMode = *logFmt
	}
	if set["cgroups"] {
		switch *cgroups {
		case "auto", "require", "off":
			cfg.Cgroups = *cgroups
		default:
			fmt.Fprintf(stderr, "%s: --cgroups=%s: expected \"auto\", \"require\" or \"off\"\n", name, *cgroups)
			return 2
		}
	}
	switch logMode {
	case "":
	case "json":
		cfg.Logger = slog.New(jsonl.NewLogHandler(stderr))
	default:
		if set["log"] {
			fmt.Fprintf(stderr, "%s: --log=%s: expected \"json\"\n", name, logMode)
		} else {
			fmt.Fprintf(stderr, "%s: %s:%d: pool.log: expected \"json\" or \"\", got %q\n", name, file.Path, file.Line("pool.log"), logMode)
		}
		return 2
	}
	if before != nil {
		if code, ok := before(); !ok {
			return code
		}
	}
	// Traces are exported only when the standard OTLP endpoint variables
	// ask for it (trace.go); the pool's domain lets the exporter connect.
	tr, err := startTracing(cfg.Logger, func(msg string) { fmt.Fprintf(stderr, "%s: %s\n", name, msg) })
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	defer tr.shutdown()
	if tr != nil {
		cfg.TracerProvider = tr.tp
		cfg.ConfineSelfConnectTCP = append(cfg.ConfineSelfConnectTCP, tr.port)
	}
	setHostProcs(cmp.Or(cfg.Workers, pynox.DefaultWorkers))
	slowMonitor(monitorSlack) // see monitor.go
	p, err := pynox.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, describeStartError(err, file, set))
		return 1
	}
	defer p.Close()
	return body(p)
}

// shutdownOnSignal makes the first SIGTERM or SIGINT a graceful
// shutdown: stop reads no more requests (Serve answers those it holds),
// and [pynox.Pool.Shutdown] lets the jobs and steps under way finish. A
// second signal kills what still runs (Shutdown's ctx ends). The function
// it returns stops listening.
func shutdownOnSignal(p *pynox.Pool, stop func()) func() {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	quit := make(chan struct{})
	go func() {
		select {
		case <-sigs:
		case <-quit:
			return
		}
		stop()
		drain, kill := context.WithCancel(context.Background())
		defer kill()
		go func() {
			select {
			case <-sigs:
				kill()
			case <-drain.Done():
			}
		}()
		_ = p.Shutdown(drain)
	}()
	return func() {
		signal.Stop(sigs)
		close(quit)
	}
}

// describeStartError says why the pool did not start, in the terms the
// operator used: a setting the command line gave is named as its flag
// (--package-dir=/nonexistent: ...), one the configuration file gave by
// file, line and key (pynox.toml:3: pool.limits.allow_read: ...). The
// library's error kind ("Spawn") is left out: it names no setting.
func describeStartError(err error, file *jsonl.File, set map[string]bool) string {
	var ce *pynox.ConfigError
	if errors.As(err, &ce) {
		if name := keyFlags[ce.Key]; name != "" && set[name] {
			if ce.Value == "" {
				return fmt.Sprintf("--%s: %s", name, ce.Problem)
			}
			return fmt.Sprintf("--%s=%s: %s", name, ce.Value, ce.Problem)
		}
		if line := file.Line(ce.Key); line > 0 {
			return fmt.Sprintf("%s:%d: %s", file.Path, line, ce)
		}
		return ce.Error()
	}
	var pe *pynox.Error
	if errors.As(err, &pe) {
		switch {
		case pe.Err == nil:
			return pe.Message
		case pe.Message == "":
			return pe.Err.Error()
		}
		return pe.Message + ": " + pe.Err.Error()
	}
	return err.Error()
}

// describeFlagError rewrites the flag package's complaints in the form the
// command line takes: "--workers=x: expected an integer".
func describeFlagError(err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		return fmt.Sprintf("unknown flag --%s", strings.TrimLeft(name, "-"))
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		return fmt.Sprintf("--%s needs a value, as in --%s=VALUE", strings.TrimLeft(name, "-"), strings.TrimLeft(name, "-"))
	}
	// invalid boolean value "x" for -pin-cpus: parse error
	var bval, bname string
	if _, err := fmt.Sscanf(msg, "invalid boolean value %q for %s", &bval, &bname); err == nil {
		return fmt.Sprintf("--%s=%s: expected true or false", strings.TrimSuffix(strings.TrimLeft(bname, "-"), ":"), bval)
	}
	// invalid value "x" for flag -workers: parse error
	var value, name string
	if _, err := fmt.Sscanf(msg, "invalid value %q for flag %s", &value, &name); err == nil {
		name = strings.TrimSuffix(strings.TrimLeft(name, "-"), ":")
		if name == "workers" {
			return fmt.Sprintf("--%s=%s: expected a positive integer", name, value)
		}
		// A flag.Value of ours says what is wrong after the flag's name.
		if _, reason, ok := strings.Cut(msg, " for flag -"+name+": "); ok && reason != "" {
			return fmt.Sprintf("--%s=%s: %s", name, value, reason)
		}
		return fmt.Sprintf("--%s=%s: expected a valid value", name, value)
	}
	return msg
}
