package pynox

import (
	"cmp"
	"fmt"
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
	// Overlay lets the job write while the host directory stays
	// unchanged: its writes go to a tmpfs of the mount's WriteBytesLimit
	// (DefaultOverlayLimit when zero), in the job's own mount namespace,
	// and vanish when the job ends. It is a read grant of the host
	// directory. Where the pool cannot build mount namespaces (see
	// [Pool.Mounts]) a job asking for it is refused with
	// SandboxSetupError.
	Overlay MountMode = "overlay"
)

// MountSpec gives a job a host directory (or file), modelled on
// monty-pool's MountSpec. It is fixed when the job starts.
//
// A mount at its host path is a Landlock grant and nothing more. A mount
// at another Path, and an Overlay, take a mount namespace of the job's
// own, built by the pool's mounter before the job's process is confined
// (see the package docs, "Scratch space and mounts"): the job then sees
// only the interpreter's and the system's paths, its grants, its scratch
// directory and its mounts, read-only except its write grants, scratch
// and overlays; every mount is nosuid and a job's mounts nodev (no
// device node in the host directory opens). A session's namespace lasts
// as long as its process.
// Where the pool cannot build one, such a mount is refused with
// SandboxSetupError naming what is missing (see [Pool.Mounts]; nothing
// weaker is ever put in place silently).
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
	// WriteBytesLimit caps what the job writes through an Overlay mount,
	// in bytes (the size of the tmpfs its writes go to: past it, writes
	// fail with ENOSPC inside the job). Zero means DefaultOverlayLimit.
	// A ReadWrite mount with a limit is refused with SandboxSetupError
	// (bounding writes to a host directory takes file system project
	// quotas, which the pool does not set up).
	WriteBytesLimit Size `json:"write_bytes_limit,omitempty"`
}

// MountSupport says what kinds of [MountSpec] a pool can give its jobs,
// and where its scratch directories are. `pynox pool` reports it in its
// ready event as "mounts".
type MountSupport struct {
	// Modes lists the modes the pool enforces ("ro" and "rw", and
	// "overlay" where it builds mount namespaces).
	Modes []MountMode `json:"modes"`
	// VirtualPaths is true when a mount may appear at a path other than
	// its host path.
	VirtualPaths bool `json:"virtual_paths"`
	// WriteBytesLimit is true when an overlay mount's write_bytes_limit
	// is enforced (a read-write mount's never is).
	WriteBytesLimit bool `json:"write_bytes_limit"`
	// Scratch is the directory holding the jobs' scratch directories.
	Scratch string `json:"scratch"`
	// Missing says what the pool lacks for the rest.
	Missing string `json:"missing,omitempty"`
}

// nsNeeds names what virtual paths, overlays and byte limits need.
const nsNeeds = "a mount namespace of the job's own (built by the pool's mounter: root, user and mount namespaces, overlayfs)"

// Mounts reports what kinds of mounts the pool can give its jobs. It
// reads the machine's state (root, user namespaces, overlayfs). The
// pool's mounter starts before the pool confines itself (ConfineSelf),
// or else with the first job that needs a mount namespace, and first
// builds a probe namespace (a tmpfs, a bind and an overlay); if that
// failed, Mounts says so (and such jobs are refused with
// SandboxSetupError naming the failure). Mounts does not start the
// mounter itself.
func (p *Pool) Mounts() MountSupport {
	if p.remote != nil {
		return p.remoteInfo.mounts
	}
	s := MountSupport{Modes: []MountMode{ReadOnly, ReadWrite}}
	if why := p.nsObstacles(); len(why) > 0 {
		s.Missing = "virtual paths, overlay mounts and write_bytes_limit need " + nsNeeds + ", but " + strings.Join(why, ", and ")
	} else {
		s.Modes = append(s.Modes, Overlay)
		s.VirtualPaths, s.WriteBytesLimit = true, true
		s.Missing = "write_bytes_limit on a read-write mount (file system project quotas)"
	}
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
		virtual := ""
		if m.Path != "" {
			virtual = filepath.Clean(m.Path)
			if virtual == "/" {
				return requestErrorf("%s.path: a mount cannot replace /; expected a path such as /data", field)
			}
		}
		if mode == ReadWrite && m.WriteBytesLimit != 0 {
			return newError(KindSandboxSetup, "%s.write_bytes_limit: a read-write mount's writes go to the host directory "+
				"itself, and bounding them would take file system project quotas on the host, which the pool does not set up "+
				"(use an overlay mount, whose limit is enforced, or no limit); no code ran", field)
		}
		if mode == Overlay {
			if why := p.nsObstacles(); len(why) > 0 {
				return newError(KindSandboxSetup, "%s: an overlay mount needs %s, but %s; no code ran", field, nsNeeds, strings.Join(why, ", and "))
			}
			real, isDir, err := pl.grant(field+".host", p.cfg.Dir, m.HostPath, p.readCeiling, sandbox.ReadAccess(p.info.Landlock.ABI))
			if err == nil {
				err = p.coversScratch(field+".host", real)
			}
			if err != nil {
				return err
			}
			// The lower directory is the mounter's, not a Landlock grant:
			// the job sees it only through the overlay.
			fd := pl.fds[len(pl.fds)-1]
			pl.fds, pl.accessOf = pl.fds[:len(pl.fds)-1], pl.accessOf[:len(pl.accessOf)-1]
			limit := int64(m.WriteBytesLimit)
			if limit == 0 {
				limit = DefaultOverlayLimit
			}
			pl.nsMounts = append(pl.nsMounts, nsMount{fd: fd, path: cmp.Or(virtual, real), overlay: true, limit: limit})
			if !isDir {
				return requestErrorf("%s.host: %s is not a directory; an overlay mount takes a directory", field, real)
			}
			pl.mounts = append(pl.mounts, MountSpec{HostPath: real, Path: cmp.Or(virtual, real), Mode: mode, WriteBytesLimit: Size(limit)})
			continue
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
		if virtual != "" {
			abs := m.HostPath
			if !filepath.IsAbs(abs) {
				abs = filepath.Join(p.cfg.Dir, abs)
			}
			if virtual == real || virtual == filepath.Clean(abs) {
				virtual = ""
			}
		}
		if virtual != "" {
			if why := p.nsObstacles(); len(why) > 0 {
				return newError(KindSandboxSetup, "%s.path: showing %s at %s needs %s, but %s; no code ran (leave path empty to see it at its host path)",
					field, real, m.Path, nsNeeds, strings.Join(why, ", and "))
			}
			pl.nsMounts = append(pl.nsMounts, nsMount{fd: pl.fds[len(pl.fds)-1], path: virtual, ro: mode == ReadOnly})
			pl.mounts = append(pl.mounts, MountSpec{HostPath: real, Path: virtual, Mode: mode})
			continue
		}
		pl.mounts = append(pl.mounts, MountSpec{HostPath: real, Path: real, Mode: mode})
	}
	return nil
}
