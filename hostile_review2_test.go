package pynox

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A job's exception whose class or attributes run code when the runner
// reports it (a metaclass's __name__ property, a SystemExit whose code is
// a property or an int subclass with its own __and__, an exception whose
// __notes__ raises while the spare prints it, a __class__ property) is
// still reported as the job's own error: the runner neither dies with
// exit 70 and no error, nor returns from the forked spare into the
// template's loop (seen as "in loop" in the job's stderr and a SIGINT
// verdict). A str subclass name that hashes unlike "TimeoutError" is
// still qualified.
func TestHostileReview2EvilExceptions(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	for _, tc := range []struct {
		code     string
		exit     int
		typ      string // "" for no error
		exitOnly bool
	}{
		{"class M(type):\n    @property\n    def __name__(cls):\n        raise KeyboardInterrupt\nclass E(Exception, metaclass=M): pass\nraise E('x')", 1, "E", false},
		{"class M(type):\n    @property\n    def __name__(cls):\n        return 'TimeoutError'\nclass E(Exception, metaclass=M): pass\nraise E('x')", 1, "E", false},
		{"class S(str):\n    def __hash__(self): return 1\n    def __eq__(self, o): return False\nclass E(Exception): pass\nE.__name__ = S('TimeoutError')\nraise E('x')", 1, "__main__.E", false},
		{"class S(str):\n    def __add__(self, o): return 'TimeoutError'\nclass TimeoutError(Exception): pass\nTimeoutError.__module__ = S('m')\nraise TimeoutError('x')", 1, "m.TimeoutError", false},
		{"class X(SystemExit):\n    @property\n    def code(self):\n        raise KeyboardInterrupt\nraise X()", 1, "", true},
		{"class N(Exception):\n    @property\n    def __notes__(self):\n        raise KeyboardInterrupt\nclass X(SystemExit):\n    @property\n    def code(self):\n        raise N()\nraise X()\n", 1, "", true},
		{"class I(int):\n    def __and__(self, o): raise KeyboardInterrupt\nraise SystemExit(I(3))", 3, "", true},
		{"class N(Exception):\n    @property\n    def __class__(self): raise KeyboardInterrupt\nraise N()\n", 1, "N", false},
	} {
		r := run(t, p, Job{Code: tc.code, Timeout: 10 * time.Second})
		require.Equal(t, tc.exit, r.Exit, "%s\nerror: %+v\nstderr: %s", tc.code, r.Error, r.Stderr)
		require.NotContains(t, r.Stderr, "in loop", tc.code)
		if tc.exitOnly {
			require.Nil(t, r.Error, tc.code)
			continue
		}
		require.NotNil(t, r.Error, tc.code)
		require.Equal(t, tc.typ, r.Error.Type, "%s\nstderr: %s", tc.code, r.Stderr)
		var e *Error
		require.ErrorAs(t, r.Err(), &e)
		require.Equal(t, KindRuntime, e.Kind, tc.code)
	}
	advServes(t, p)
}

// A job that leaves many directories on a tmpfs in its write grant leaves
// their inodes and dentries charged to its cgroup (kernel memory that no
// reclaim frees while they exist, and that memory.stat's shmem does not
// count). Such a group is not kept for the next job, which would start
// with that charge against its own limit: once released, no job group of
// the pool holds more than a few MiB.
func TestHostileReview2CgroupLeftoverKernelMemory(t *testing.T) {
	dir := t.TempDir()
	if fs, err := os.ReadFile("/proc/self/mounts"); err != nil || !strings.Contains(string(fs), " tmpfs ") {
		t.Skip("no tmpfs mounted")
	}
	p := newCgroupPool(t, Config{Workers: 1, Dir: dir})
	r := run(t, p, Job{Code: "import os\nfor i in range(50000):\n    os.mkdir('d%06d' % i + 'x' * 180)\nprint('ok')",
		Timeout: 25 * time.Second, AllowWrite: []string{dir}})
	requireOK(t, r)
	usage := func(d string) int64 {
		for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
			if b, err := os.ReadFile(filepath.Join(d, f)); err == nil {
				n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				require.NoError(t, err)
				return n
			}
		}
		return -1
	}
	// The job's group is released once its process is reaped; a few more
	// jobs make sure the pool went through its release.
	for i := 0; i < 3; i++ {
		advServes(t, p)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var over []string
		for _, d := range cgroupJobDirs(t, p) {
			if n := usage(d); n > 16<<20 {
				over = append(over, d+": "+strconv.FormatInt(n, 10))
			}
		}
		if len(over) == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "job groups kept with memory charged: %v", over)
		time.Sleep(100 * time.Millisecond)
	}
}
