package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/worker"
)

// limitLoop is the minimal confined fork-per-job loop: the limit of
// pynox's design, see limit_loop.py.
//
//go:embed limit_loop.py
var limitLoop string

// limitEnv is the loop's whole environment: the one pynox gives its
// templates (pynox's baseEnv, less the OpenBLAS settings passed through
// from the caller's environment).
var limitEnv = []string{
	"PATH=/usr/local/bin:/usr/bin:/bin",
	"LANG=C.UTF-8",
	"LC_ALL=C.UTF-8",
	"HOME=/nonexistent",
	"OPENBLAS_NUM_THREADS=1",
	"OMP_NUM_THREADS=1",
	"MKL_NUM_THREADS=1",
	"NUMEXPR_NUM_THREADS=1",
	"VECLIB_MAXIMUM_THREADS=1",
	"BLIS_NUM_THREADS=1",
}

// limitBoot runs the file named by its first argument, which it takes
// off sys.argv, compiled apart so that its syntax tree is freed.
const limitBoot = "import sys; p = sys.argv.pop(1); exec(compile(open(p, 'rb').read(), p, 'exec'))"

// startLimit starts the limit loop under name, with preload imported and
// the given number of workers. The loop confines its children with what
// a pynox template is sent: the policy internal/worker builds for the
// paths the interpreter reports (asked for first, with the same preloads),
// and the limits of a job with pynox's defaults.
func startLimit(ctx context.Context, rep *Report, name string, python, preload string, workers int, tmp, work string) (*server, error) {
	// Started as pynox starts its runner (internal/worker: runnerBoot): a
	// one-line boot compiles the loop's source, so that its template holds
	// neither the syntax tree of a -c program (freed only when it returns)
	// nor the source in its argv: either would make every fork and exit of
	// the yardstick dearer than the design needs.
	src := filepath.Join(tmp, "limit_loop.py")
	if err := os.WriteFile(src, []byte(limitLoop), 0o644); err != nil {
		return nil, err
	}
	args := []string{"-I", "-B", "-c", limitBoot, src}
	if preload != "" {
		args = append(args, "--preload="+preload)
	}
	cmd := exec.CommandContext(ctx, python, append(args, "--paths")...)
	cmd.Dir, cmd.Env = work, limitEnv
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: limit_loop.py --paths: %v", name, err)
	}
	var paths []string
	if err := json.Unmarshal(out, &paths); err != nil {
		return nil, fmt.Errorf("%s: limit_loop.py --paths printed %q: %v", name, out, err)
	}
	policy, err := worker.Policy(paths, worker.Options{Python: python})
	if err != nil {
		return nil, fmt.Errorf("%s: policy: %v", name, err)
	}
	policy["job_limits"] = map[string]int64{
		"memory": pynox.DefaultMemory,
		"fsize":  pynox.DefaultMaxFileSize,
		"cpu":    int64(math.Ceil(pynox.DefaultTimeout.Seconds())) + 1, // as pynox's backstop
	}
	b, err := json.Marshal(policy)
	if err != nil {
		return nil, err
	}
	file := filepath.Join(tmp, "limit-policy-"+strconv.Itoa(len(rep.StartupMS))+".json")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		return nil, err
	}
	args = append(args, "--workers="+strconv.Itoa(workers), "--policy="+file)
	return startServer(ctx, rep, name, python, args, work, limitEnv)
}
