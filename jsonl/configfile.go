package jsonl

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	toml "github.com/pelletier/go-toml/v2"

	"github.com/pynox/pynox"
)

// File is a configuration file as `pynox pool --config` reads it: the
// [pynox.Config] it describes plus the settings that belong to the command.
type File struct {
	// Path is the file's absolute, symlink-free path.
	Path string
	// Config is the pool configuration; relative paths in the file are
	// already resolved against the file's directory.
	Config pynox.Config
	// Log is the [pool] log setting: "json" for one JSON line per finished
	// job on stderr, or "" for none.
	Log string
	// ConfineSelf is the [pool] confine_self setting, true unless the file
	// sets it to false: whether `pynox pool` confines its own process
	// (Config.ConfineSelf, which LoadConfig leaves false for programs that
	// embed the library).
	ConfineSelf bool
	// PinCPUs is the [pool] pin_cpus setting, true unless the file sets
	// it to false: whether `pynox pool` pins each template and its jobs
	// to one CPU (Config.PinCPUs, which LoadConfig leaves false for
	// programs that embed the library).
	PinCPUs bool

	lines map[string]int // dotted key -> the line that sets it
}

// Line returns the line of the file that sets key, a dotted key such as
// "pool.limits.allow_read" or "profiles.analysis.timeout" (the form
// [pynox.ConfigError.Key] takes), or of the nearest enclosing table the file
// names; 0 when the file sets neither, as for a default.
func (f *File) Line(key string) int {
	if f == nil {
		return 0
	}
	return lineOf(f.lines, key)
}

// fileSchema mirrors the TOML layout; decoding is strict, so any key not
// here is an error.
type fileSchema struct {
	Pool struct {
		Workers     *int            `toml:"workers"`
		Preload     []string        `toml:"preload"`
		PackageDirs []string        `toml:"package_dirs"`
		MaxSessions *int            `toml:"max_sessions"`
		SessionIdle *pynox.Duration `toml:"session_idle"`
		IdleDump    *string         `toml:"session_idle_dump"`
		EvictIdle   *bool           `toml:"evict_idle"`
		PIDNS       *string         `toml:"pid_namespace"`
		Log         *string         `toml:"log"`
		Python      *string         `toml:"python"`
		Cgroups     *string         `toml:"cgroups"`
		ConfineSelf *bool           `toml:"confine_self"`
		PinCPUs     *bool           `toml:"pin_cpus"`
		ScratchDir  *string         `toml:"scratch_dir"`
		Limits      limitSchema     `toml:"limits"`
	} `toml:"pool"`
	Profiles map[string]profileSchema `toml:"profiles"`
}

type limitSchema struct {
	AllowRead    []string        `toml:"allow_read"`
	AllowWrite   []string        `toml:"allow_write"`
	AllowNetwork *bool           `toml:"allow_network"`
	Timeout      *pynox.Duration `toml:"timeout"`
	Memory       *pynox.Size     `toml:"memory"`
	MaxOutput    *pynox.Size     `toml:"max_output"`
	MaxFileSize  *pynox.Size     `toml:"max_file_size"`
	Threads      *int            `toml:"threads"`
}

type profileSchema struct {
	AllowRead    []string          `toml:"allow_read"`
	AllowWrite   []string          `toml:"allow_write"`
	PackageDirs  []string          `toml:"package_dirs"`
	Env          map[string]string `toml:"env"`
	AllowNetwork bool              `toml:"allow_network"`
	Timeout      pynox.Duration    `toml:"timeout"`
	Memory       pynox.Size        `toml:"memory"`
	MaxOutput    pynox.Size        `toml:"max_output"`
	MaxFileSize  pynox.Size        `toml:"max_file_size"`
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
		return nil, &pynox.ConfigError{Key: "config", Value: path, Problem: hooks.PathProblem(err, "a TOML configuration file")}
	}
	data, err := os.ReadFile(real)
	if err != nil {
		return nil, &pynox.ConfigError{Key: "config", Value: path, Problem: hooks.PathProblem(err, "a TOML configuration file")}
	}
	lines := keyLines(data)
	if err := checkTOMLKeys(real, data, lines); err != nil {
		return nil, err
	}
	var s fileSchema
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, describeTOMLErrorAt(real, err, lines)
	}
	// bad reports an invalid value of key, at the line that sets it.
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("%s:%d: %s: %s", real, lineOf(lines, key), key, fmt.Sprintf(format, args...))
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
			return nil, fmt.Errorf("config %s: %s: %s", real, l.field, hooks.EmptyPath())
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
	f := &File{Path: real, ConfineSelf: true, PinCPUs: true, lines: lines}
	if s.Pool.ConfineSelf != nil {
		f.ConfineSelf = *s.Pool.ConfineSelf
	}
	if s.Pool.PinCPUs != nil {
		f.PinCPUs = *s.Pool.PinCPUs
	}
	c := &f.Config
	c.Source = real
	if s.Pool.Workers != nil {
		if *s.Pool.Workers <= 0 {
			return nil, bad("pool.workers", "expected a positive integer, got %d", *s.Pool.Workers)
		}
		if *s.Pool.Workers > pynox.MaxWorkers {
			return nil, bad("pool.workers", "expected at most %d, got %d", pynox.MaxWorkers, *s.Pool.Workers)
		}
		c.Workers = *s.Pool.Workers
	}
	c.Preload = s.Pool.Preload
	c.PackageDirs = resolve(s.Pool.PackageDirs)
	if s.Pool.MaxSessions != nil {
		if *s.Pool.MaxSessions <= 0 {
			return nil, bad("pool.max_sessions", "expected a positive integer, got %d", *s.Pool.MaxSessions)
		}
		c.MaxSessions = *s.Pool.MaxSessions
	}
	if s.Pool.SessionIdle != nil {
		c.SessionIdle = time.Duration(*s.Pool.SessionIdle)
	}
	if s.Pool.IdleDump != nil {
		c.SessionIdleDump = resolve([]string{*s.Pool.IdleDump})[0]
	}
	if s.Pool.EvictIdle != nil {
		c.EvictIdle = *s.Pool.EvictIdle
	}
	if s.Pool.PIDNS != nil {
		switch *s.Pool.PIDNS {
		case "auto", "require", "off":
			c.PIDNamespace = *s.Pool.PIDNS
		default:
			return nil, bad("pool.pid_namespace", `expected "auto", "require" or "off", got %q`, *s.Pool.PIDNS)
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
			return nil, bad("pool.log", `expected "json" or "", got %q`, *s.Pool.Log)
		}
	}
	if s.Pool.Cgroups != nil {
		switch *s.Pool.Cgroups {
		case "auto", "require", "off":
			c.Cgroups = *s.Pool.Cgroups
		default:
			return nil, bad("pool.cgroups", `expected "auto", "require" or "off", got %q`, *s.Pool.Cgroups)
		}
	}
	if s.Pool.ScratchDir != nil {
		if *s.Pool.ScratchDir == "" {
			return nil, bad("pool.scratch_dir", "expected a directory, got an empty string (leave the key out for the system's temporary directory)")
		}
		c.ScratchDir = *s.Pool.ScratchDir
		if !filepath.IsAbs(c.ScratchDir) {
			c.ScratchDir = filepath.Join(dir, c.ScratchDir)
		}
	}
	l := s.Pool.Limits
	if l.Threads != nil {
		if *l.Threads <= 0 {
			return nil, bad("pool.limits.threads", "expected a positive integer, got %d", *l.Threads)
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
		c.Profiles = make(map[string]pynox.Profile, len(s.Profiles))
		for name, ps := range s.Profiles {
			c.Profiles[name] = pynox.Profile{
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
			return nil, bad("pool.limits.allow_write", "%s covers this file: it lies beneath its own write ceiling, so a job could rewrite the pool's configuration; "+
				"keep the file outside allow_write, or narrow it", wr)
		}
	}
	return f, nil
}

// fileKeys is the exact key set of a configuration file.
var fileKeys = schemaOf(reflect.TypeFor[fileSchema](), "toml", "the configuration file")

// checkTOMLKeys refuses a key that matches a setting only when case is
// ignored (go-toml, like encoding/json, folds case when decoding into a
// struct): "WORKERS" or "[POOL]" must not pass for what they resemble.
//
// It also checks each value's type, so that a mistake reads
// "pynox.toml:3: pool.workers: expected an integer, got a string" rather
// than the decoder's account of Go types, and so that a duration written
// as a bare number is refused rather than taken for nanoseconds.
func checkTOMLKeys(file string, data []byte, lines map[string]int) error {
	var m map[string]any
	if err := toml.Unmarshal(data, &m); err != nil {
		return describeTOMLErrorAt(file, err, lines)
	}
	var walk func(m map[string]any, s *keySchema, path []string) error
	walk = func(m map[string]any, s *keySchema, path []string) error {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			child := s.child(k)
			full := strings.Join(append(slices.Clone(path), k), ".")
			if child == nil {
				msg := fmt.Sprintf("%s:%d: unknown key %s", file, lineOf(lines, full), full)
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
	if err := walk(m, fileKeys, nil); err != nil {
		return err
	}
	return checkTOMLTypes(file, lines, m)
}

// keyLines maps each dotted key the file sets (table headers included)
// to its line. It reads lines, not TOML: a key set in an inline table is
// found at its table's line (see lineOf), and text inside a multi-line
// value could be taken for a key, which costs at worst a wrong line
// number in a message.
func keyLines(data []byte) map[string]int {
	out := map[string]int{}
	set := func(key string, line int) {
		if _, ok := out[key]; !ok {
			out[key] = line
		}
	}
	table := ""
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "", line[0] == '#':
		case line[0] == '[':
			h := strings.TrimLeft(line, "[")
			h, _, _ = strings.Cut(h, "]")
			table = normKey(h)
			set(table, i+1)
		default:
			k, _, ok := strings.Cut(line, "=")
			if !ok {
				continue
			}
			if table != "" {
				k = table + "." + k
			}
			set(normKey(k), i+1)
		}
	}
	return out
}

// normKey writes a TOML key as a plain dotted key: `pool . "limits"` is
// pool.limits.
func normKey(k string) string {
	parts := strings.Split(k, ".")
	for i, p := range parts {
		parts[i] = strings.Trim(strings.TrimSpace(p), `"'`)
	}
	return strings.Join(parts, ".")
}

// lineOf returns the line that sets key, or failing that the nearest
// enclosing table's; 0 when neither is known.
func lineOf(lines map[string]int, key string) int {
	for k := key; k != ""; {
		if l, ok := lines[k]; ok {
			return l
		}
		i := strings.LastIndexByte(k, '.')
		if i < 0 {
			break
		}
		k = k[:i]
	}
	return 0
}

// checkTOMLTypes refuses a value whose TOML type does not fit its key.
func checkTOMLTypes(file string, lines map[string]int, m map[string]any) error {
	var walk func(v any, t reflect.Type, key string) error
	walk = func(v any, t reflect.Type, key string) error {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		want := tomlExpected(t)
		fail := func(got string) error {
			return fmt.Errorf("%s:%d: %s: expected %s, got %s", file, lineOf(lines, key), key, want, got)
		}
		switch t {
		case reflect.TypeFor[pynox.Duration]():
			if _, ok := v.(string); !ok {
				return fail(tomlGot(v))
			}
			return nil
		case reflect.TypeFor[pynox.Size]():
			switch n := v.(type) {
			case string:
				return nil
			case int64:
				if n <= 0 {
					// 0 would pass for "not set": the default.
					return fmt.Errorf("%s:%d: %s: invalid size %d: want a positive number of bytes or a string such as \"512m\"", file, lineOf(lines, key), key, n)
				}
				return nil
			}
			return fail(tomlGot(v))
		}
		switch t.Kind() {
		case reflect.Struct:
			tbl, ok := v.(map[string]any)
			if !ok {
				return fail(tomlGot(v))
			}
			for f := range t.Fields() {
				name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
				if sub, ok := tbl[name]; ok {
					if err := walk(sub, f.Type, key+"."+name); err != nil {
						return err
					}
				}
			}
		case reflect.Map:
			tbl, ok := v.(map[string]any)
			if !ok {
				return fail(tomlGot(v))
			}
			for _, k := range slices.Sorted(maps.Keys(tbl)) {
				if err := walk(tbl[k], t.Elem(), key+"."+k); err != nil {
					return err
				}
			}
		case reflect.Slice:
			arr, ok := v.([]any)
			if !ok {
				return fail(tomlGot(v))
			}
			for _, e := range arr {
				if err := walk(e, t.Elem(), key); err != nil {
					return fail("an array holding " + tomlGot(e))
				}
			}
		case reflect.String:
			if _, ok := v.(string); !ok {
				return fail(tomlGot(v))
			}
		case reflect.Int, reflect.Int64:
			if _, ok := v.(int64); !ok {
				return fail(tomlGot(v))
			}
		case reflect.Bool:
			if _, ok := v.(bool); !ok {
				return fail(tomlGot(v))
			}
		}
		return nil
	}
	st := reflect.TypeFor[fileSchema]()
	for f := range st.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if v, ok := m[name]; ok {
			if err := walk(v, f.Type, name); err != nil {
				return err
			}
		}
	}
	return nil
}

// unitExpected names what a duration or a size takes, in requests and
// in the config file alike; ok is false for any other type.
func unitExpected(t reflect.Type) (_ string, ok bool) {
	switch t {
	case reflect.TypeFor[pynox.Duration]():
		return `a duration string such as "5s" or "500ms"`, true
	case reflect.TypeFor[pynox.Size]():
		return `a size: a number of bytes or a string such as "512m"`, true
	}
	return "", false
}

// tomlExpected names what a key of Go type t takes, in TOML's words.
func tomlExpected(t reflect.Type) string {
	if u, ok := unitExpected(t); ok {
		return u
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64:
		return "an integer"
	case reflect.Slice:
		return "an array of " + strings.TrimPrefix(strings.TrimPrefix(tomlExpected(t.Elem()), "an "), "a ") + "s"
	case reflect.Map:
		return "a table of " + strings.TrimPrefix(strings.TrimPrefix(tomlExpected(t.Elem()), "an "), "a ") + "s"
	case reflect.Struct:
		return "a table"
	}
	return "another kind of value"
}

// tomlGot names the TOML type of a decoded value.
func tomlGot(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	}
	return "a date or time"
}

// describeTOMLErrorAt is describeTOMLError that, for an error go-toml
// reports without a key (a number too large for 64 bits), names the key
// that lines says is set on the error's line.
func describeTOMLErrorAt(file string, err error, lines map[string]int) error {
	var de *toml.DecodeError
	if errors.As(err, &de) && len(de.Key()) == 0 {
		row, _ := de.Position()
		key := ""
		for k, l := range lines {
			// The longest: a key, rather than the table whose header
			// shares its line (an inline table).
			if l == row && len(k) > len(key) {
				key = k
			}
		}
		if key != "" {
			return fmt.Errorf("%s:%d: %s: %s", file, row, key, strings.TrimPrefix(de.Error(), "toml: "))
		}
	}
	return describeTOMLError(file, err)
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
		if strings.Contains(msg, "cannot decode TOML") {
			// checkTOMLKeys names types in TOML's words; this is a
			// backstop that keeps Go's struct types out of the message.
			msg = "a value of the wrong type"
		}
		if key := de.Key(); len(key) > 0 {
			return fmt.Errorf("%s:%d: %s: %s", file, row, strings.Join(key, "."), msg)
		}
		return fmt.Errorf("%s:%d: %s", file, row, msg)
	}
	return fmt.Errorf("%s: %w", file, err)
}
