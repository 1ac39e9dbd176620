package pynox

// Adversarial suite (helpers in hostile_test.go): signals to the template,
// the pool and other jobs.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

func TestHostileSignals(t *testing.T) {
	testenv.Slow(t)
	p := newTestPool(t, Config{Workers: 2})
	dir := p.cfg.Dir
	shared := filepath.Join(dir, "shared")
	require.NoError(t, os.Mkdir(shared, 0o755))
	templates := p.templatePIDs()
	require.Len(t, templates, 2)
	// A process unrelated to the pool, as a witness for the broadcast kills.
	sentinel := exec.Command("sleep", "300")
	require.NoError(t, sentinel.Start())
	t.Cleanup(func() { _ = sentinel.Process.Kill(); _ = sentinel.Wait() })

	// A victim job runs concurrently on the other worker until the host
	// tells it to stop; it publishes its pid for the attackers.
	victimDone := make(chan *Result, 1)
	go func() {
		victimDone <- run(t, p, Job{ID: "victim", Code: `import os, time
open('shared/victim.pid', 'w').write(os.readlink('/proc/self'))
deadline = time.time() + 60
while not os.path.exists('shared/stop') and time.time() < deadline:
    time.sleep(0.02)
print('victim survived')
`, AllowWrite: []string{"shared"}})
	}()
	var victim int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(shared, "victim.pid"))
		if err != nil {
			return false
		}
		victim, err = strconv.Atoi(string(b))
		return err == nil && victim > 0
	}, 30*time.Second, 10*time.Millisecond)
	require.True(t, processAlive(victim))

	env := map[string]string{
		"POOL_PID":   strconv.Itoa(os.Getpid()),
		"VICTIM_PID": strconv.Itoa(victim),
	}
	attack := func(t *testing.T, body string) *Result {
		t.Helper()
		return run(t, p, Job{Code: advCode("import signal, time\npool = int(os.environ['POOL_PID'])\nvictim = int(os.environ['VICTIM_PID'])\ntpl = os.getppid()\n" + body),
			Env: env, AllowRead: []string{"shared"}})
	}
	survivors := func(t *testing.T) {
		t.Helper()
		time.Sleep(50 * time.Millisecond) // let a signal that was sent land
		require.True(t, processAlive(victim), "the concurrent job was killed")
		require.True(t, processAlive(sentinel.Process.Pid), "an unrelated process was killed")
		require.Equal(t, templates, p.templatePIDs(), "a template died")
		for _, pid := range templates {
			require.True(t, processAlive(pid), "template %d died", pid)
		}
	}

	// Harmless probes first: if signal scoping failed here, the lethal
	// probes below would kill the test run, so they are skipped.
	scoped := t.Run("existence probes", func(t *testing.T) {
		r := attack(t, `attempt("kill pool 0", lambda: os.kill(pool, 0))
attempt("kill template 0", lambda: os.kill(tpl, 0))
attempt("kill victim 0", lambda: os.kill(victim, 0))
attempt("kill pool SIGCONT", lambda: os.kill(pool, signal.SIGCONT))
attempt("control kill self 0", lambda: os.kill(os.getpid(), 0))
`)
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			// ESRCH: with templates in PID namespaces of their own, the
			// pool and the other template's job are not even visible.
			"kill pool 0":         {"EPERM", "ESRCH"},
			"kill template 0":     {"EPERM"},
			"kill victim 0":       {"EPERM", "ESRCH"},
			"kill pool SIGCONT":   {"EPERM", "ESRCH"},
			"control kill self 0": {"ok"},
		})
		survivors(t)
	})
	lethal := func(name, body string, check func(t *testing.T, r *Result)) {
		t.Run(name, func(t *testing.T) {
			if !scoped {
				t.Skip("signal scoping failed the harmless probes; a lethal probe would kill the test run")
			}
			check(t, attack(t, body))
			survivors(t)
		})
	}
	lethal("kill pool, template and victim", `attempt("kill pool SIGKILL", lambda: os.kill(pool, signal.SIGKILL))
attempt("kill template SIGKILL", lambda: os.kill(tpl, signal.SIGKILL))
attempt("kill victim SIGKILL", lambda: os.kill(victim, signal.SIGKILL))
attempt("killpg template group", lambda: os.killpg(tpl, signal.SIGKILL))
attempt("killpg pool group", lambda: os.killpg(os.getpgid(pool), signal.SIGKILL))
attempt("killpg victim group", lambda: os.killpg(victim, signal.SIGKILL))
sc("tgkill template", 234, tpl, tpl, 9)
sc("tkill victim", 200, victim, 9)
info = ctypes.create_string_buffer(128)
sc("rt_sigqueueinfo template", 129, tpl, 9, info)
sc("rt_tgsigqueueinfo pool", 297, pool, pool, 9, info)
`, func(t *testing.T, r *Result) {
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			// ESRCH: in a PID namespace of its own the job cannot see
			// the pool nor the other job, and killpg(1) is kill(-1).
			"kill pool SIGKILL":        {"EPERM", "ESRCH"},
			"kill template SIGKILL":    {"EPERM"},
			"kill victim SIGKILL":      {"EPERM", "ESRCH"},
			"killpg template group":    {"EPERM", "ESRCH"},
			"killpg pool group":        {"EPERM", "ESRCH"},
			"killpg victim group":      {"EPERM", "ESRCH"},
			"tgkill template":          {"EPERM"},
			"tkill victim":             {"EPERM", "ESRCH"},
			"rt_sigqueueinfo template": {"EPERM"},
			"rt_tgsigqueueinfo pool":   {"EPERM"},
		})
	})
	lethal("kill every pid", `me = os.getpid()
hit = []
for pid in range(2, 1 << 15):
    if pid == me:
        continue
    try:
        os.kill(pid, signal.SIGKILL)
        hit.append(pid)
    except OSError:
        pass
R["pids killed"] = str(hit)
`, func(t *testing.T, r *Result) {
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{"pids killed": {"[]"}})
	})
	lethal("kill(-1, SIGKILL)", `attempt("kill -1", lambda: os.kill(-1, signal.SIGKILL))
`, func(t *testing.T, r *Result) {
		requireOK(t, r)
		// Linux's kill(-1) returns 0 even when every target refused the
		// signal with EPERM (kernel/signal.c, kill_something_info), so
		// success says nothing: survivors is the check.
		advExpect(t, advProbes(t, r), map[string][]string{"kill -1": {"ok", "EPERM", "ESRCH"}})
	})
	lethal("kill(0, SIGKILL) kills only the job", `os.kill(0, signal.SIGKILL)
time.sleep(5)
R["survived its own group kill"] = "yes"
`, func(t *testing.T, r *Result) {
		requireErrorType(t, r, "SignalError")
		require.Contains(t, r.Error.Message, "SIGKILL")
		require.NotContains(t, r.Stdout, "survived")
	})
	// SIGIO/SIGURG delivery chosen by F_SETOWN is a signal too; Landlock
	// scopes it by the domain of the process that set the owner.
	lethal("F_SETOWN signal delivery", `import fcntl
F_SETSIG = 10
def owner(target, sig):
    r, w = os.pipe()
    fcntl.fcntl(r, fcntl.F_SETOWN, target)
    if sig:
        fcntl.fcntl(r, F_SETSIG, sig)
    fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)
    os.write(w, b"x")
    time.sleep(0.05)
for name, target, sig in (("template SIGIO", tpl, 0), ("template group SIGIO", -tpl, 0),
                          ("template SIGKILL", tpl, signal.SIGKILL), ("victim SIGKILL", victim, signal.SIGKILL),
                          ("pool SIGKILL", pool, signal.SIGKILL)):
    attempt("F_SETOWN " + name, lambda: owner(target, sig))
`, func(t *testing.T, r *Result) {
		requireOK(t, r)
		// Setting the owner succeeds; what matters is that no signal was
		// delivered, which survivors checks (and this test still running).
		advExpect(t, advProbes(t, r), map[string][]string{
			"F_SETOWN template SIGIO":       {"ok", "EPERM"},
			"F_SETOWN template group SIGIO": {"ok", "EPERM"},
			"F_SETOWN template SIGKILL":     {"ok", "EPERM"},
			"F_SETOWN victim SIGKILL":       {"ok", "EPERM", "ESRCH"},
			"F_SETOWN pool SIGKILL":         {"ok", "EPERM", "ESRCH"},
		})
	})

	require.NoError(t, os.WriteFile(filepath.Join(shared, "stop"), nil, 0o644))
	vr := <-victimDone
	requireOK(t, vr)
	require.Equal(t, "victim survived\n", vr.Stdout)
	require.Equal(t, templates, p.templatePIDs())
	advServes(t, p)
}
