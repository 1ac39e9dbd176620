package pynox

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStatsErrorsBounded: a job names its own exception classes, so a
// hostile stream of jobs each raising a new class must not grow the
// pool's Stats.Errors (and the protocol's stats event) without bound.
// The session's steps are real jobs under the real sandbox.
func TestStatsErrorsBounded(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	co, err := p.Checkout(t.Context(), Job{})
	require.NoError(t, err)
	defer co.Finish(t.Context())
	const n = maxStatsErrorTypes + 40
	for i := 0; i < n; i++ {
		r, err := co.Feed(t.Context(), Step{Code: fmt.Sprintf("raise type('E%d', (Exception,), {})()", i)})
		require.NoError(t, err)
		require.NotNil(t, r.Result, "step %d", i)
		require.NotNil(t, r.Result.Error, "step %d", i)
	}
	s := p.Stats()
	require.LessOrEqual(t, len(s.Errors), maxStatsErrorTypes+1, "Stats.Errors grew with the jobs' own class names")
	require.EqualValues(t, 1, s.Errors["E0"], "the first types keep their own key")
	var sum int64
	for _, v := range s.Errors {
		sum += v
	}
	require.EqualValues(t, n, sum, "every failure is still counted")
	require.Positive(t, s.Errors[statsOtherErrors])
}
