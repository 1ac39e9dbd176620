package pynox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/pynox/pynox"
)

// A checkout whose code sees a host directory read-only at /data and an
// overlay of it at /work: it may write /work (at most 1 MiB there), the
// host directory never changes, and the writes last for the session's
// steps and vanish with it. Both take a mount namespace of the session's
// own, which the pool builds where it runs as root with user namespaces
// and overlayfs (see [Pool.Mounts]); elsewhere the checkout is refused
// with SandboxSetupError.
func ExamplePool_Checkout_mounts() {
	cfg := exampleConfig()
	data := filepath.Join(cfg.Dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "in.csv"), []byte("a\n1\n2\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	pool, err := pynox.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()

	session, err := pool.Checkout(ctx, pynox.Job{Mounts: []pynox.MountSpec{
		{HostPath: data, Path: "/data", Mode: pynox.ReadOnly},
		{HostPath: data, Path: "/work", Mode: pynox.Overlay, WriteBytesLimit: 1 << 20},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer session.Finish(ctx)
	for _, code := range []string{`
import csv
with open("/work/in.csv", "a") as f:
    f.write("3\n")
print(sum(int(r["a"]) for r in csv.DictReader(open("/work/in.csv"))))
`, `
try:
    open("/data/in.csv", "a")
except OSError as e:
    print(type(e).__name__, e.strerror)
print(open("/work/in.csv").read().split())
`} {
		ev, err := session.Feed(ctx, pynox.Step{Code: code})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Print(ev.Result.Stdout, ev.Result.Stderr)
	}
	host, _ := os.ReadFile(filepath.Join(data, "in.csv"))
	fmt.Printf("host: %q\n", host)
	// Output:
	// 6
	// OSError Read-only file system
	// ['a', '1', '2', '3']
	// host: "a\n1\n2\n"
}
