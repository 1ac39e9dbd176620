package pynox

// Adversarial suite (helpers in hostile_test.go, helpers_test.go): what a
// job finds of its spare's preparation, whose descriptor plan, Landlock
// argument blocks and warm-up the template prepares ahead of time.

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// spareFDsCode prints every descriptor the job holds, found with fstat
// (the job may not list /proc/self/fd).
const spareFDsCode = `import os
held = []
for fd in range(4096):
    try:
        os.fstat(fd)
    except OSError:
        continue
    held.append(fd)
print(held)
`

// TestHostileSpareHoldsOnlyItsOwnDescriptors: a job holds descriptors 0-4
// and nothing else — none of the template's O_PATH runtime descriptors,
// pidfds or other spares' channels, nor its grants' descriptors — whether
// it has the network or not, has grants or not, and after its template has
// forked many spares (whose pidfds the template holds while they live).
func TestHostileSpareHoldsOnlyItsOwnDescriptors(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1, Limits: Limits{AllowNetwork: true}})
	dir := p.Config().Dir
	require.NoError(t, os.WriteFile(filepath.Join(dir, "in.txt"), []byte("x"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "out"), 0o755))
	jobs := map[string]Job{
		"plain":   {Code: spareFDsCode},
		"network": {Code: spareFDsCode, AllowNetwork: true},
		"grants":  {Code: spareFDsCode, AllowRead: []string{"in.txt"}, AllowWrite: []string{"out"}},
	}
	for i := 0; i < 3; i++ {
		for name, job := range jobs {
			r := run(t, p, job)
			requireOK(t, r)
			require.Equal(t, "[0, 1, 2, 3, 4]\n", r.Stdout, "%s job, round %d", name, i)
		}
	}
}
