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

// Before its rehearsals the template gives the functions of a plain job's
// path (runner.py: _SPARE_PATH) new function and code objects with new
// copies of their constants, made one after another (runner.py:
// _relayout), so that a spare writes (their reference counts) to a few
// pages rather than to pages scattered over the template's heap. This
// checks that every name on the path names a function of the runner
// (a renamed one would silently drop out), that each is a new object with
// the same code, name and constants, and that the new function objects
// lie on fewer pages than the old ones.
func TestTemplateRelaysSparePath(t *testing.T) {
	out := runRunnerFuncs(t, `
import json
def look(qual):
    owner, _, name = qual.rpartition(".")
    return globals()[owner].__dict__[name] if owner else globals()[name]
old = {q: look(q) for q in _SPARE_PATH}
_fill_pools()
_relayout(_SPARE_PATH)
new = {q: look(q) for q in _SPARE_PATH}
same = [q for q in _SPARE_PATH if new[q] is old[q]]
differ = [q for q in _SPARE_PATH if (new[q].__code__.co_code, new[q].__code__.co_consts, new[q].__qualname__,
          new[q].__defaults__, new[q].__closure__) != (old[q].__code__.co_code, old[q].__code__.co_consts,
          old[q].__qualname__, old[q].__defaults__, old[q].__closure__)]
pages = lambda fs: len({id(f) >> 12 for f in fs})
print(json.dumps({"n": len(_SPARE_PATH), "same": same, "differ": differ,
                  "old_pages": pages(old.values()), "new_pages": pages(new.values()),
                  "runs": Spare.run is new["Spare.run"]}))
`)
	var r struct {
		N            int
		Same, Differ []string
		Old          int `json:"old_pages"`
		New          int `json:"new_pages"`
		Runs         bool
	}
	require.NoError(t, json.Unmarshal(out, &r), "%s", out)
	require.Greater(t, r.N, 10)
	require.Empty(t, r.Same, "functions left where they were")
	require.Empty(t, r.Differ, "functions whose code, name, defaults or constants changed")
	require.True(t, r.Runs, "Spare.run is not the new function")
	t.Logf("%d functions: on %d pages before, %d after", r.N, r.Old, r.New)
	require.Less(t, r.New, r.Old, "the new function objects are no closer together")
}
