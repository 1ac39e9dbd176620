package pynox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/pynox/pynox/internal/sandbox"
)

// MountMode says what a job may do with a [MountSpec]'s directory.
type MountMode string

// The modes of a mount. The empty mode is ReadOnly.
const (
	// ReadOnly lets the job read the directory (or file); a write fails
	// with PermissionError. It is a read grant, checked against the
	// ceiling's read paths like allow_read.
	ReadOnly MountMode = "ro"
	// ReadWrite lets the job read and change the directory; its changes
	// persist on the host. What a job wrote is untrusted: the host must
	// never execute or import it. It is a write grant, checked against the
	// ceiling's write paths like allow_write.
	ReadWrite MountMode = "rw"
	// Overlay would let the job write while the host directory stays
	// unchanged, its writes vanishing when the job or session ends. It
	// needs an overlay file system in a private mount namespace per job,
	// which this pool does not set up: a job asking for it is refused with
	// SandboxSetupError (see [Pool.Mounts]).
	Overlay MountMode = "overlay"
)

// MountSpec gives a job a host directory (or file), modelled on
// monty-pool's MountSpec. It is fixed when the job or session starts.
// Where a job sees the mount, and how much it may write there, take a
// mount namespace per job that this pool does not set up: Path must be
// empty or name the host path, and WriteBytesLimit must be zero, or the
// job is refused with SandboxSetupError, naming what is missing (see
// [Pool.Mounts]; nothing weaker is ever put in place silently).
type MountSpec struct {
	// HostPath is the directory or file on the host. A relative path
	// resolves against the pool's working directory (Config.Dir); the
	// path is opened once, when the request is accepted, and the job's
	// Landlock rule holds what it named then: a symlink swapped in later
	// changes nothing.
	HostPath string `json:"host"`
	// Path is where the job sees it: empty (or the host path itself)
	// means at the host path.
	Path string `json:"path,omitempty"`
	// Mode is ReadOnly (the default), ReadWrite or Overlay.
	Mode MountMode `json:"mode,omitempty"`
	// WriteBytesLimit would cap what the job adds through a writable
	// mount, in bytes. Zero means no cap beyond max_file_size per file.
	WriteBytesLimit Size `json:"write_bytes_limit,omitempty"`
}

// MountSupport says what kinds of [MountSpec] a pool can give its jobs,
// and where its scratch directories are. `pynox pool` reports it in its
// ready event as "mounts".
type MountSupport struct {
	// Modes lists the modes the pool enforces ("ro" and "rw").
	Modes []MountMode `json:"modes"`
	// VirtualPaths is true when a mount may appear at a path other than
	// its host path.
	VirtualPaths bool `json:"virtual_paths"`
	// WriteBytesLimit is true when a mount's write_bytes_limit is
	// enforced.
	WriteBytesLimit bool `json:"write_bytes_limit"`
	// Scratch is the directory holding the jobs' scratch directories.
	Scratch string `json:"scratch"`
	// Missing says what the pool lacks for the rest.
	Missing string `json:"missing,omitempty"`
}

// missingMounts names what virtual paths, overlays and byte limits need.
const missingMounts = "a private mount namespace per job (user and mount namespaces, set up before the " +
	"job's Landlock and seccomp layers), which this version of the pool does not set up"

// mountObstacles names what else, on this machine and in this pool,
// stands in the way of per-job mount namespaces, for the ready event.
func (p *Pool) mountObstacles() []string {
	var why []string
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		why = append(why, "user namespaces are disabled (user.max_user_namespaces = 0)")
	}
	if p.self.Landlock > 0 {
		why = append(why, "the pool's own Landlock domain (confine_self) denies every mount to its templates and jobs")
	}
	return why
}

// Mounts reports what kinds of mounts the pool can give its jobs.
func (p *Pool) Mounts() MountSupport {
	if p.remote != nil {
		return p.remoteInfo.mounts
	}
	missing := "virtual paths, overlay mounts and write_bytes_limit need " + missingMounts
	if why := p.mountObstacles(); len(why) > 0 {
		missing += "; besides, " + strings.Join(why, ", and ")
	}
	s := MountSupport{Modes: []MountMode{ReadOnly, ReadWrite}, Missing: missing}
	if p.scratch != nil {
		s.Scratch = p.scratch.path
	}
	return s
}

// planMounts checks a request's mounts against the ceiling and opens them
// as grants: read-only ones like allow_read, read-write ones like
// allow_write.
func (p *Pool) planMounts(pl *plan, mounts []MountSpec, protected []string) *Error {
	for i, m := range mounts {
		field := fmt.Sprintf("mounts[%d]", i)
		if m.HostPath == "" {
			return requestErrorf("%s.host: empty path; expected the host directory or file to mount", field)
		}
		mode := m.Mode
		if mode == "" {
			mode = ReadOnly
		}
		switch mode {
		case ReadOnly, ReadWrite, Overlay:
		default:
			return requestErrorf("%s.mode: unknown mode %q; expected \"ro\", \"rw\" or \"overlay\"", field, m.Mode)
		}
		if m.WriteBytesLimit < 0 {
			return requestErrorf("%s.write_bytes_limit must not be negative", field)
		}
		if m.WriteBytesLimit != 0 && mode == ReadOnly {
			return requestErrorf("%s.write_bytes_limit: a read-only mount takes no write limit", field)
		}
		if m.Path != "" && (!filepath.IsAbs(m.Path) || strings.ContainsRune(m.Path, 0)) {
			return requestErrorf("%s.path: %q is not an absolute path", field, m.Path)
		}
		if mode == Overlay {
			return newError(KindSandboxSetup, "%s: an overlay mount needs %s; no code ran", field, missingMounts)
		}
		if m.WriteBytesLimit != 0 {
			return newError(KindSandboxSetup, "%s.write_bytes_limit needs %s; no code ran", field, missingMounts)
		}
		var real string
		var err *Error
		if mode == ReadWrite {
			if len(p.cfg.Limits.AllowWrite) == 0 {
				return requestErrorf("%s: a read-write mount is a write grant; %s", field, noWrites(p.cfg.Limits))
			}
			real, err = p.writeGrant(pl, field+".host", m.HostPath, protected)
			if err == nil {
				pl.write = append(pl.write, real)
			}
		} else {
			real, _, err = pl.grant(field+".host", p.cfg.Dir, m.HostPath, p.readCeiling, sandbox.ReadAccess(p.info.Landlock.ABI))
			if err == nil {
				err = p.coversScratch(field+".host", real)
			}
			if err == nil {
				err = readCoversConfig(field+".host", real, pl.fds[len(pl.fds)-1], p.own)
			}
			if err == nil {
				pl.read = append(pl.read, real)
			}
		}
		if err != nil {
			return err
		}
		if m.Path != "" {
			abs := m.HostPath
			if !filepath.IsAbs(abs) {
				abs = filepath.Join(p.cfg.Dir, abs)
			}
			if v := filepath.Clean(m.Path); v != real && v != filepath.Clean(abs) {
				return newError(KindSandboxSetup, "%s.path: showing %s at %s needs %s; no code ran (leave path empty to see it at its host path)",
					field, real, m.Path, missingMounts)
			}
		}
		pl.mounts = append(pl.mounts, MountSpec{HostPath: real, Path: real, Mode: mode})
	}
	return nil
}
