// Command pynox runs confined CPython jobs. `pynox pool` serves the pool
// protocol (JSON Lines on stdin and stdout); see the pynox package docs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/pynox/pynox"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "pool" {
		reapOrphans()
	}
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

const usage = `usage: pynox pool [--config=FILE] [--workers=N] [--preload=mod,mod] [--package-dir=DIR]...
                  [--allow-read=DIR]... [--allow-write=DIR]... [--python=PATH] [--log=json]
                  [--cgroups=auto|require|off]

Commands:
  pool    serve the pool protocol: JSON requests on stdin, JSON results on stdout
`

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "pool":
		return pool(args[1:], stdin, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "pynox: unknown command %q\n%s", args[0], usage)
	return 2
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
	fs := flag.NewFlagSet("pynox pool", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "TOML configuration file ([pool], [pool.limits], [profiles.NAME])")
	workers := fs.Int("workers", 0, "templates, hence jobs running at once (default 2)")
	preload := fs.String("preload", "", "comma-separated modules each template imports once")
	python := fs.String("python", "", "the interpreter (default: the first python3 on PATH)")
	logFmt := fs.String("log", "", `"json": one line per finished job on stderr`)
	cgroups := fs.String("cgroups", "", `per-job cgroups: "auto" (default), "require" or "off"`)
	var pkgDirs, allowRead, allowWrite listFlag
	fs.Var(&pkgDirs, "package-dir", "read-only directory on every job's sys.path (repeatable)")
	fs.Var(&allowRead, "allow-read", "the read ceiling: requests may read beneath it (repeatable; default the working directory; overrides [pool.limits] allow_read)")
	fs.Var(&allowWrite, "allow-write", "the write ceiling: requests may write beneath it (repeatable; default none; overrides [pool.limits] allow_write)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pynox pool: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	// The command confines its own process (and so every template and
	// job) unless the configuration file says confine_self = false.
	cfg := pynox.Config{ConfineSelf: true}
	logMode := ""
	if *configPath != "" {
		f, err := pynox.LoadConfig(*configPath)
		if err != nil {
			fmt.Fprintf(stderr, "pynox pool: %v\n", err)
			return 1
		}
		cfg, logMode = f.Config, f.Log
		cfg.ConfineSelf = f.ConfineSelf
	}
	// The command line overrides [pool].
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["workers"] {
		if *workers <= 0 {
			fmt.Fprintf(stderr, "pynox pool: --workers must be positive\n")
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
			fmt.Fprintf(stderr, "pynox pool: --cgroups must be \"auto\", \"require\" or \"off\", got %q\n", *cgroups)
			return 2
		}
	}
	switch logMode {
	case "":
	case "json":
		cfg.Logger = slog.New(pynox.NewLogHandler(stderr))
	default:
		fmt.Fprintf(stderr, "pynox pool: --log must be \"json\"\n")
		return 2
	}
	p, err := pynox.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "pynox pool: %v\n", err)
		return 1
	}
	defer p.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := p.Serve(ctx, stdin, stdout); err != nil {
		fmt.Fprintf(stderr, "pynox pool: %v\n", err)
		return 1
	}
	return 0
}
