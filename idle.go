package pynox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/pynox/pynox/internal/worker"
	"golang.org/x/sys/unix"
)

// checkIdleDumpDir resolves Config.SessionIdleDump and refuses a directory
// that a job may be granted: one beneath a ceiling or a package dir, or
// beneath the system paths every job may read.
func checkIdleDumpDir(c *Config) error {
	const key = "pool.session_idle_dump"
	dir, err := realPath(c.Dir, c.SessionIdleDump)
	if err != nil {
		return &ConfigError{Key: key, Value: c.SessionIdleDump, Problem: pathProblem(err, "an existing directory")}
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return &ConfigError{Key: key, Value: c.SessionIdleDump, Problem: "expected an existing directory"}
	}
	for _, g := range []struct {
		what  string
		paths []string
	}{
		{"the read ceiling ([pool.limits] allow_read)", c.Limits.AllowRead},
		{"the write ceiling ([pool.limits] allow_write)", c.Limits.AllowWrite},
		{"a package dir ([pool] package_dirs)", c.PackageDirs},
		{"the system paths every job may read", worker.SystemPaths()},
	} {
		for _, p := range g.paths {
			if beneath(dir, filepath.Clean(p)) {
				return &ConfigError{Key: key, Value: c.SessionIdleDump,
					Problem: fmt.Sprintf("%s lies beneath %s, so a job could read or change the sessions' dumps; expected a directory outside every path a job may be granted", p, g.what)}
			}
		}
	}
	c.SessionIdleDump = dir
	return nil
}

// checkIdleDumpRuntime refuses a Config.SessionIdleDump beneath the
// interpreter's paths, which every job may read (known once a template
// has started).
func checkIdleDumpRuntime(c Config, runtime []string) error {
	if c.SessionIdleDump == "" {
		return nil
	}
	for _, p := range runtime {
		if beneath(c.SessionIdleDump, p) {
			return &ConfigError{Key: "pool.session_idle_dump", Value: c.SessionIdleDump,
				Problem: fmt.Sprintf("it lies beneath %s, which every job may read (the interpreter's paths); expected a directory outside every path a job may be granted", p)}
		}
	}
	return nil
}

// hibernate keeps an idle session's state instead of closing it, when
// Config.SessionIdleDump is set: it dumps the session to a file, ends its
// process, and leaves the checkout open, so that the
// next Feed restores it. It reports false when the session must be closed
// as without it (no directory, a host call waiting, a failed dump).
func (c *Checkout) hibernate() bool {
	dir := c.pool.cfg.SessionIdleDump
	if dir == "" {
		return false
	}
	if err := c.acquire(c.life); err != nil {
		return true // it has ended meanwhile
	}
	defer c.release()
	c.mu.Lock()
	used := c.lastUse
	c.mu.Unlock()
	if time.Since(used) < c.pool.cfg.SessionIdle {
		return true // a turn began and ended meanwhile; it rearmed the timer
	}
	if c.turn != nil {
		return false // a host call waits for Resume: closed, as without a dump
	}
	if c.child != nil {
		d, err := c.dump(c.life, c.child)
		if err != nil {
			c.pool.log.Warn("an idle session could not be dumped; it is closed", "session", c.name, "err", err)
			return false
		}
		path, err := writeIdleDump(dir, d.Data)
		if err != nil {
			c.pool.log.Error("an idle session's dump could not be written; it is closed", "session", c.name, "err", err)
			return false
		}
		c.endProcess()
		c.idleFile = path
	}
	// Nothing runs for it until its next Feed, which forks a process from
	// one of the pool's templates and restores the dump there.
	c.mu.Lock()
	c.tpl = nil
	c.mu.Unlock()
	return true
}

// writeIdleDump writes data to a new file of its own in dir.
func writeIdleDump(dir string, data []byte) (string, error) {
	var b [16]byte
	rand.Read(b[:])
	path := filepath.Join(dir, "pynox-session-"+hex.EncodeToString(b[:])+".dump")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return "", err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return "", err
	}
	return path, nil
}

// loadIdleDump reads back, and removes, the file an idle session was
// kept in, making it the dump the next process restores; the caller holds
// the turn. A file that cannot be read leaves the session empty, and the
// next result still says Restored is false.
func (c *Checkout) loadIdleDump() {
	path := c.idleFile
	if path == "" {
		return
	}
	c.idleFile = ""
	defer os.Remove(path)
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		c.pool.log.Error("an idle session's dump could not be read; it starts empty", "session", c.name, "err", err)
		return
	}
	defer f.Close()
	err = checkIdleDumpFile(f)
	var data []byte
	if err == nil {
		data, err = io.ReadAll(io.LimitReader(f, MaxDumpSize+1))
	}
	var steps int
	var pickle []byte
	if err == nil {
		var rerr *Error
		if steps, pickle, rerr = decodeDump(data); rerr != nil {
			err = rerr
		}
	}
	if err != nil {
		c.pool.log.Error("an idle session's dump could not be read; it starts empty", "session", c.name, "err", err)
		return
	}
	c.restore, c.restoreSteps, c.restoredIdle = pickle, steps, true
}

// checkIdleDumpFile refuses an idle session's file that is no longer the
// one writeIdleDump made: not a regular file of the pool's own user with
// one link and no access for others. A user who may write in the
// directory (a shared or world-writable one) could otherwise replace it
// with a dump of their own, whose code the session would run.
func checkIdleDumpFile(f *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Nlink != 1 || st.Mode&0o077 != 0 {
		return fmt.Errorf("%s is not the file the pool wrote (owner %d, mode %o, %d links): it is not loaded", f.Name(), st.Uid, st.Mode, st.Nlink)
	}
	return nil
}

// dropIdleDump removes the file of a kept session that ends without
// being restored; the caller holds the turn.
func (c *Checkout) dropIdleDump() {
	if c.idleFile != "" {
		os.Remove(c.idleFile)
		c.idleFile = ""
	}
}

// evictIdle makes room for one more session when Config.MaxSessions are
// open, by finishing the least recently used one that is idle: no turn in
// progress and no host call waiting for Resume. It waits (as long as ctx
// allows) for the evicted session's processes to be gone, so that its
// slot is free. With no idle session it does nothing, and the new
// session is refused as without eviction.
func (p *Pool) evictIdle(ctx context.Context) {
	p.coMu.Lock()
	if len(p.checkouts) < p.cfg.MaxSessions {
		p.coMu.Unlock()
		return
	}
	var victim *Checkout
	var oldest time.Time
	for c := range p.checkouts {
		select {
		case c.token <- struct{}{}: // not in a turn
		default:
			continue
		}
		c.mu.Lock()
		// A zero lastUse is a session still being created.
		idle, used := c.turn == nil && c.why == nil && !c.lastUse.IsZero(), c.lastUse
		c.mu.Unlock()
		if idle && (victim == nil || used.Before(oldest)) {
			if victim != nil {
				victim.release()
			}
			victim, oldest = c, used
		} else {
			c.release()
		}
	}
	p.coMu.Unlock()
	if victim == nil {
		return
	}
	ended := victim.end(newError(KindFinished, "the session was evicted: max_sessions sessions were open and it was the least recently used idle one"))
	victim.release() // to its cleanup
	if ended {
		select {
		case <-victim.ended:
		case <-ctx.Done():
		}
	}
}
