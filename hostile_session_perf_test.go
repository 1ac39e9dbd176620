package pynox

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHostileSessionOutputsQuickCheck probes the empty-outputs check a
// session step makes before it scans $PYNOX_OUTPUTS (collect_fast.go):
// a file written there is attached and removed, the next step then has
// none, a dot file alone attaches nothing, and an outputs directory the
// step swapped for a symlink to a directory holding a file is not
// followed by either the check or the scan.
func TestHostileSessionOutputsQuickCheck(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	r := feed(t, co, "import os\nd = os.environ['PYNOX_OUTPUTS']\nopen(os.path.join(d, 'a.txt'), 'w').write('a')")
	requireOK(t, r)
	require.Len(t, r.Files, 1)
	r = feed(t, co, "x = 1")
	requireOK(t, r)
	require.Empty(t, r.Files)
	r = feed(t, co, "open(os.path.join(d, '.hidden'), 'w').write('h')")
	requireOK(t, r)
	require.Empty(t, r.Files)
	r = feed(t, co, `
import shutil
real = os.path.join(os.path.dirname(d), 'real')
os.mkdir(real)
open(os.path.join(real, 'b.txt'), 'w').write('b')
shutil.rmtree(d)
os.symlink(real, d)
print(sorted(os.listdir(d)))
`)
	requireOK(t, r)
	require.Equal(t, "['b.txt']\n", r.Stdout)
	require.Empty(t, r.Files, "the symlinked outputs directory was followed")
}
