package main

// Review 10 (namespaces), through the CLI: a pool that confines itself
// (the CLI's default), whose namespaces' roots are clones of one tmpfs.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/testenv"
)

// r10ConfinedPool starts a confined pool of two workers with a data
// directory (a file f in it), or skips.
func r10ConfinedPool(t *testing.T) *poolProc {
	t.Helper()
	requireSandboxOrSkip(t)
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock: %v", err)
	}
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "data"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "f"), []byte("hi"), 0o644))
	p := startPoolIn(t, dir, "--workers=2")
	if m, _ := p.ready["mounts"].(map[string]any); m["virtual_paths"] != true {
		t.Skipf("the pool builds no mount namespaces here: %v", p.ready["mounts"])
	}
	if sc, _ := p.ready["self_confinement"].(map[string]any); sc["landlock"] == float64(0) {
		t.Skipf("the pool did not confine itself: %v", sc)
	}
	return p
}

// r10Replies reads n replies and returns them by id.
func r10Replies(t *testing.T, p *poolProc, n int) map[float64]map[string]any {
	t.Helper()
	out := map[float64]map[string]any{}
	for range n {
		r := p.next(t)
		id, _ := r["id"].(float64)
		out[id] = r
	}
	return out
}

// A job's mount paths are bounded in a confined pool too: one of 600
// components is refused (SandboxSetupError, no code ran), one of 100 runs,
// and the pool keeps serving mount jobs.
func TestHostileReview10NSConfinedEntriesBounded(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := r10ConfinedPool(t)
	deep := strings.Repeat("/d", 600)
	p.send(t, fmt.Sprintf(`{"id": 1, "code": "print(1)", "mounts": [{"host": "data", "path": %q}]}`, deep))
	r := p.next(t)
	e, _ := r["error"].(map[string]any)
	require.Equal(t, "SandboxSetupError", e["type"], "%v", r)
	require.Contains(t, e["message"], "more than 512")
	require.Empty(t, r["stdout"])
	ok := strings.Repeat("/d", 100)
	code, err := json.Marshal("print(open(" + strconv.Quote(ok+"/f") + ").read())")
	require.NoError(t, err)
	p.send(t, fmt.Sprintf(`{"id": 2, "code": %s, "mounts": [{"host": "data", "path": %q}]}`, code, ok))
	r = p.next(t)
	require.Nil(t, r["error"], "%v", r)
	require.Equal(t, "hi\n", r["stdout"])
}

// Probe: in a confined pool the mountpoints of a live namespace were names
// in the root every namespace shares: while one job held a file mount at
// /x, another job's directory mount at /x/sub failed. Now each live
// namespace has a slot directory of its own in that root.
func TestHostileReview10NSConfinedTypeConflict(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := r10ConfinedPool(t)
	p.send(t, `{"id": 1, "code": "import time; print(open('/x').read()); time.sleep(3)", "mounts": [{"host": "data/f", "path": "/x"}]}`)
	p.send(t, `{"id": 2, "code": "import time; time.sleep(0.5); print(open('/x/sub/f').read())", "mounts": [{"host": "data", "path": "/x/sub"}]}`)
	got := r10Replies(t, p, 2)
	for id, r := range got {
		require.Nil(t, r["error"], "job %v: %v", id, r)
		require.Equal(t, "hi\n", r["stdout"], "job %v", id)
	}
}
