package jsonl

import (
	"os"
	"testing"

	"github.com/pynox/pynox/internal/testenv"
)

// TestMain runs the package's parallel tests at least
// testenv.MinParallel at a time: they mostly wait on pools. The remote
// tests' build of pynox starts at once, in the background, while the
// tests before them run.
func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	testenv.PrebuildPynox()
	code := m.Run()
	testenv.WaitPynox()
	os.Exit(code)
}
