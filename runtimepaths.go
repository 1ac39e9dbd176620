package pynox

// RuntimePaths returns the paths every job may read and execute because
// its interpreter needs them: the interpreter's prefixes, its sys.path and
// the preloaded modules' directories, resolved (with Debian's python3 the
// prefix is /usr, so all of /usr). A file beneath one of them, or beneath
// the system paths, the ceilings or the package dirs, is readable by any
// job. It is nil for a remote pool.
func (p *Pool) RuntimePaths() []string {
	return append([]string(nil), p.info.RuntimePaths...)
}
