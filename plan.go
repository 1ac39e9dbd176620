package pynox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/mountns"
	"github.com/pynox/pynox/internal/rawsys"
	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/worker"
)

// DefaultName is the file name inline code gets in tracebacks and error
// locations when the request names none.
const DefaultName = "<code>"

// Bounds of a job (a request of the pool protocol) that are not limits of
// the ceiling: [Pool.Run], [Pool.Checkout] and [Checkout.Feed] refuse a
// job or step beyond them with a RequestError.
const (
	// MaxGrants is how many paths one job may name in AllowRead,
	// AllowWrite and PackageDirs together.
	MaxGrants = 64
	// MaxScriptSize is the largest script file a job may name, in bytes.
	MaxScriptSize = 4 << 20
	// MaxCodeSize is the largest inline code of a job or step, in bytes
	// (a JSON Lines request is at most jsonl.MaxLine bytes anyway).
	MaxCodeSize = 4 << 20
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
	mounts   []MountSpec // as enforced: real host paths, modes made explicit
	// sigs are the signatures of the job's Tools, by name: calls are
	// checked against them (checkedHost).
	sigs map[string]*Signature

	scratchRoot *scratchRoot // where scratch was made; nil when none was
	scratch     string       // its name in scratchRoot
	scratchFd   int          // its O_PATH descriptor, among fds; -1 when none
	// outWatch is a session's watch on its outputs directory
	// (outputs_watch.go); nil for one-shot jobs.
	outWatch *outputsWatch

	collect []collectPattern // Job.Collect, checked

	nsMounts  []nsMount          // mounts that need the job's own mount namespace (nsmount.go)
	ns        *mountns.Namespace // that namespace, once built
	nsSlot    chan struct{}      // the pool's slot a one-shot job's namespace holds (nsmount.go: jobSlots)
	nsPlanned *nsPlanned         // the namespace plan nsCheck made before the job took a process, until used
	nsLease   *nsLeaseHold       // the leased namespace the job's spare entered, until attached or released (nsmount.go: nsFor)
	aheadFill bool               // a namespace ahead is to be attached once the job is answered (nsmount_ahead.go)
	// aheadNS is the namespace attached ahead that the one-shot job took,
	// which the pool takes back once the job's process is gone
	// (nsmount_ahead.go: recycle); recycle does it.
	aheadNS *nsAhead
	recycle func(n *nsAhead, scratch string, exited bool)
}

// scratchDir is the path of the plan's scratch directory, or "".
func (pl *plan) scratchDir() string {
	if pl.scratchRoot == nil {
		return ""
	}
	return pl.scratchRoot.dir(pl.scratch)
}

// swapScratch makes the scratch directory name (fd its descriptor; an
// empty directory the pool made, which no live process uses) the plan's,
// in place of the one it made: its descriptor and its grant, its outputs
// directory, TMPDIR, HOME and PYNOX_OUTPUTS where they name the old one,
// and the collect patterns beneath it. The old one, which no process
// saw, is emptied for another job. Called before the job's process gets
// the job.
func (pl *plan) swapScratch(name string, fd int) error {
	i := slices.Index(pl.fds, pl.scratchFd)
	if pl.scratchRoot == nil || i < 0 || i >= len(pl.job.Grants) || pl.job.Grants[i].Fd != pl.scratchFd {
		return errors.New("the plan's scratch directory is not among its grants")
	}
	root, old := pl.scratchRoot, pl.scratch
	oldDir, dir := root.dir(old), root.dir(name)
	outputs, err := makeOutputs(fd, dir)
	if err != nil {
		return err
	}
	for _, k := range []string{"TMPDIR", "HOME"} {
		if pl.job.Env[k] == oldDir {
			pl.job.Env[k] = dir
		}
	}
	if pl.job.Env["PYNOX_OUTPUTS"] == oldDir+"/"+OutputsDir {
		pl.job.Env["PYNOX_OUTPUTS"] = outputs
	}
	// The collect patterns beneath $TMPDIR were resolved to the old one,
	// which goes back to the pool for another job (any tenant's): they
	// name this one now.
	for i := range pl.collect {
		if pl.collect[i].root == oldDir {
			pl.collect[i].root = dir
		}
	}
	rawsys.Close(pl.scratchFd)
	pl.fds[i], pl.job.Grants[i].Fd = fd, fd
	pl.scratch, pl.scratchFd = name, fd
	go root.release(old)
	return nil
}

// close releases the grants' descriptors and removes the plan's scratch
// directory: it is called once no process of the job (or session) can
// act any more, or is about to be killed (a dying process may still add
// an entry, which stays until the pool closes; the directory is not
// reused).
func (pl *plan) close() {
	pl.closeGrants()
	pl.closeOutputsWatch()
	if pl.scratchRoot != nil {
		pl.scratchRoot.remove(pl.scratch)
		pl.scratchRoot = nil
	}
}

// closeGrants releases the grants' descriptors (the scratch directory's
// included): once the job has its Landlock rules they are no longer
// needed.
func (pl *plan) closeGrants() {
	for _, fd := range pl.fds {
		rawsys.Close(fd)
	}
	pl.fds = nil
	pl.scratchFd = -1
	pl.closeNS()
}

// closeAfter is close for a job that ran in child: the scratch directory
// is emptied once the template has reported the child's exit, and then
// kept for another job; if that report does not come soon, it is removed
// instead (see close).
func (pl *plan) closeAfter(child *worker.Child) {
	// The namespace taken ahead goes back to the pool with the scratch
	// directory it shows, once the process is gone (recycle empties it).
	n, recycle := pl.aheadNS, pl.recycle
	pl.aheadNS, pl.recycle = nil, nil
	pl.closeGrants()
	root, name := pl.scratchRoot, pl.scratch
	pl.scratchRoot = nil
	if root == nil {
		if n != nil {
			recycle(n, "", false)
		}
		return
	}
	go func() {
		exited := child.Exited(2 * time.Second)
		switch {
		case n != nil:
			recycle(n, name, exited)
		case exited:
			root.release(name)
		default:
			root.remove(name)
		}
	}()
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
			if len(p.cfg.Profiles) == 0 {
				return nil, requestErrorf("profile: unknown profile %q: this pool has no profiles configured "+
					"(profiles are [profiles.NAME] tables of the file given to pynox pool --config)", req.Profile)
			}
			return nil, requestErrorf("profile: unknown profile %q; the configured profiles are %s",
				req.Profile, strings.Join(p.cfg.ProfileNames(), ", "))
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
	case len(j.Code) > MaxCodeSize:
		return nil, requestErrorf("code is %d bytes; the limit is %d", len(j.Code), MaxCodeSize)
	}
	l := p.cfg.Limits
	// from names a setting as the request gave it, or, when the request
	// left it to its profile, as the profile did.
	from := func(field string, own bool) string {
		if req.Profile != "" && !own {
			return "profile " + strconv.Quote(req.Profile) + " " + field
		}
		return field
	}
	timeout, err := limit(from("timeout", req.Timeout != 0), int64(j.Timeout), int64(l.Timeout), formatDuration)
	if err != nil {
		return nil, err
	}
	memory, err := limit(from("memory", req.Memory != 0), int64(j.Memory), l.Memory, formatSize)
	if err != nil {
		return nil, err
	}
	maxOut, err := limit(from("max_output", req.MaxOutput != 0), int64(j.MaxOutput), int64(l.MaxOutput), formatSize)
	if err != nil {
		return nil, err
	}
	fsize, err := limit(from("max_file_size", req.MaxFileSize != 0), int64(j.MaxFileSize), l.MaxFileSize, formatSize)
	if err != nil {
		return nil, err
	}
	if j.AllowNetwork && !l.AllowNetwork {
		return nil, requestErrorf("%s: the pool's ceiling does not allow the network", from("allow_network", req.AllowNetwork))
	}
	for k, v := range j.Env {
		if !validEnv(k, v) {
			return nil, requestErrorf("env: invalid variable %q: %s", k, envRule)
		}
	}
	if err := checkFunctions(j.Functions); err != nil {
		return nil, err
	}
	inputs, err := encodeInputs(j.Inputs)
	if err != nil {
		return nil, err
	}
	sigs, terr := checkTools(j.Tools, j.Functions)
	if terr != nil {
		return nil, terr
	}
	if n := len(j.AllowRead) + len(j.AllowWrite) + len(j.PackageDirs) + len(j.Mounts); n > MaxGrants {
		return nil, requestErrorf("%d paths requested; at most %d are allowed", n, MaxGrants)
	}

	pl = &plan{network: j.AllowNetwork, scratchFd: -1}
	opened := pl
	defer func() {
		if rerr != nil {
			opened.close()
		}
	}()
	abi := p.info.Landlock.ABI
	readCeiling := p.readCeiling
	readFromProfile := len(j.AllowRead) - len(req.AllowRead) // the first grants are the profile's
	for i, path := range j.AllowRead {
		real, _, err := pl.grant(from("allow_read", i >= readFromProfile), p.cfg.Dir, path, readCeiling, sandbox.ReadAccess(abi))
		if err != nil {
			return nil, err
		}
		if err := p.coversScratch("allow_read", real); err != nil {
			return nil, err
		}
		if err := readCoversConfig("allow_read", real, pl.fds[len(pl.fds)-1], p.own); err != nil {
			return nil, err
		}
		pl.read = append(pl.read, real)
	}
	var pkgDirs []string
	pkgFromProfile := len(j.PackageDirs) - len(req.PackageDirs)
	for i, path := range j.PackageDirs {
		real, isDir, err := pl.grant(from("package_dirs", i >= pkgFromProfile), p.cfg.Dir, path, readCeiling, sandbox.ReadAccess(abi))
		if err != nil {
			return nil, err
		}
		if !isDir {
			return nil, requestErrorf("package_dirs: %s is not a directory", real)
		}
		if err := p.coversScratch("package_dirs", real); err != nil {
			return nil, err
		}
		if err := readCoversConfig("package_dirs", real, pl.fds[len(pl.fds)-1], p.own); err != nil {
			return nil, err
		}
		pkgDirs = append(pkgDirs, real)
	}
	protected := append(append([]string(nil), p.info.RuntimePaths...), pkgDirs...)
	if len(j.AllowWrite) > 0 && len(l.AllowWrite) == 0 {
		return nil, requestErrorf("allow_write: %s", noWrites(l))
	}
	fromProfile := 0 // the first grants of j.AllowWrite are the profile's
	if req.Profile != "" {
		fromProfile = len(p.cfg.Profiles[req.Profile].AllowWrite)
	}
	for i, path := range j.AllowWrite {
		field := "allow_write"
		if i < fromProfile {
			field = "profile " + strconv.Quote(req.Profile) + " allow_write"
		}
		real, err := p.writeGrant(pl, field, path, protected)
		if err != nil {
			return nil, err
		}
		pl.write = append(pl.write, real)
	}
	if err := p.planMounts(pl, j.Mounts, protected); err != nil {
		return nil, err
	}
	env := j.Env
	if p.scratch != nil {
		name, fd, err := p.scratch.create()
		if errors.Is(err, errScratchClosed) {
			return nil, errClosed()
		}
		if err != nil {
			return nil, newError(KindSandboxSetup, "the job's scratch directory could not be made in %s: %v", p.scratch.path, err)
		}
		pl.scratchRoot, pl.scratch, pl.scratchFd = p.scratch, name, fd
		if session {
			// The pool's inotify instance is made with its first
			// session (outputs_watch.go).
			p.scratch.outputsWatcher()
			pl.outWatch = newOutputsWatch()
		}
		pl.fds = append(pl.fds, fd)
		pl.accessOf = append(pl.accessOf, sandbox.WriteAccess(abi))
		env = scratchEnv(j.Env, p.scratch.dir(name))
		outputs, err := makeOutputs(fd, p.scratch.dir(name))
		if err != nil {
			return nil, newError(KindSandboxSetup, "the job's outputs directory could not be made in %s: %v", p.scratch.dir(name), err)
		}
		env["PYNOX_OUTPUTS"] = outputs // the pool's, whatever the request's env says
	}
	if pl.collect, rerr = p.collectPatterns(pl, "collect", j.Collect); rerr != nil {
		return nil, rerr
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
	if err := checkName(name); err != nil {
		return nil, err
	}
	cpu := cpuBackstop(time.Duration(timeout))
	pl.job = worker.Job{
		Code:    code,
		Name:    name,
		Script:  isScript,
		Argv:    nonNilStrings(j.Args),
		Env:     env,
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
		Inputs:    inputs,
	}
	if len(j.Tools) > 0 {
		pl.sigs = sigs
		pl.job.Tools = workerTools(j.Tools, sigs)
		pl.job.Functions = slices.Clone(j.Functions)
		for _, t := range j.Tools {
			pl.job.Functions = append(pl.job.Functions, t.Name)
		}
	}
	for i, fd := range pl.fds {
		pl.job.Grants = append(pl.job.Grants, worker.Grant{Fd: fd, Access: pl.accessOf[i]})
	}
	return pl, nil
}

// writeGrant opens and checks one write grant (an allow_write path or a
// read-write mount) and returns the path it really names.
func (p *Pool) writeGrant(pl *plan, field, path string, protected []string) (string, *Error) {
	real, _, err := pl.grant(field, p.cfg.Dir, path, p.cfg.Limits.AllowWrite, sandbox.WriteAccess(p.info.Landlock.ABI))
	if err != nil {
		return "", err
	}
	if err := coversOwn(field, real, pl.fds[len(pl.fds)-1], p.own); err != nil {
		return "", err
	}
	if err := coversSystem(field, real, p.system); err != nil {
		return "", err
	}
	for _, r := range protected {
		if beneath(r, real) || beneath(real, r) {
			return "", requestErrorf("%s: %s would cover %s, which holds the interpreter or its packages and must stay read-only", field, real, r)
		}
	}
	if err := p.coversScratch(field, real); err != nil {
		return "", err
	}
	return real, nil
}

// coversScratch refuses a grant that covers the pool's scratch directory
// or lies beneath it: it holds every other job's scratch space.
func (p *Pool) coversScratch(field, real string) *Error {
	if p.scratch == nil {
		return nil
	}
	if beneath(p.scratch.path, real) || beneath(real, p.scratch.path) {
		return requestErrorf("%s: %s would cover the pool's scratch directory %s, which holds other jobs' scratch space; "+
			"a job's own scratch directory is its TMPDIR", field, real, p.scratch.path)
	}
	return nil
}

// scratchEnv is env with TMPDIR and HOME naming the job's scratch
// directory, unless env sets them itself.
func scratchEnv(env map[string]string, dir string) map[string]string {
	out := make(map[string]string, len(env)+2)
	out["TMPDIR"] = dir
	out["HOME"] = dir
	for k, v := range env {
		out[k] = v
	}
	return out
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
		if !filepath.IsAbs(path) {
			return "", false, requestErrorf("%s: %s: %v (a relative path resolves against the pool's working directory, %s)", field, path, err, dir)
		}
		return "", false, requestErrorf("%s: %s: %v", field, path, err)
	}
	real, err = os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil || !filepath.IsAbs(real) {
		unix.Close(fd)
		return "", false, requestErrorf("%s: %s: cannot resolve", field, path)
	}
	if !hostFile(fd, real) {
		unix.Close(fd)
		return "", false, requestErrorf("%s: %s: %s", field, path, notHostFile(real))
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

// hostFile reports whether real, the link text of the pool's descriptor
// fd in /proc/self/fd, names that same file in the pool's own file tree
// now. A path through /proc's magic links (/proc/<pid>/root/...,
// /proc/<pid>/fd/<n>) reaches files no path of the host names: another
// job's, in its mount namespace, or one it unlinked, or a detached mount's;
// their link text still reads as an absolute path ("/v", "/dir/f
// (deleted)"), which may lie beneath a ceiling by its letters alone.
// Such a file is never judged by that text: it is refused.
func hostFile(fd int, real string) bool {
	if !filepath.IsAbs(real) {
		return false
	}
	var a, b unix.Stat_t
	if unix.Fstat(fd, &a) != nil || unix.Lstat(real, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// notHostFile says why a path that hostFile refused is refused.
func notHostFile(real string) string {
	return fmt.Sprintf("resolves to %q, which is not that file on the host (a file of another mount namespace, "+
		"an unlinked file or a detached mount's); expected a path of the host's file tree", real)
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
	if !hostFile(fd, real) {
		return "", requestErrorf("script: %s: %s", path, notHostFile(real))
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
	if st.Size() > MaxScriptSize {
		return "", requestErrorf("script: %s is %d bytes; the limit is %d", real, st.Size(), MaxScriptSize)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxScriptSize+1))
	if err != nil {
		return "", requestErrorf("script: %s: %v", real, err)
	}
	if len(b) > MaxScriptSize {
		return "", requestErrorf("script: %s is larger than %d bytes", real, MaxScriptSize)
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

// ownFile is a file of the pool's own that no write grant may cover: a
// job that could replace it would have its code run, or its settings
// loaded, by the operator's next start of the pool — with the pool's
// rights, often root's, and outside any sandbox.
type ownFile struct {
	path     string // absolute, symlink-free
	what     string // for messages
	file     bool   // a file: a hard link to it is refused as well
	config   bool   // the configuration file: no read grant may cover it either
	dev, ino uint64
}

// ownFiles lists what write grants must never cover: the running
// executable, its directory (whoever may create and rename files there
// can put a new program in its place), and the configuration file
// (source, already symlink-free; empty for none). When the pool's working
// directory holds one of these, a grant of the working directory covers
// it and is refused too.
func ownFiles(source string) ([]ownFile, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("cannot find the pool's own executable, which write grants must never cover: %w", err)
	}
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	exe = filepath.Clean(exe)
	own := []ownFile{
		{path: exe, what: "the pool's own executable", file: true},
		{path: filepath.Dir(exe), what: "the directory of the pool's own executable"},
	}
	// The running program's identity, even if its name has been replaced.
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return nil, fmt.Errorf("cannot identify the pool's own executable, which write grants must never cover: %w", err)
	}
	own[0].dev, own[0].ino = st.Dev, st.Ino
	if source != "" {
		if err := unix.Stat(source, &st); err != nil {
			return nil, fmt.Errorf("config %s: %w", source, err)
		}
		own = append(own, ownFile{path: source, what: "the pool's configuration file", file: true, config: true, dev: st.Dev, ino: st.Ino})
	}
	return own, nil
}

// coversOwn returns the refusal of a write grant (real, held by fd) that
// covers one of the pool's own files, or is a hard link to one; field
// names the grant's origin.
func coversOwn(field, real string, fd int, own []ownFile) *Error {
	var st unix.Stat_t
	statOK := unix.Fstat(fd, &st) == nil
	for _, o := range own {
		switch {
		case beneath(o.path, real):
			return requestErrorf("%s: %s would cover %s, %s: a job could replace what the operator runs next, "+
				"with the pool's rights; grant a directory that does not hold it", field, real, o.path, o.what)
		case !statOK:
			return requestErrorf("%s: %s: cannot tell whether it is one of the pool's own files", field, real)
		case o.file && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Dev == o.dev && st.Ino == o.ino:
			return requestErrorf("%s: %s is a hard link to %s, %s: a job could change it", field, real, o.path, o.what)
		}
	}
	return nil
}

// readCoversConfig returns the refusal of a read grant (real, held by fd)
// that covers the pool's configuration file, or is a hard link to it:
// the file is the operator's (a profile's env may hold what only that
// profile's jobs should see), and in the natural set-up it lies in the
// working directory, the default read ceiling. field names the grant's
// origin.
func readCoversConfig(field, real string, fd int, own []ownFile) *Error {
	for _, o := range own {
		if !o.config {
			continue
		}
		if beneath(o.path, real) {
			return requestErrorf("%s: %s would cover %s, %s, which jobs may not read; grant a directory that does not hold it", field, real, o.path, o.what)
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil {
			return requestErrorf("%s: %s: cannot tell whether it is %s", field, real, o.what)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Dev == o.dev && st.Ino == o.ino {
			return requestErrorf("%s: %s is a hard link to %s, %s, which jobs may not read", field, real, o.path, o.what)
		}
	}
	return nil
}

// protectedSystemPaths returns the system paths that every template and
// job loads or trusts — worker.SystemPaths (shared libraries, time zones,
// CA certificates, /etc/hosts and the other name-service files) and
// /etc/ld.so.preload, which the dynamic loader reads for every program
// even when it does not exist yet — each by its name and, where it is a
// symbolic link, by its target too. A job that could write one could
// change what later jobs trust (certificates, name resolution) or run
// code in the next template, which maps the libraries before it confines
// itself.
func protectedSystemPaths() []string {
	var out []string
	for _, p := range append(worker.SystemPaths(), "/etc/ld.so.preload") {
		p = filepath.Clean(p)
		out = append(out, p)
		if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
			out = append(out, r)
		}
	}
	return out
}

// checkName refuses a job's or step's name that no file can have: it is
// compile()'s file name and sys.argv[0], and a NUL there made the job
// answer a ValueError as if its code had raised.
func checkName(name string) *Error {
	if strings.ContainsRune(name, 0) {
		return requestErrorf("name: %q contains a NUL byte; expected a file name for tracebacks and sys.argv[0], such as \"step.py\"", name)
	}
	return nil
}

// envRule is what an env entry, a request's or a profile's, must be
// (validEnv).
const envRule = "expected a non-empty name without \"=\" or NUL, and a value without NUL"

// validEnv reports whether name=value can be an environment variable.
func validEnv(name, value string) bool {
	return name != "" && !strings.ContainsAny(name, "=\x00") && !strings.ContainsRune(value, 0)
}

// coversSystem returns the refusal of a write grant (real) that covers one
// of the system paths, or lies beneath one; field names the grant's
// origin.
func coversSystem(field, real string, system []string) *Error {
	for _, r := range system {
		if beneath(r, real) || beneath(real, r) {
			return requestErrorf("%s: %s would cover %s, a system path every job loads (libraries, certificates, "+
				"name-service files), which must stay read-only; grant a directory of your own", field, real, r)
		}
	}
	return nil
}

// checkProfileGrants refuses, when the pool starts, a profile whose write
// grants would cover one of the pool's own files or one of the system
// paths (requests naming such a profile would be refused anyway). Paths
// that do not exist yet are judged by name.
func checkProfileGrants(c Config, own []ownFile, system []string) error {
	for _, name := range c.ProfileNames() {
		for _, w := range c.Profiles[name].AllowWrite {
			p := w
			if !filepath.IsAbs(p) {
				p = filepath.Join(c.Dir, p)
			}
			p = filepath.Clean(p)
			if r, err := filepath.EvalSymlinks(p); err == nil {
				p = r
			}
			for _, o := range own {
				if beneath(o.path, p) {
					return &ConfigError{Key: "profiles." + name + ".allow_write", Value: w,
						Problem: fmt.Sprintf("would cover %s, %s: a job could replace what the operator runs next, with the pool's rights; "+
							"expected a directory that does not hold it", o.path, o.what)}
				}
			}
			if err := coversSystem(fmt.Sprintf("profile %q: allow_write", name), p, system); err != nil {
				return errors.New(err.Message)
			}
		}
	}
	return nil
}
