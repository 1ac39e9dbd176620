package worker

// Policy returns the fixed confinement data a template is sent (the
// "policy" frame: Landlock's handled rights and runtime rules, both seccomp
// layers as compiled classic BPF in hex, the highest capability number and
// the system call numbers the runner calls through ctypes) for an
// interpreter that reported paths as the paths its runtime reads (its
// prefixes, sys.path and the files of its preloaded modules), and for
// opts.PackageDirs. It is what Start sends; pynox-bench gives it to its
// minimal fork-per-job loop, so that the loop's children are confined by
// exactly the same filter programs, rules and handled rights as a job.
func Policy(paths []string, opts Options) (map[string]any, error) {
	t := &Template{}
	return t.policy(hello{Paths: paths}, opts)
}
