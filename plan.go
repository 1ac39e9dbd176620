package pynox

import (
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/worker"
)

// DefaultName is the file name inline code gets in tracebacks and error
// locations when the request names none.
const DefaultName = "<code>"

// Request bounds that are not limits of the ceiling.
const (
	maxGrants     = 64      // paths per request, all lists together
	maxScriptSize = 4 << 20 // bytes of a script file
	maxCodeSize   = 4 << 20 // bytes of inline code (a JSONL line is at most 1 MiB anyway)
)

// plan is a validated request: everything a child needs, with the grants
// opened and verified. close releases the grants' descriptors.
type plan struct {
	job      worker.Job
	fds      []int    // the grants' O_PATH descriptors
	accessOf []uint64 // the Landlock rights of each descriptor
	read     []string
	write    []string
	network  bool
}

func (pl *plan) close() {
	for _, fd := range pl.fds {
		unix.Close(fd)
	}
	pl.fds = nil
}

// plan checks a request against the ceiling and resolves its grants. On
// error nothing stays open. A session's plan takes no code (its steps
// bring it) and no script.
func (p *Pool) plan(req *Job, session bool) (pl *plan, rerr *Error) {
	if err := checkID(req.ID); err != nil {
		return nil, err
	}
	j := req
	if req.Profile != "" {
		prof, ok := p.cfg.Profiles[req.Profile]
		if !ok {
			return nil, requestErrorf("unknown profile %q (profiles: %s)", req.Profile, strings.Join(p.cfg.ProfileNames(), ", "))
		}
		merged := req.withProfile(prof)
		j = &merged
	}
	switch {
	case session && j.Script != "":
		return nil, requestErrorf("sessions take inline code, not script")
	case session:
	case j.Code == "" && j.Script == "":
		return nil, requestErrorf("exactly one of code and script is required")
	case j.Code != "" && j.Script != "":
		return nil, requestErrorf("exactly one of code and script is allowed, not both")
	case len(j.Code) > maxCodeSize:
		return nil, requestErrorf("code is %d bytes; the limit is %d", len(j.Code), maxCodeSize)
	}
	l := p.cfg.Limits
	timeout, err := limit("timeout", int64(j.Timeout), int64(l.Timeout), formatDuration)
	if err != nil {
		return nil, err
	}
	memory, err := limit("memory", int64(j.Memory), l.Memory, formatSize)
	if err != nil {
		return nil, err
	}
	maxOut, err := limit("max_output", int64(j.MaxOutput), int64(l.MaxOutput), formatSize)
	if err != nil {
		return nil, err
	}
	fsize, err := limit("max_file_size", int64(j.MaxFileSize), l.MaxFileSize, formatSize)
	if err != nil {
		return nil, err
	}
	if j.AllowNetwork && !l.AllowNetwork {
		return nil, requestErrorf("allow_network: the pool's ceiling does not allow the network")
	}
	for k, v := range j.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, requestErrorf("env: invalid variable %q", k)
		}
	}
	if err := checkFunctions(j.Functions); err != nil {
		return nil, err
	}
	if n := len(j.AllowRead) + len(j.AllowWrite) + len(j.PackageDirs); n > maxGrants {
		return nil, requestErrorf("%d paths requested; at most %d are allowed", n, maxGrants)
	}

	pl = &plan{network: j.AllowNetwork}
	opened := pl
	defer func() {
		if rerr != nil {
			opened.close()
		}
	}()
	abi := p.info.Landlock.ABI
	readCeiling := p.readCeiling
	for _, path := range j.AllowRead {
		real, _, err := pl.grant("allow_read", p.cfg.Dir, path, readCeiling, sandbox.ReadAccess(abi))
		if err != nil {
			return nil, err
		}
		pl.read = append(pl.read, real)
	}
	var pkgDirs []string
	for _, path := range j.PackageDirs {
		real, isDir, err := pl.grant("package_dirs", p.cfg.Dir, path, readCeiling, sandbox.ReadAccess(abi))
		if err != nil {
			return nil, err
		}
		if !isDir {
			return nil, requestErrorf("package_dirs: %s is not a directory", real)
		}
		pkgDirs = append(pkgDirs, real)
	}
	protected := append(append([]string(nil), p.info.RuntimePaths...), pkgDirs...)
	for _, path := range j.AllowWrite {
		real, _, err := pl.grant("allow_write", p.cfg.Dir, path, l.AllowWrite, sandbox.WriteAccess(abi))
		if err != nil {
			return nil, err
		}
		for _, r := range protected {
			if beneath(r, real) || beneath(real, r) {
				return nil, requestErrorf("allow_write: %s would cover %s, which holds the interpreter or its packages and must stay read-only", real, r)
			}
		}
		pl.write = append(pl.write, real)
	}

	code, name, isScript := j.Code, j.Name, false
	if j.Script != "" {
		src, err := readScript(p.cfg.Dir, j.Script, readCeiling)
		if err != nil {
			return nil, err
		}
		code, isScript = src, true
		if name == "" {
			name = j.Script
		}
	}
	if name == "" {
		name = DefaultName
	}
	cpu := cpuBackstop(time.Duration(timeout))
	pl.job = worker.Job{
		Code:    code,
		Name:    name,
		Script:  isScript,
		Argv:    nonNilStrings(j.Args),
		Env:     j.Env,
		Path:    pkgDirs,
		Network: j.AllowNetwork,
		Limits: worker.Limits{
			Memory:  memory,
			Fsize:   fsize,
			CPUSecs: cpu,
		},
		Timeout:   time.Duration(timeout),
		MaxOutput: int(maxOut),
		Functions: j.Functions,
		MaxCalls:  MaxCalls,
		Session:   session,
	}
	for i, fd := range pl.fds {
		pl.job.Grants = append(pl.job.Grants, worker.Grant{Fd: fd, Access: pl.accessOf[i]})
	}
	return pl, nil
}

// cpuBackstop is the RLIMIT_CPU of a job (or session step) with this
// timeout: one second past it, so that Go's timer acts first.
func cpuBackstop(timeout time.Duration) int64 {
	return int64(math.Ceil(timeout.Seconds())) + 1
}

// limit applies a ceiling: zero means the ceiling's value, more than the
// ceiling is refused.
func limit(field string, v, ceiling int64, format func(int64) string) (int64, *Error) {
	if v < 0 {
		return 0, requestErrorf("%s must not be negative", field)
	}
	if v == 0 {
		return ceiling, nil
	}
	if v > ceiling {
		return 0, requestErrorf("%s %s exceeds the pool's ceiling of %s", field, format(v), format(ceiling))
	}
	return v, nil
}

// grant opens path (relative to dir) with O_PATH, finds what it really
// names through the descriptor (so no later symlink swap can redirect it),
// checks it lies beneath one of ceiling, and keeps the descriptor for the
// job's Landlock rule.
func (pl *plan) grant(field, dir, path string, ceiling []string, access uint64) (real string, isDir bool, rerr *Error) {
	if path == "" {
		return "", false, requestErrorf("%s: empty path", field)
	}
	if strings.ContainsRune(path, 0) {
		return "", false, requestErrorf("%s: path contains a NUL byte", field)
	}
	abs := path
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(dir, abs)
	}
	fd, err := unix.Open(abs, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", false, requestErrorf("%s: %s: %v", field, path, err)
	}
	real, err = os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil || !filepath.IsAbs(real) {
		unix.Close(fd)
		return "", false, requestErrorf("%s: %s: cannot resolve", field, path)
	}
	if !beneathAny(real, ceiling) {
		unix.Close(fd)
		return "", false, requestErrorf("%s: %s is outside the pool's ceiling (%s)", field, real, ceilingList(ceiling))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return "", false, requestErrorf("%s: %s: %v", field, path, err)
	}
	isDir = st.Mode&unix.S_IFMT == unix.S_IFDIR
	if !isDir {
		access = sandbox.ForFile(access)
	}
	pl.fds = append(pl.fds, fd)
	pl.accessOf = append(pl.accessOf, access)
	return real, isDir, nil
}

// readScript reads a script file for a job: the pool reads it, so it must
// lie beneath the ceiling like any path a request names. It is judged
// through an O_PATH descriptor first, and only then opened for reading
// (through that descriptor), so the pool never opens a file outside the
// ceiling (a confined pool could not, anyway).
func readScript(dir, path string, ceiling []string) (string, *Error) {
	if strings.ContainsRune(path, 0) {
		return "", requestErrorf("script: path contains a NUL byte")
	}
	abs := path
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(dir, abs)
	}
	fd, err := unix.Open(abs, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", requestErrorf("script: %s: %v", path, err)
	}
	defer unix.Close(fd)
	fdPath := "/proc/self/fd/" + strconv.Itoa(fd)
	real, err := os.Readlink(fdPath)
	if err != nil {
		return "", requestErrorf("script: %s: cannot resolve", path)
	}
	if !beneathAny(real, ceiling) {
		return "", requestErrorf("script: %s is outside the pool's ceiling (%s)", real, ceilingList(ceiling))
	}
	f, err := os.OpenFile(fdPath, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return "", requestErrorf("script: %s: %v", real, unwrapPathErr(err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return "", requestErrorf("script: %s is not a regular file", real)
	}
	if st.Size() > maxScriptSize {
		return "", requestErrorf("script: %s is %d bytes; the limit is %d", real, st.Size(), maxScriptSize)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxScriptSize+1))
	if err != nil {
		return "", requestErrorf("script: %s: %v", real, err)
	}
	if len(b) > maxScriptSize {
		return "", requestErrorf("script: %s is larger than %d bytes", real, maxScriptSize)
	}
	return string(b), nil
}

func unwrapPathErr(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// beneath reports whether path is base or lies inside it. Both must be
// clean absolute paths.
func beneath(path, base string) bool {
	if base == "/" {
		return true
	}
	return path == base || strings.HasPrefix(path, base+"/")
}

func beneathAny(path string, bases []string) bool {
	for _, b := range bases {
		if beneath(path, b) {
			return true
		}
	}
	return false
}

func ceilingList(c []string) string {
	if len(c) == 0 {
		return "it allows no paths"
	}
	return "allowed: " + strings.Join(slices.Compact(slices.Sorted(slices.Values(c))), ", ")
}

// checkID accepts the ids the protocol echoes: absent, a string, or a
// number.
func checkID(id any) *Error {
	switch id.(type) {
	case nil, string, json.Number, int, int32, int64, uint, uint32, uint64, float64:
		return nil
	}
	return requestErrorf("id must be a string or a number")
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
