package pynox

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/worker"
)

func (p *Pool) runtime() Runtime {
	return Runtime{Name: "pynox", Python: p.info.Python, Mode: "pool", PreloadedModules: nonNilStrings(p.info.Preloaded)}
}

func (p *Pool) policy(pl *plan) *Policy {
	if pl == nil {
		return nil // no plan was made: nothing was enforced
	}
	network := "deny"
	if pl.network {
		network = "allow"
	}
	return &Policy{
		AllowRead:    nonNilStrings(pl.read),
		AllowWrite:   nonNilStrings(pl.write),
		Network:      network,
		Subprocesses: "deny",
		TimeoutMS:    pl.job.Timeout.Milliseconds(),
		MemoryBytes:  pl.job.Limits.Memory,
		Backend:      "landlock+seccomp",
		Cgroups:      p.cg.Backend(),
		Mounts:       pl.mounts,
		Scratch:      pl.scratchDir(),
	}
}

// refuse answers a request that runs nothing, counting and logging it.
func (p *Pool) refuse(j *Job, e *Error) *Result {
	res := p.refused(j, e)
	p.finish(j, res)
	return res
}

// refused is the result of a request the pool would not run.
func (p *Pool) refused(j *Job, e *Error) *Result {
	k := KindRequest
	if e.Kind == KindSandboxSetup {
		k = e.Kind // a confinement the pool cannot give (see MountSpec)
	}
	return &Result{
		ID:      j.ID,
		Exit:    -1,
		Error:   &ErrorInfo{Type: k.String(), Message: e.Message},
		Runtime: p.runtime(),
		kind:    k,
	}
}

// failed is the result of a job the pool could not run or finish.
func (p *Pool) failed(j *Job, pl *plan, k Kind, msg string, accepted time.Time) *Result {
	return &Result{
		ID:      j.ID,
		Exit:    -1,
		Error:   &ErrorInfo{Type: k.String(), Message: msg},
		QueueUS: time.Since(accepted).Microseconds(),
		Runtime: p.runtime(),
		Policy:  p.policy(pl),
		kind:    k,
	}
}

// result turns a child's outcome into the job's result.
func (p *Pool) result(j *Job, pl *plan, out *worker.Outcome, accepted time.Time) *Result {
	d := out.End.Sub(out.Start)
	r := &Result{
		ID:              j.ID,
		Exit:            -1,
		Stdout:          string(out.Stdout),
		Stderr:          string(out.Stderr),
		StdoutTruncated: out.StdoutTrunc,
		StderrTruncated: out.StderrTrunc,
		DurationMS:      d.Round(time.Millisecond).Milliseconds(),
		DurationUS:      d.Microseconds(),
		QueueUS:         out.Start.Sub(accepted).Microseconds(),
		Runtime:         p.runtime(),
		Policy:          p.policy(pl),
		Calls:           out.Calls,
		Usage:           usageOf(out),
		kind:            KindRuntime,
	}
	r.setOutputs(out)
	fail := func(k Kind, msg string) {
		r.kind = k
		r.Error = &ErrorInfo{Type: k.String(), Message: msg}
	}
	switch {
	case out.TimedOut:
		fail(KindTimeout, fmt.Sprintf("the job exceeded its timeout of %s and was killed", pl.job.Timeout))
	case out.CPUExceeded:
		fail(KindTimeout, fmt.Sprintf("the step used more than %d s of CPU time (its timeout of %s and 2 s more, on all its threads together) and was killed",
			cpuBackstop(pl.job.Timeout)+1, pl.job.Timeout))
	case out.InterruptKilled:
		fail(KindRuntime, fmt.Sprintf("the step was interrupted and had not ended %s later, so its process was killed", worker.InterruptGrace))
		r.Error.Type = "KeyboardInterrupt"
	case out.SetupError != "":
		fail(KindSandboxSetup, "confinement could not be applied, so no code ran: "+out.SetupError)
	case out.Violation != "":
		fail(KindCrashed, "the job broke its control protocol and was killed: "+out.Violation)
	case out.Done:
		r.Exit = out.Exit
		r.setValue(out)
		if out.Error != nil {
			r.Error = &ErrorInfo{
				Type:    jobErrorType(out.Error.Type),
				Message: out.Error.Message,
				File:    out.Error.File,
				Line:    out.Error.Line,
			}
			r.Error.Hint = p.hint(pl, out.Error)
		}
	case out.Status == nil:
		fail(KindCrashed, "the job's process vanished and its status is unknown")
	case out.Status.TemplateDied:
		fail(KindCrashed, "the template serving the job died; it is being replaced")
	case out.OOMKilled:
		// The kernel killed it at its cgroup's memory limit: a memory
		// error, not a mysterious signal.
		fail(KindRuntime, fmt.Sprintf("the job used more memory than its limit of %s (its allowance plus %s for its copies of the template's memory and the kernel's), so the kernel killed it",
			formatSize(out.MemoryLimit), formatSize(out.MemoryLimit-pl.job.Limits.Memory)))
		r.Error.Type = "MemoryError"
		r.Error.Hint = p.hint(pl, &worker.ErrorInfo{Type: "MemoryError"})
	case !out.Started:
		fail(KindCrashed, fmt.Sprintf("the job's process died before running any code (%s)", describeStatus(out.Status)))
	case out.Status.Signal != 0:
		sig := syscall.Signal(out.Status.Signal)
		fail(KindSignal, fmt.Sprintf("the job was killed by signal %s (%d, %s)", unix.SignalName(sig), out.Status.Signal, sig))
		if sig == syscall.SIGKILL {
			r.Error.Hint = fmt.Sprintf("SIGKILL usually means the kernel ran out of memory; the job's memory limit was %s", formatSize(pl.job.Limits.Memory))
		}
	default:
		// The process exited without reporting: os._exit(n) or a runner
		// that user code broke. Its status is the truth.
		r.Exit = out.Status.Code
	}
	return r
}

// jobErrorType returns the type of a job's own exception as results carry
// it. The runner reports a class named like one of the pool's own error
// types (RequestError, TimeoutError, SignalError, SandboxSetupError,
// PoolWorkerError) qualified by its module, "__main__.RequestError" or
// "builtins.TimeoutError", so that no job's error reads as the pool's
// verdict; a bare such name could only come from a forged report, and is
// qualified the same way.
func jobErrorType(t string) string {
	for k := KindRequest; k <= KindCrashed; k++ {
		if t == k.String() {
			return "__main__." + t
		}
	}
	return t
}

func describeStatus(st *worker.ExitStatus) string {
	if st.Signal != 0 {
		return "signal " + unix.SignalName(syscall.Signal(st.Signal))
	}
	return fmt.Sprintf("exit status %d", st.Code)
}

// hint suggests what would let a failed job succeed.
func (p *Pool) hint(pl *plan, e *worker.ErrorInfo) string {
	l := p.cfg.Limits
	errno := 0
	if e.Errno != nil {
		errno = *e.Errno
	}
	switch {
	case e.Type == "MemoryError":
		if pl.job.Limits.Memory < l.Memory {
			return fmt.Sprintf("the job's memory limit is %s; raise \"memory\" (the pool's ceiling allows up to %s)",
				formatSize(pl.job.Limits.Memory), formatSize(l.Memory))
		}
		return fmt.Sprintf("the job's memory limit is %s, which is the pool's ceiling; use less memory", formatSize(pl.job.Limits.Memory))
	case errno == int(unix.EFBIG):
		if pl.job.Limits.Fsize < l.MaxFileSize {
			return fmt.Sprintf("files are limited to %s; raise \"max_file_size\" (the pool's ceiling allows up to %s)",
				formatSize(pl.job.Limits.Fsize), formatSize(l.MaxFileSize))
		}
		return fmt.Sprintf("files are limited to %s, the pool's ceiling", formatSize(pl.job.Limits.Fsize))
	case e.Type == "PermissionError" || errno == int(unix.EACCES) || errno == int(unix.EPERM):
		if errno == int(unix.EPERM) && e.Filename != nil && *e.Filename != "" {
			// Landlock refuses with EACCES; EPERM on a path is seccomp's.
			return "the sandbox denies changing file modes, owners, extended attributes and timestamps " +
				"(chmod, chown, utime), and creating device nodes; shutil.copyfile copies a file's contents without them"
		}
		if e.Filename == nil || *e.Filename == "" {
			if pl.network {
				return "the sandbox denies creating processes, running programs and this system call"
			}
			return "the sandbox denies creating processes, running programs and opening sockets; the network needs \"allow_network\": true"
		}
		return p.pathHint(pl, *e.Filename)
	case (e.Type == "FileNotFoundError" || errno == int(unix.ENOENT)) && e.Filename != nil &&
		*e.Filename != "" && !filepath.IsAbs(*e.Filename):
		return p.relativeHint(pl, *e.Filename)
	}
	return ""
}

// relativeHint explains a relative path that was not found: the job runs
// in the pool's working directory, while the paths of a configuration file
// (its ceiling and its profiles) resolve against the file's directory, so
// a profile that grants "data" in examples/pynox.toml grants
// examples/data, which the job must name so. When a grant of the job ends
// in the path's first element, the hint names that grant's absolute path.
// Like pathHint it is built from names alone.
func (p *Pool) relativeHint(pl *plan, name string) string {
	clean := filepath.Clean(name)
	msg := fmt.Sprintf("relative paths resolve against the job's working directory, the pool's %s, so %q is %s",
		p.cfg.Dir, name, filepath.Join(p.cfg.Dir, clean))
	first, _, _ := strings.Cut(clean, string(filepath.Separator))
	if first == "." || first == ".." {
		return msg
	}
	grants := append(append([]string(nil), pl.read...), pl.write...)
	for _, g := range grants {
		if filepath.Base(g) == first && filepath.Dir(g) != p.cfg.Dir {
			return msg + fmt.Sprintf("; did you mean %q? The job is granted %s: a configuration file's paths, its profiles' included, "+
				"resolve against the file's directory, not the job's", filepath.Join(filepath.Dir(g), clean), g)
		}
	}
	if len(grants) > 0 {
		return msg + "; the job's grants are " + strings.Join(grants, ", ")
	}
	return msg
}

// pathHint names the grant that would allow access to name, or says that
// the ceiling forbids it. It is built from the names alone: the job chose
// name and controls what lies there, and the pool, which has more rights
// than the job (often root's), must neither act on it (a deep chain of
// directories ending in a symlink loop once cost the pool 40 CPU-seconds
// while it held the job's worker) nor reveal what the job cannot see
// (whether a file exists in a directory the job may not search). So the
// hint does not know whether the job read or wrote, nor whether the file
// exists, and offers both grants where both are possible.
func (p *Pool) pathHint(pl *plan, name string) string {
	path := name
	if !filepath.IsAbs(path) {
		path = filepath.Join(p.cfg.Dir, path)
	}
	path = filepath.Clean(path)
	l := p.cfg.Limits
	writable := beneathAny(path, l.AllowWrite)
	// To write, grant the directory the file is in (which covers creating
	// it), unless that lies outside the write ceiling or would cover one
	// of the pool's own files (such a grant is refused).
	writeGrant := path
	if dir := filepath.Dir(path); beneathAny(dir, l.AllowWrite) {
		writeGrant = dir
	}
	toWrite := fmt.Sprintf("to write it, add \"allow_write\": [%q]", suggest(p.cfg.Dir, writeGrant))
	for _, o := range p.own {
		if beneath(o.path, writeGrant) {
			toWrite = fmt.Sprintf("to write, use a subdirectory and grant that (a write grant of %s would cover %s, %s)", writeGrant, o.path, o.what)
			break
		}
	}
	switch {
	case beneathAny(path, pl.write):
		return fmt.Sprintf("%s lies within the job's write grants, so the sandbox allows it; "+
			"the file's own owner and mode deny it (the job has no capabilities to override them), "+
			"or a symlink there leads out of the grants", path)
	case beneathAny(path, pl.read) && writable:
		return fmt.Sprintf("the job may read %s but not write it: %s (if reading failed, the file's own owner and mode deny it)", path, toWrite)
	case beneathAny(path, pl.read):
		return fmt.Sprintf("the job may only read %s; %s", path, noWrites(l))
	case writable:
		return fmt.Sprintf("%s is not granted to the job: add \"allow_read\": [%q] to read it; %s", path, suggest(p.cfg.Dir, path), toWrite)
	case beneathAny(path, p.readCeiling):
		return fmt.Sprintf("%s is not granted to the job: add \"allow_read\": [%q] to read it; %s",
			path, suggest(p.cfg.Dir, path), noWrites(l))
	}
	return fmt.Sprintf("%s is outside the pool's ceiling (%s), so no request can read or write it", path, ceilingList(p.readCeiling))
}

// noWrites says why no request can write a path outside the write
// ceiling.
func noWrites(l Limits) string {
	if len(l.AllowWrite) == 0 {
		return "the pool grants no writes at all (its operator sets a write ceiling with [pool.limits] allow_write, or pynox pool --allow-write)"
	}
	return fmt.Sprintf("it is outside the pool's write ceiling (%s), so no request can write it", ceilingList(l.AllowWrite))
}

// suggest writes path relative to the pool's directory when it lies there.
func suggest(dir, path string) string {
	if rel, err := filepath.Rel(dir, path); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return path
}
