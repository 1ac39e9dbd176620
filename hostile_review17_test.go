package pynox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHostileReview17CancelDuringHostCall: jobs blocked in a host call
// whose caller cancels at varied times each end in a context error (never
// a result carrying the cancellation as a HostError), while jobs on the
// same pool whose host answers normally always get their answer, and the
// pool keeps serving afterwards.
func TestHostileReview17CancelDuringHostCall(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	block := func(ctx context.Context, c *Call) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	echo := func(ctx context.Context, c *Call) (any, error) { return 42, nil }
	code := "from pynox_host import f, HostError\ntry:\n    print('got', f())\nexcept HostError as e:\n    print('HostError:', e)\n    raise SystemExit(1)\n"
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if i%2 == 0 {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(time.Duration(20+i*15)*time.Millisecond, cancel)
				res, err := p.Run(ctx, Job{Code: code, Functions: []string{"f"}, Host: block})
				if err == nil {
					errs <- fmt.Errorf("canceled job %d returned a result: %+v", i, res)
				} else if !errors.Is(err, context.Canceled) {
					errs <- fmt.Errorf("canceled job %d: %v", i, err)
				}
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			res, err := p.Run(ctx, Job{Code: code, Functions: []string{"f"}, Host: echo})
			if err != nil || res.Stdout != "got 42\n" {
				errs <- fmt.Errorf("answered job %d: err=%v res=%+v", i, err, res)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	res := run(t, p, Job{Code: code, Functions: []string{"f"}, Host: echo})
	require.Equal(t, "got 42\n", res.Stdout)
}
