package pynox

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// A job writing its output when its template is killed: the job dies
// with its template and its result says so (a worker error); it never
// sees its output pipes closed under it and reports that
// (BrokenPipeError), as it did once in the chaos test, when the pool
// shut the template's poller (and with it the running children's output
// pipes) before it marked those children ended.
func TestTemplateDeathWhileJobWrites(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 1})
	for i := range 12 {
		done := make(chan struct{})
		var res *Result
		var err error
		go func() {
			defer close(done)
			res, err = p.Run(context.Background(), Job{Code: "import sys\nwhile True:\n    sys.stdout.write('x' * 512 + '\\n'); sys.stdout.flush()", Timeout: 10 * time.Second})
		}()
		time.Sleep(time.Duration(60+i*7) * time.Millisecond)
		for _, pid := range p.templatePIDs() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		<-done
		if err != nil {
			continue // the template was gone before the job started: refused, no result
		}
		if res.Error != nil {
			require.NotEqual(t, "BrokenPipeError", res.Error.Type, "round %d: %+v", i, res.Error)
		}
	}
}
