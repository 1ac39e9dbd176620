package worker

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// runRunnerFuncs runs script in a python3 process that has defined every
// function and constant of runner.py (its source without the final call
// of main), and returns what the script printed.
func runRunnerFuncs(t *testing.T, script string) []byte {
	t.Helper()
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	src := strings.TrimRight(runnerSource, "\n")
	require.True(t, strings.HasSuffix(src, "\nmain()"), "runner.py no longer ends with its call of main")
	file := filepath.Join(t.TempDir(), "runner_funcs.py")
	require.NoError(t, os.WriteFile(file, []byte(strings.TrimSuffix(src, "main()")), 0o644))
	boot := "import sys; g = {'__name__': 'runner_funcs'}; exec(compile(open(sys.argv[1]).read(), sys.argv[1], 'exec'), g); exec(sys.argv[2], g)"
	out, err := exec.Command(py, "-I", "-B", "-c", boot, file, script).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return out
}

// The template fills the free blocks of its partly used obmalloc pools
// before its first fork (runner.py: _fill_pools), so that a spare's new
// objects come from fresh pools, a few pages per block size, rather than
// from free blocks scattered over the template's pages (each one a page
// the spare copies). This checks that the runner reads the pools' free
// blocks on this interpreter (all 32 block sizes of CPython's small
// object allocator) and that the fill leaves few of them.
func TestTemplateFillsPoolsBeforeFork(t *testing.T) {
	out := runRunnerFuncs(t, `
import json
before = _pool_vacancies()
_fill_pools()
after = _pool_vacancies()
print(json.dumps({"sizes": [s for s, _ in before], "before": sum(f for _, f in before),
                  "after": sum(f for _, f in after), "held": sum(len(x) for x in _POOL_FILL)}))
`)
	var r struct {
		Sizes               []int
		Before, After, Held int
	}
	require.NoError(t, json.Unmarshal(out, &r), "%s", out)
	require.Len(t, r.Sizes, 32, "block sizes read: %v", r.Sizes)
	for i, s := range r.Sizes {
		require.Equal(t, 16*(i+1), s, "block sizes read: %v", r.Sizes)
	}
	t.Logf("free blocks in the pools in use: %d before the fill, %d after; %d objects hold them", r.Before, r.After, r.Held)
	require.Greater(t, r.Held, r.Before/2, "the fill holds too few objects")
	require.Less(t, r.After*4, r.Before, "the fill left too many free blocks")
}
