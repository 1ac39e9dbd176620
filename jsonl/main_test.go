package jsonl

import (
	"os"
	"testing"

	"github.com/pynox/pynox/internal/testenv"
)

// TestMain runs the package's parallel tests at least
// testenv.MinParallel at a time: they mostly wait on pools.
func TestMain(m *testing.M) {
	testenv.RaiseParallel()
	os.Exit(m.Run())
}
