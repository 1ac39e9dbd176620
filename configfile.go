package pynox

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	toml "github.com/pelletier/go-toml/v2"
)

// File is a configuration file as `pynox pool --config` reads it: the
// [Config] it describes plus the settings that belong to the command.
type File struct {
	// Path is the file's absolute, symlink-free path.
	Path string
	// Config is the pool configuration; relative paths in the file are
	// already resolved against the file's directory.
	Config Config
	// Log is the [pool] log setting: "json" for one JSON line per finished
	// job on stderr, or "" for none.
	Log string
	// ConfineSelf is the [pool] confine_self setting, true unless the file
	// sets it to false: whether `pynox pool` confines its own process
	// (Config.ConfineSelf, which LoadConfig leaves false for programs that
	// embed the library).
	ConfineSelf bool
}

// fileSchema mirrors the TOML layout; decoding is strict, so any key not
// here is an error.
type fileSchema struct {
	Pool struct {
		Workers     *int        `toml:"workers"`
		Preload     []string    `toml:"preload"`
		PackageDirs []string    `toml:"package_dirs"`
		MaxSessions *int        `toml:"max_sessions"`
		SessionIdle *Duration   `toml:"session_idle"`
		PIDNS       *string     `toml:"pid_namespace"`
		Log         *string     `toml:"log"`
		Python      *string     `toml:"python"`
		Cgroups     *string     `toml:"cgroups"`
		ConfineSelf *bool       `toml:"confine_self"`
		Limits      limitSchema `toml:"limits"`
	} `toml:"pool"`
	Profiles map[string]profileSchema `toml:"profiles"`
}

type limitSchema struct {
	AllowRead    []string  `toml:"allow_read"`
	AllowWrite   []string  `toml:"allow_write"`
	AllowNetwork *bool     `toml:"allow_network"`
	Timeout      *Duration `toml:"timeout"`
	Memory       *Size     `toml:"memory"`
	MaxOutput    *Size     `toml:"max_output"`
	MaxFileSize  *Size     `toml:"max_file_size"`
	Threads      *int      `toml:"threads"`
}

type profileSchema struct {
	AllowRead    []string          `toml:"allow_read"`
	AllowWrite   []string          `toml:"allow_write"`
	PackageDirs  []string          `toml:"package_dirs"`
	Env          map[string]string `toml:"env"`
	AllowNetwork bool              `toml:"allow_network"`
	Timeout      Duration          `toml:"timeout"`
	Memory       Size              `toml:"memory"`
	MaxOutput    Size              `toml:"max_output"`
	MaxFileSize  Size              `toml:"max_file_size"`
}

// LoadConfig reads a TOML configuration file strictly: an unknown key
// (keys match exactly, case included), a value of the wrong type or an invalid duration or size refuses the whole
// file, with the file, line and key in the message — a typo in a security
// setting must never pass silently. Relative paths resolve against the
// file's directory. A file that lies beneath its own write ceiling is
// refused, since a job could then rewrite the pool's configuration.
func LoadConfig(path string) (*File, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	data, err := os.ReadFile(real)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	var s fileSchema
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, describeTOMLError(real, err)
	}
	if err := checkTOMLKeys(real, data); err != nil {
		return nil, err
	}
	dir := filepath.Dir(real)
	// An empty path would resolve to the file's directory: refuse it (an
	// unset variable in a generated file, more likely than a wish).
	lists := []struct {
		field string
		paths []string
	}{
		{"[pool] package_dirs", s.Pool.PackageDirs},
		{"[pool.limits] allow_read", s.Pool.Limits.AllowRead},
		{"[pool.limits] allow_write", s.Pool.Limits.AllowWrite},
	}
	for _, name := range slices.Sorted(maps.Keys(s.Profiles)) {
		ps := s.Profiles[name]
		for _, l := range []struct {
			key   string
			paths []string
		}{{"allow_read", ps.AllowRead}, {"allow_write", ps.AllowWrite}, {"package_dirs", ps.PackageDirs}} {
			lists = append(lists, struct {
				field string
				paths []string
			}{fmt.Sprintf("[profiles.%s] %s", name, l.key), l.paths})
		}
	}
	for _, l := range lists {
		if slices.Contains(l.paths, "") {
			return nil, fmt.Errorf("config %s: %s: %s", real, l.field, errEmptyPath)
		}
	}
	resolve := func(paths []string) []string {
		if paths == nil {
			return nil
		}
		out := make([]string, len(paths))
		for i, p := range paths {
			if !filepath.IsAbs(p) {
				p = filepath.Join(dir, p)
			}
			out[i] = filepath.Clean(p)
		}
		return out
	}
	f := &File{Path: real, ConfineSelf: true}
	if s.Pool.ConfineSelf != nil {
		f.ConfineSelf = *s.Pool.ConfineSelf
	}
	c := &f.Config
	c.Source = real
	if s.Pool.Workers != nil {
		if *s.Pool.Workers <= 0 {
			return nil, fmt.Errorf("config %s: [pool] workers must be positive, got %d", real, *s.Pool.Workers)
		}
		c.Workers = *s.Pool.Workers
	}
	c.Preload = s.Pool.Preload
	c.PackageDirs = resolve(s.Pool.PackageDirs)
	if s.Pool.MaxSessions != nil {
		if *s.Pool.MaxSessions <= 0 {
			return nil, fmt.Errorf("config %s: [pool] max_sessions must be positive, got %d", real, *s.Pool.MaxSessions)
		}
		c.MaxSessions = *s.Pool.MaxSessions
	}
	if s.Pool.SessionIdle != nil {
		c.SessionIdle = time.Duration(*s.Pool.SessionIdle)
	}
	if s.Pool.PIDNS != nil {
		switch *s.Pool.PIDNS {
		case "auto", "require", "off":
			c.PIDNamespace = *s.Pool.PIDNS
		default:
			return nil, fmt.Errorf("config %s: [pool] pid_namespace must be \"auto\", \"require\" or \"off\", got %q", real, *s.Pool.PIDNS)
		}
	}
	if s.Pool.Python != nil {
		c.Python = *s.Pool.Python
		if strings.ContainsRune(c.Python, '/') && !filepath.IsAbs(c.Python) {
			c.Python = filepath.Join(dir, c.Python)
		}
	}
	if s.Pool.Log != nil {
		switch *s.Pool.Log {
		case "json", "":
			f.Log = *s.Pool.Log
		default:
			return nil, fmt.Errorf("config %s: [pool] log must be \"json\" or \"\", got %q", real, *s.Pool.Log)
		}
	}
	if s.Pool.Cgroups != nil {
		switch *s.Pool.Cgroups {
		case "auto", "require", "off":
			c.Cgroups = *s.Pool.Cgroups
		default:
			return nil, fmt.Errorf("config %s: [pool] cgroups must be \"auto\", \"require\" or \"off\", got %q", real, *s.Pool.Cgroups)
		}
	}
	l := s.Pool.Limits
	if l.Threads != nil {
		if *l.Threads <= 0 {
			return nil, fmt.Errorf("config %s: [pool.limits] threads must be positive, got %d", real, *l.Threads)
		}
		c.Limits.Threads = *l.Threads
	}
	c.Limits.AllowRead = resolve(l.AllowRead)
	c.Limits.AllowWrite = resolve(l.AllowWrite)
	if l.AllowNetwork != nil {
		c.Limits.AllowNetwork = *l.AllowNetwork
	}
	if l.Timeout != nil {
		c.Limits.Timeout = time.Duration(*l.Timeout)
	}
	if l.Memory != nil {
		c.Limits.Memory = int64(*l.Memory)
	}
	if l.MaxOutput != nil {
		c.Limits.MaxOutput = int(*l.MaxOutput)
	}
	if l.MaxFileSize != nil {
		c.Limits.MaxFileSize = int64(*l.MaxFileSize)
	}
	if len(s.Profiles) > 0 {
		c.Profiles = make(map[string]Profile, len(s.Profiles))
		for name, ps := range s.Profiles {
			c.Profiles[name] = Profile{
				AllowRead:    resolve(ps.AllowRead),
				AllowWrite:   resolve(ps.AllowWrite),
				PackageDirs:  resolve(ps.PackageDirs),
				Env:          ps.Env,
				AllowNetwork: ps.AllowNetwork,
				Timeout:      time.Duration(ps.Timeout),
				Memory:       int64(ps.Memory),
				MaxOutput:    int(ps.MaxOutput),
				MaxFileSize:  int64(ps.MaxFileSize),
			}
		}
	}
	// The write ceiling that applies is the file's, or by default the
	// working directory of the pool that will use it; New checks the
	// latter, since only it knows that directory.
	for _, w := range c.Limits.AllowWrite {
		wr, err := filepath.EvalSymlinks(w)
		if err != nil {
			wr = w
		}
		if beneath(real, wr) {
			return nil, fmt.Errorf("config %s lies beneath its own write ceiling %s: a job could rewrite the pool's configuration", real, wr)
		}
	}
	return f, nil
}

// fileKeys is the exact key set of a configuration file.
var fileKeys = schemaOf(reflect.TypeFor[fileSchema](), "toml", "the configuration file")

// checkTOMLKeys refuses a key that matches a setting only when case is
// ignored (go-toml, like encoding/json, folds case when decoding into a
// struct): "WORKERS" or "[POOL]" must not pass for what they resemble.
func checkTOMLKeys(file string, data []byte) error {
	var m map[string]any
	if err := toml.Unmarshal(data, &m); err != nil {
		return describeTOMLError(file, err)
	}
	var walk func(m map[string]any, s *keySchema, path []string) error
	walk = func(m map[string]any, s *keySchema, path []string) error {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			child := s.child(k)
			full := strings.Join(append(slices.Clone(path), k), ".")
			if child == nil {
				msg := fmt.Sprintf("%s:%d: unknown key %s", file, keyLine(data, k), full)
				for _, n := range s.names() {
					if strings.EqualFold(n, k) {
						return fmt.Errorf("%s: keys are exact and case-sensitive; did you mean %s?", msg, n)
					}
				}
				return errors.New(msg)
			}
			if sub, ok := m[k].(map[string]any); ok {
				if err := walk(sub, child, append(path, k)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(m, fileKeys, nil)
}

// keyLine finds the line that defines key, as a table header or an
// assignment; 0 when it cannot tell.
func keyLine(data []byte, key string) int {
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, key); ok && strings.HasPrefix(strings.TrimSpace(rest), "=") {
			return i + 1
		}
		if strings.HasPrefix(line, "[") {
			header, _, _ := strings.Cut(strings.Trim(line, "[]"), "]")
			for _, part := range strings.Split(header, ".") {
				if strings.TrimSpace(part) == key {
					return i + 1
				}
			}
		}
	}
	return 0
}

// describeTOMLError turns go-toml's errors into "file:line: key: problem".
func describeTOMLError(file string, err error) error {
	var sm *toml.StrictMissingError
	if errors.As(err, &sm) {
		var msgs []string
		for _, e := range sm.Errors {
			row, _ := e.Position()
			msgs = append(msgs, fmt.Sprintf("%s:%d: unknown key %s", file, row, strings.Join(e.Key(), ".")))
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, _ := de.Position()
		msg := de.Error()
		msg = strings.TrimPrefix(msg, "toml: ")
		if key := de.Key(); len(key) > 0 {
			return fmt.Errorf("%s:%d: key %s: %s", file, row, strings.Join(key, "."), msg)
		}
		return fmt.Errorf("%s:%d: %s", file, row, msg)
	}
	return fmt.Errorf("%s: %w", file, err)
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
