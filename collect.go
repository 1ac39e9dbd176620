package pynox

// Artifacts: files a job leaves behind, attached to its result by the pool
// (Job.Collect, Step.Collect and the job's $PYNOX_OUTPUTS directory).
//
// The pool reads them as itself, so it reads as little as it can and
// trusts nothing the job could have arranged: every file is reached by
// openat2 from a directory descriptor the pool opened itself, with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS|RESOLVE_NO_XDEV
// (so no symlink is followed, at any component, and nothing outside the
// root is reached), first as O_PATH; only a regular file with a single
// link (st_nlink 1) is then reopened for reading (through its own O_PATH
// descriptor, so the inode checked is the inode read) and read at most up
// to the size fstat gave and the result's budget. A FIFO, socket or
// device is never opened for reading; a hard link is never read (it may
// name a file the job could not read itself), and only when its mode
// bits let the job read it (jobMay: the job lacks the capabilities that
// override permissions, which the pool may have). The roots are the job's
// write grants and its scratch directory, nothing else.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/rawsys"
)

// Bounds of artifacts. A request beyond the first two is refused; files
// beyond the last two are listed with Skipped set (beyond MaxFiles, not
// listed), and FilesTruncated is set — nothing is killed.
const (
	// MaxCollectPatterns is how many patterns Collect may hold.
	MaxCollectPatterns = 16
	// MaxCollectPattern is the longest pattern, in bytes.
	MaxCollectPattern = 4096
	// MaxFiles is how many files one result may carry.
	MaxFiles = 64
	// MaxFilesBytes is how many bytes of file contents one result may
	// carry in all (before base64).
	MaxFilesBytes = 16 << 20
)

// collectScan bounds the directory entries one collection looks at, so
// that a job that made a million files costs the pool a bounded effort.
const collectScan = 1 << 16

// maxCollectDepth bounds how many components beneath its root a pattern
// may have: the walk holds a descriptor per level.
const maxCollectDepth = 32

// OutputsDir is the name of the directory in a job's scratch directory
// that $PYNOX_OUTPUTS names: every regular file directly in it is
// attached to the result without being asked for.
const OutputsDir = "outputs"

// File is a file a job (or step) left, attached to its result.
type File struct {
	// Path is the file's absolute path as the job saw it.
	Path string `json:"path"`
	// Size is the file's size in bytes.
	Size int64 `json:"size"`
	// Data is the file's contents (base64 in JSON); empty when Skipped.
	Data []byte `json:"data,omitempty"`
	// Skipped says why the file's contents are not attached: it is not a
	// regular file, has other hard links, or would exceed MaxFilesBytes.
	Skipped string `json:"skipped,omitempty"`
}

// collectPattern is one pattern, split at its root.
type collectPattern struct {
	root  string   // a write grant or the scratch directory
	parts []string // the components beneath it, filepath.Match patterns
}

// collectPatterns checks a request's patterns against the plan: each is a
// filepath.Match pattern per path component, absolute, relative to the
// pool's directory (the job's working directory), or beginning with
// "$TMPDIR/" (the job's scratch directory); it must lie beneath one of the
// job's write grants or its scratch directory, with no "." or ".."
// component.
func (p *Pool) collectPatterns(pl *plan, field string, pats []string) ([]collectPattern, *Error) {
	if len(pats) > MaxCollectPatterns {
		return nil, requestErrorf("%s: %d patterns; the limit is %d", field, len(pats), MaxCollectPatterns)
	}
	roots := slices.Clone(pl.write)
	scratch := pl.scratchDir()
	if scratch != "" {
		roots = append(roots, scratch)
	}
	var out []collectPattern
	for i, pat := range pats {
		f := field + "[" + strconv.Itoa(i) + "]"
		if pat == "" || len(pat) > MaxCollectPattern || strings.ContainsRune(pat, 0) {
			return nil, requestErrorf("%s: expected a non-empty glob pattern of at most %d bytes", f, MaxCollectPattern)
		}
		if slices.ContainsFunc(strings.Split(pat, "/"), func(s string) bool { return s == "." || s == ".." }) {
			return nil, requestErrorf("%s: %q has a \".\" or \"..\" component", f, pat)
		}
		abs := pat
		switch {
		case strings.HasPrefix(pat, "$TMPDIR/"):
			if scratch == "" {
				return nil, requestErrorf("%s: the job has no scratch directory", f)
			}
			abs = scratch + pat[len("$TMPDIR"):]
		case !filepath.IsAbs(pat):
			dir := p.cfg.Dir
			if real, err := filepath.EvalSymlinks(dir); err == nil {
				dir = real // the grants are symlink-free
			}
			abs = filepath.Join(dir, pat)
		}
		abs = filepath.Clean(abs)
		if _, err := filepath.Match(abs, ""); err != nil {
			return nil, requestErrorf("%s: %q is not a valid glob pattern: %v", f, pat, err)
		}
		best := ""
		for _, r := range roots {
			if strings.HasPrefix(abs, r+"/") && len(r) > len(best) {
				best = r
			}
		}
		if best == "" {
			return nil, requestErrorf("%s: %s is not beneath the job's write grants (%s) or its scratch directory ($TMPDIR/…)",
				f, abs, strings.Join(pl.write, ", "))
		}
		parts := strings.Split(abs[len(best)+1:], "/")
		if len(parts) > maxCollectDepth {
			return nil, requestErrorf("%s: %q goes %d levels beneath %s; the limit is %d", f, pat, len(parts), best, maxCollectDepth)
		}
		out = append(out, collectPattern{root: best, parts: parts})
	}
	return out, nil
}

// collector gathers one result's files.
type collector struct {
	files     []File
	seen      map[string]bool
	bytes     int64
	scanned   int
	truncated bool
}

// resolveBeneath is how every file and directory beneath a root is
// reached: no symlink, no magic link, no mount crossing, nothing outside.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// openRoot opens a root directory (an absolute, symlink-free path) as
// O_PATH, following no symlink on the way.
func openRoot(path string) (int, error) {
	return unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
}

// openBeneath opens name in dirfd with flags, resolved beneath it.
func openBeneath(dirfd int, name string, flags uint64) (int, error) {
	return unix.Openat2(dirfd, name, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolveBeneath})
}

// collect adds the files that match pat.
func (c *collector) collect(pat collectPattern) {
	fd, err := openRoot(pat.root)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	c.walk(fd, pat.root, pat.parts)
}

// walk matches parts beneath the directory dirfd (whose path is dir).
func (c *collector) walk(dirfd int, dir string, parts []string) {
	names := []string{parts[0]}
	if strings.ContainsAny(parts[0], `*?[\`) {
		names = c.list(dirfd, parts[0])
	}
	for _, name := range names {
		path := dir + "/" + name
		if len(parts) == 1 {
			c.add(dirfd, name, path)
			continue
		}
		if c.scanned++; c.scanned > collectScan {
			c.truncated = true
			return
		}
		sub, err := openBeneath(dirfd, name, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			continue
		}
		if !jobMay(sub, 1) { // search
			unix.Close(sub)
			continue
		}
		c.walk(sub, path, parts[1:])
		unix.Close(sub)
	}
}

// list returns the names in the directory dirfd that match pattern, in
// order, within the scan budget.
func (c *collector) list(dirfd int, pattern string) []string {
	if !jobMay(dirfd, 4) { // read (list)
		return nil
	}
	fd, err := openBeneath(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	return c.names(fd, pattern)
}

// names returns the names in the directory open for reading at fd that
// match pattern, in order, within the scan budget. It lists the directory
// with plain getdents calls (an os.File would add a descriptor-flags
// call, and a Stat_t per entry is not needed).
func (c *collector) names(fd int, pattern string) []string {
	var names []string
	buf := make([]byte, 8192)
	for c.scanned < collectScan {
		n, err := unix.Getdents(fd, buf)
		if err != nil || n <= 0 {
			break
		}
		// ParseDirent leaves out "." and "..", as ReadDir does.
		var ents []string
		_, _, ents = unix.ParseDirent(buf[:n], collectScan-c.scanned, nil)
		c.scanned += len(ents)
		for _, e := range ents {
			if ok, _ := filepath.Match(pattern, e); ok && !strings.HasPrefix(e, ".") {
				names = append(names, e)
			}
		}
	}
	if c.scanned >= collectScan {
		c.truncated = true
	}
	slices.Sort(names)
	return names
}

// collectOutputs adds the files directly in the job's outputs directory
// beneath the scratch directory dir: what collect does for the pattern
// OutputsDir/* there, with the same checks (the directory reached beneath
// the root with no symlink, no magic link and no mount crossing, and
// searchable and readable by the job), but in fewer system calls, as
// every job pays for it and most leave the directory empty: the directory
// is opened once, for reading (not O_PATH, then "." again), its
// permissions come from one fstat, and it is listed with plain getdents.
func (c *collector) collectOutputs(dir string) {
	fd, err := openRoot(dir)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if c.scanned++; c.scanned > collectScan {
		c.truncated = true
		return
	}
	ofd, err := openBeneath(fd, OutputsDir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return
	}
	defer unix.Close(ofd)
	// Listed first: an empty directory (most jobs write no outputs) needs
	// no permission check, as nothing is attached from it. The names of
	// one the job may not list are dropped unused.
	names := c.names(ofd, "*")
	if len(names) == 0 {
		return
	}
	var st unix.Stat_t
	if unix.Fstat(ofd, &st) != nil || !jobMayStat(ofd, &st, 5) { // search and read (list)
		return
	}
	prefix := dir + "/" + OutputsDir + "/"
	for _, name := range names {
		c.add(ofd, name, prefix+name)
	}
}

// add attaches the file name in dirfd, if it is a regular file with a
// single link, within the bounds.
func (c *collector) add(dirfd int, name, path string) {
	if c.seen[path] {
		return
	}
	pfd, err := openBeneath(dirfd, name, unix.O_PATH)
	if err != nil {
		return // absent, or a symlink at a directory's place
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if unix.Fstat(pfd, &st) != nil {
		return
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return // a directory is no file (nothing is collected recursively)
	}
	if len(c.files) >= MaxFiles {
		c.truncated = true
		return
	}
	c.seen[path] = true
	file := File{Path: path, Size: st.Size}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		file.Size = 0
		file.Skipped = "a symbolic link, which the pool does not follow"
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		file.Size = 0
		file.Skipped = "not a regular file"
	case st.Nlink != 1:
		file.Skipped = "the file has other hard links, which may name a file the job could not read"
	case !jobMay(pfd, 4):
		file.Size = 0
		file.Skipped = "the job may not read the file (its mode, owner or ACL)"
	case c.bytes+st.Size > MaxFilesBytes:
		file.Skipped = fmt.Sprintf("over the %s of file contents a result may carry", formatSize(MaxFilesBytes))
		c.truncated = true
	default:
		data, err := readPinned(pfd, &st)
		if err != nil {
			file.Skipped = "unreadable: " + err.Error()
			break
		}
		file.Data, file.Size = data, int64(len(data))
		c.bytes += file.Size
	}
	c.files = append(c.files, file)
}

// readPinned reads the regular file that the O_PATH descriptor pfd (whose
// fstat is st) names, through a new descriptor of that same inode, at
// most st.Size bytes.
func readPinned(pfd int, st *unix.Stat_t) ([]byte, error) {
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "collect")
	defer f.Close()
	var st2 unix.Stat_t
	if err := unix.Fstat(fd, &st2); err != nil {
		return nil, err
	}
	if st2.Dev != st.Dev || st2.Ino != st.Ino || st2.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, errors.New("the file changed while it was opened")
	}
	data := make([]byte, st.Size)
	n, err := io.ReadFull(f, data)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return data[:n], nil
}

// collectFiles gathers the files of a job or step: those matching pats,
// then those directly in the job's $PYNOX_OUTPUTS. A session step's
// outputs are removed once attached (removeOutputs), so that each step
// returns what it wrote.
func (p *Pool) collectFiles(pl *plan, pats []collectPattern, removeOutputs bool) ([]File, bool) {
	c := &collector{seen: map[string]bool{}}
	for _, pat := range pats {
		c.collect(pat)
	}
	if dir := pl.scratchDir(); dir != "" {
		if c.scanned+1 < collectScan && pl.outputsEmptyWatched() {
			c.scanned++ // as collectOutputs counts the directory
		} else {
			c.collectOutputs(dir)
		}
		if removeOutputs {
			c.removeOutputs(dir)
		}
	}
	return c.files, c.truncated
}

// removeOutputs unlinks the files of the outputs directory beneath the
// scratch directory dir that were attached, following no symlink.
func (c *collector) removeOutputs(dir string) {
	if len(c.files) == 0 {
		// Nothing was attached (a session's usual step): no descriptor
		// need be opened.
		return
	}
	fd, err := openRoot(dir)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	ofd, err := openBeneath(fd, OutputsDir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return
	}
	defer unix.Close(ofd)
	prefix := dir + "/" + OutputsDir + "/"
	for _, f := range c.files {
		if name, ok := strings.CutPrefix(f.Path, prefix); ok && f.Skipped == "" {
			unix.Unlinkat(ofd, name, 0)
		}
	}
}

// makeOutputs makes the outputs directory in a job's new scratch
// directory (the O_PATH descriptor fd) and returns its path.
func makeOutputs(fd int, scratch string) (string, error) {
	err := rawsys.Mkdirat(fd, OutputsDir, 0o700)
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		if err = unix.Fstatat(fd, OutputsDir, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			err = errors.New("outputs is not a directory")
		}
	}
	if err != nil {
		return "", err
	}
	return scratch + "/" + OutputsDir, nil
}

// jobMay says whether the job could itself read (perm 4) or search (1)
// the file or directory the descriptor fd names. The job runs with the
// pool's user and groups but without the capabilities that override
// permissions, which the pool, often root, has: so the file's mode bits
// decide, as the kernel decides for a process without them. A file the
// job does not own and that has an access ACL is refused (fail closed:
// its named entries may deny what the mode bits allow).
func jobMay(fd int, perm uint32) bool {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return false
	}
	return jobMayStat(fd, &st, perm)
}

// jobMayStat is jobMay for the descriptor fd whose fstat is st. perm may
// name several permissions (5: read and search): the job must have each.
func jobMayStat(fd int, st *unix.Stat_t, perm uint32) bool {
	if st.Uid == uint32(os.Geteuid()) {
		return st.Mode&(perm<<6) == perm<<6
	}
	if n, err := unix.Getxattr("/proc/self/fd/"+strconv.Itoa(fd), "system.posix_acl_access", nil); err == nil || n > 0 ||
		(!errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.EOPNOTSUPP)) {
		return false
	}
	groups, _ := os.Getgroups()
	if st.Gid == uint32(os.Getegid()) || slices.Contains(groups, int(st.Gid)) {
		return st.Mode&(perm<<3) == perm<<3
	}
	return st.Mode&perm == perm
}
