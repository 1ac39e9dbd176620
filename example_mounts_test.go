package pynox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/pynox/pynox"
)

// A checkout with a read-only data directory, and the job's private
// scratch directory (its TMPDIR) to work in. Asking for the data at
// /data, or for an overlay /work, needs a mount namespace per job, which
// this version does not set up: the checkout is refused with
// SandboxSetupError, and nothing runs.
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

	_, err = pool.Checkout(ctx, pynox.Job{Mounts: []pynox.MountSpec{
		{HostPath: data, Path: "/data", Mode: pynox.ReadOnly},
		{HostPath: data, Path: "/work", Mode: pynox.Overlay},
	}})
	fmt.Println(errors.Is(err, pynox.ErrSandboxSetup))

	session, err := pool.Checkout(ctx, pynox.Job{Mounts: []pynox.MountSpec{{HostPath: data, Mode: pynox.ReadOnly}}})
	if err != nil {
		log.Fatal(err)
	}
	defer session.Finish(ctx)
	ev, err := session.Feed(ctx, pynox.Step{Code: `
import csv, os, shutil
work = os.path.join(os.environ["TMPDIR"], "in.csv")
shutil.copyfile(` + fmt.Sprintf("%q", data) + ` + "/in.csv", work)
with open(work, "a") as f:
    f.write("3\n")
print(sum(int(r["a"]) for r in csv.DictReader(open(work))))
`})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(ev.Result.Stdout, ev.Result.Stderr)
	fmt.Println(ev.Result.Policy.Mounts[0].Mode)
	// Output:
	// true
	// 6
	// ro
}
