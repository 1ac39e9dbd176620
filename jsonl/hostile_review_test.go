package jsonl

// The outside review's finding that needs the JSON Lines stream; the rest
// of the corpus, and its index, is the root package's
// hostile_review_test.go.

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Finding 5. A job's own exception is reported under its class name,
// and the pool's own failure kinds are names a job can take: a job that
// raises (or, with a forged report, claims) a class named RequestError,
// SandboxSetupError, PoolWorkerError or SignalError produces a result
// that a client of `pynox pool` cannot tell from the pool's verdict.
// Result.Err of a result read off the stream says ErrRequest, and the
// Python client raises pynox.RequestError for it — "your request was
// refused, nothing ran" — though the job's code ran; a monitor counting
// SandboxSetupError is told the sandbox is broken. Fix: never let a
// job-reported type equal one of the pool's kinds (qualify it, e.g.
// "__main__.RequestError", or mark the error's source in the result).
func TestHostileReviewSpoofedErrorKind(t *testing.T) {
	p := newTestPool(t, pynox.Config{Workers: 1})
	var in strings.Builder
	for _, name := range []string{"RequestError", "SandboxSetupError", "PoolWorkerError", "SignalError"} {
		line, err := json.Marshal(map[string]string{"id": name,
			"code": "class " + name + "(Exception): pass\nraise " + name + "('the pool refused this request; nothing ran')"})
		require.NoError(t, err)
		in.Write(append(line, '\n'))
	}
	for _, line := range serveLines(t, p, in.String())[1:] {
		b, err := json.Marshal(line)
		require.NoError(t, err)
		var r pynox.Result
		require.NoError(t, json.Unmarshal(b, &r))
		require.NotNil(t, r.Error, "%s", b)
		var e *pynox.Error
		require.ErrorAs(t, r.Err(), &e)
		assert.Equal(t, pynox.KindRuntime, e.Kind, "a job's own %v reads as the pool's kind %v", line["id"], e.Kind)
		assert.NotEqual(t, line["id"], r.Error.Type, "the job's exception class took the name of a pool verdict")
	}
}
