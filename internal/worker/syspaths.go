package worker

import "slices"

// SystemPaths returns the system paths every job may read and execute
// besides the interpreter's own (shared libraries, time zones,
// certificates, name-service files). The pool's own Landlock domain
// includes them, since templates and jobs inherit it.
func SystemPaths() []string { return slices.Clone(systemPaths) }
