package pynox

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkRunVirtualMount measures the trivial job given one read-only
// mount at a virtual path (/data): the pool builds a mount namespace for
// it (a round trip to its mounter) and the template forks a process for
// it alone, which enters the namespace and attaches its seccomp job layer
// before the job. Compare with BenchmarkRunTrivial (a ready spare).
//
//	go test -run XXX -bench 'RunTrivial|RunVirtualMount' -benchtime 100x .
func BenchmarkRunVirtualMount(b *testing.B) {
	dir := b.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		b.Fatal(err)
	}
	p := newTestPool(b, Config{Workers: 2, Dir: dir})
	if why := p.nsObstacles(); len(why) > 0 {
		b.Skipf("the pool cannot build mount namespaces here: %v", why)
	}
	job := Job{Code: benchTrivialCode, Mounts: []MountSpec{{HostPath: "data", Path: "/data"}}}
	benchSequential(b, p, job, benchTrivialOut)
}
