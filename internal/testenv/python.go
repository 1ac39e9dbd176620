package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
)

// PreferPythonOnPath puts the directory of the tests' interpreter
// (Python) first on PATH when PATH would otherwise find another python3,
// so that what a test leaves to PATH (a `pynox pool` or `pynox serve`
// without --python, a Python client the test starts) runs the same
// interpreter as the tests that name it, as on CI, where Debian's is the
// only one. On a developer's machine the first python3 may be a launcher
// such as a pyenv shim, which costs a shell and the launcher's own start
// (~0.2 CPU-s and up to seconds of wall time) for every template a pool
// starts. A package's TestMain calls it before m.Run.
func PreferPythonOnPath() {
	py := Python()
	if py == "" {
		return
	}
	if found, err := exec.LookPath("python3"); err == nil {
		if a, err := filepath.EvalSymlinks(found); err == nil {
			if b, err := filepath.EvalSymlinks(py); err == nil && a == b {
				return
			}
		}
	}
	os.Setenv("PATH", filepath.Dir(py)+string(os.PathListSeparator)+os.Getenv("PATH"))
}
