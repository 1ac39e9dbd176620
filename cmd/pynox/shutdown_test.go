package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// startedJob is a job line that creates mark once it runs, then runs body.
func startedJob(t *testing.T, id, mark, body string) string {
	q, _ := json.Marshal(mark)
	b, err := json.Marshal(map[string]any{"id": id, "code": "open(" + string(q) + ", 'w').close()\n" + body,
		"allow_write": []string{filepath.Dir(mark)}})
	require.NoError(t, err)
	return string(b)
}

func awaitMarkFile(t *testing.T, path string) {
	t.Helper()
	require.Eventually(t, func() bool { _, err := os.Stat(path); return err == nil }, time.Minute, 10*time.Millisecond)
}

// TestPoolSIGTERMShutsDownGracefully: SIGTERM lets a running job and a
// running session step finish, refuses the step queued behind it, and
// the pool exits 0.
func TestPoolSIGTERMShutsDownGracefully(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	dir := t.TempDir()
	p := startPoolIn(t, dir, "--workers=1", "--allow-write="+dir)
	mark := filepath.Join(dir, "job")
	p.send(t, startedJob(t, "job", mark, "import time; time.sleep(0.5); print('job done')"))
	smark := mustJSON(t, filepath.Join(dir, "step"))
	p.send(t, string(mustJSON(t, map[string]any{"id": "s1", "session": "s", "allow_write": []string{dir},
		"code": "open(" + string(smark) + ", 'w').close()\nimport time; time.sleep(0.5); print('step done')"})))
	p.send(t, `{"id": "s2", "session": "s", "code": "print('queued step ran')"}`)
	awaitMarkFile(t, mark)
	awaitMarkFile(t, filepath.Join(dir, "step"))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	got := map[string]map[string]any{}
	for range 3 {
		r := p.next(t)
		got[r["id"].(string)] = r
	}
	require.Equal(t, "job done\n", got["job"]["stdout"])
	require.Equal(t, "step done\n", got["s1"]["stdout"])
	require.Equal(t, "RequestError", got["s2"]["error"].(map[string]any)["type"])
	require.Contains(t, got["s2"]["error"].(map[string]any)["message"], "shutting down")
	require.False(t, p.out.Scan())
	require.NoError(t, p.cmd.Wait(), "stderr: %s", p.stderr.String())
}

// TestPoolSecondSIGTERMKills: a second SIGTERM ends the drain: the job
// still running is killed and answered, and the pool exits 0.
func TestPoolSecondSIGTERMKills(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := startPoolIn(t, dir, "--workers=1", "--allow-write="+dir)
	mark := filepath.Join(dir, "job")
	p.send(t, startedJob(t, "long", mark, "import time; time.sleep(25); print('finished')"))
	awaitMarkFile(t, mark)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	time.Sleep(100 * time.Millisecond) // two signals, not one (either way the job is killed)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	r := p.next(t)
	require.Equal(t, "long", r["id"])
	require.NotNil(t, r["error"], "killed, not finished: %v", r)
	require.Empty(t, r["stdout"])
	require.False(t, p.out.Scan())
	require.NoError(t, p.cmd.Wait(), "stderr: %s", p.stderr.String())
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}
