package pynox

import (
	"context"
	"encoding/json"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pynox/pynox/internal/sandbox"
	"github.com/pynox/pynox/internal/testenv"
)

// selfConfineChildEnv carries the parameters of TestSelfConfinement's
// re-executed child, which confines its whole process for good.
const selfConfineChildEnv = "PYNOX_SELFCONFINE_CHILD"

type selfConfineParams struct {
	Secret   string // a file outside the ceiling and the runtime
	ReadDir  string // the read ceiling
	ReadFile string // a file in it
	WriteDir string // the write ceiling
	PkgDir   string // the package dir holding the selfprobe preload
	Addr     string // a TCP listener in the parent
	Network  bool   // the ceiling grants the network
}

// writeSelfProbe writes testdata/selfprobe.py, filled in, into pkgDir.
func writeSelfProbe(t *testing.T, c selfConfineParams) {
	t.Helper()
	src, err := os.ReadFile("testdata/selfprobe.py")
	require.NoError(t, err)
	_, port, err := net.SplitHostPort(c.Addr)
	require.NoError(t, err)
	q := strconv.Quote
	s := strings.NewReplacer("@PORT@", port, "@SECRET@", q(c.Secret), "@READ_FILE@", q(c.ReadFile),
		"@READ_DIR@", q(c.ReadDir), "@WRITE_DIR@", q(c.WriteDir)).Replace(string(src))
	require.NoError(t, os.WriteFile(filepath.Join(c.PkgDir, "selfprobe.py"), []byte(s), 0o644))
}

// TestSelfConfinement runs a pool with Config.ConfineSelf in a re-executed
// copy of the test binary (the domain holds the whole process, for good)
// and checks there what the pool process itself and code running in its
// templates (a preload, standing in for a job that escaped into one) may
// do: the ceiling and the runtime, nothing else, no TCP unless the ceiling
// grants the network; and that the pool still does all its work (grants,
// scripts, sessions, timeouts, replacing a dead template).
func TestSelfConfinement(t *testing.T) {
	testenv.Slow(t)
	if env := os.Getenv(selfConfineChildEnv); env != "" {
		var c selfConfineParams
		require.NoError(t, json.Unmarshal([]byte(env), &c))
		selfConfinementChild(t, c)
		return
	}
	requireSandbox(t)
	for _, network := range []bool{false, true} {
		t.Run("network="+strconv.FormatBool(network), func(t *testing.T) {
			if network {
				requireLong(t, "the pool's own confinement with TCP allowed (network=false, the default, runs in the quick run)")
			}
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			require.NoError(t, err)
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
			c := selfConfineParams{ReadDir: t.TempDir(), WriteDir: t.TempDir(), PkgDir: t.TempDir(),
				Addr: ln.Addr().String(), Network: network}
			c.Secret = filepath.Join(t.TempDir(), "secret.txt")
			require.NoError(t, os.WriteFile(c.Secret, []byte("secret"), 0o644))
			c.ReadFile = filepath.Join(c.ReadDir, "data.txt")
			require.NoError(t, os.WriteFile(c.ReadFile, []byte("data"), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(c.ReadDir, "app.py"), []byte("print(open('data.txt').read())"), 0o644))
			writeSelfProbe(t, c)
			env, err := json.Marshal(c)
			require.NoError(t, err)
			cmd := exec.Command(os.Args[0], "-test.run=^TestSelfConfinement$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), selfConfineChildEnv+"="+string(env))
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "child:\n%s", out)
			require.Contains(t, string(out), "--- PASS: TestSelfConfinement/replaced_templates", "child:\n%s", out)
			// The parent itself is not confined: the domain was the child's.
			_, err = os.ReadFile(c.Secret)
			require.NoError(t, err)
		})
	}
}

func selfConfinementChild(t *testing.T, c selfConfineParams) {
	p, err := New(Config{Python: testPython(), Dir: c.ReadDir, ConfineSelf: true,
		Preload: []string{"selfprobe"}, PackageDirs: []string{c.PkgDir},
		Limits: Limits{AllowRead: []string{c.ReadDir}, AllowWrite: []string{c.WriteDir}, AllowNetwork: c.Network}})
	require.NoError(t, err)
	defer p.Close()

	abi, err := sandbox.ABI()
	require.NoError(t, err)
	tcpDenied := !c.Network && abi >= 4
	sc := p.SelfConfinement()
	require.Equal(t, min(abi, maxSelfABI), sc.Landlock)
	require.Equal(t, map[bool]string{true: "deny", false: "allow"}[tcpDenied], sc.TCP)
	require.Empty(t, sc.Reason)

	t.Run("pool process", func(t *testing.T) {
		// Every thread of the process is in the domain, including ones
		// that goroutines are locked to.
		for range 4 {
			errc := make(chan error)
			go func() {
				runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
				_, err := os.ReadFile(c.Secret)
				errc <- err
			}()
			require.ErrorIs(t, <-errc, fs.ErrPermission)
		}
		_, err := os.ReadDir(filepath.Dir(c.Secret))
		require.ErrorIs(t, err, fs.ErrPermission)
		_, err = os.ReadFile("/etc/shadow")
		require.ErrorIs(t, err, fs.ErrPermission)
		b, err := os.ReadFile(c.ReadFile)
		require.NoError(t, err)
		require.Equal(t, "data", string(b))
		require.ErrorIs(t, os.WriteFile(filepath.Join(c.ReadDir, "new.txt"), nil, 0o644), fs.ErrPermission)
		require.NoError(t, os.WriteFile(filepath.Join(c.WriteDir, "new.txt"), nil, 0o644))
		conn, err := net.DialTimeout("tcp4", c.Addr, 10*time.Second)
		if tcpDenied {
			require.ErrorIs(t, err, syscall.EACCES)
		} else {
			require.NoError(t, err)
			conn.Close()
		}
	})

	probe := func(t *testing.T) {
		t.Helper()
		res := run(t, p, Job{Code: "import json, selfprobe\nprint(json.dumps(selfprobe.results))"})
		requireOK(t, res)
		var got map[string]string
		require.NoError(t, json.Unmarshal([]byte(res.Stdout), &got), res.Stdout)
		want := map[string]string{
			"read_outside": "PermissionError", "list_outside": "PermissionError",
			"read_ceiling": "ok", "write_read_ceiling": "PermissionError", "write_write_ceiling": "ok",
			"tcp_connect": "ok",
		}
		if tcpDenied {
			want["tcp_connect"] = "PermissionError"
		}
		require.Equal(t, want, got)
	}
	t.Run("templates", probe)

	t.Run("jobs", func(t *testing.T) {
		res := run(t, p, Job{Script: "app.py", AllowRead: []string{"."}})
		requireOK(t, res)
		require.Equal(t, "data\n", res.Stdout)
		res = run(t, p, Job{Code: "open(" + strconv.Quote(filepath.Join(c.WriteDir, "out.txt")) + ", 'w').write('x')",
			AllowWrite: []string{c.WriteDir}})
		requireOK(t, res)
		// A script outside the ceiling is judged by the ceiling (through an
		// O_PATH descriptor), not merely refused by the kernel.
		res = run(t, p, Job{Script: c.Secret})
		requireErrorType(t, res, "RequestError")
		require.Contains(t, res.Error.Message, "is outside the pool's ceiling")
		res = run(t, p, Job{Code: "while True: pass", Timeout: 200 * time.Millisecond})
		requireErrorType(t, res, "TimeoutError")
	})

	t.Run("session", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		co, err := p.Checkout(ctx, Job{})
		require.NoError(t, err)
		defer co.Finish(ctx)
		ev, err := co.Feed(ctx, Step{Code: "x = 41"})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		ev, err = co.Feed(ctx, Step{Code: "print(x + 1)"})
		require.NoError(t, err)
		requireOK(t, ev.Result)
		require.Equal(t, "42\n", ev.Result.Stdout)
	})

	t.Run("replaced templates", func(t *testing.T) {
		old := p.templatePIDs()
		require.NotEmpty(t, old)
		for _, pid := range old {
			require.NoError(t, unix.Kill(pid, unix.SIGKILL))
		}
		require.Eventually(t, func() bool {
			pids := p.templatePIDs()
			for _, pid := range pids {
				for _, o := range old {
					if pid == o {
						return false
					}
				}
			}
			return len(pids) == len(old)
		}, time.Minute, 10*time.Millisecond, "no replacement templates")
		probe(t)
	})
}

// TestSelfPolicy checks the pool's domain as data: the runtime read and
// executable, the read ceiling and package dirs read-only, the write
// ceiling and the extra writable dirs writable but not executable, /proc
// read-only, the configuration file in no rule, and TCP denied exactly
// when the ceiling lacks the network.
func TestSelfPolicy(t *testing.T) {
	const abi = 7
	dir := t.TempDir()
	for _, d := range []string{"etc", "data", "work", "pkg", "cg", "rt"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o755))
	}
	src := filepath.Join(dir, "etc", "pynox.toml")
	require.NoError(t, os.WriteFile(src, nil, 0o644))
	for _, network := range []bool{false, true} {
		cfg, err := Config{Dir: dir, Source: src, PackageDirs: []string{"pkg"},
			Limits: Limits{AllowRead: []string{"data"}, AllowWrite: []string{"work"}, AllowNetwork: network}}.withDefaults()
		require.NoError(t, err)
		p := &Pool{cfg: cfg}
		pol := p.selfPolicy(abi, []string{filepath.Join(dir, "rt"), filepath.Join(dir, "missing.zip")}, []string{filepath.Join(dir, "cg")})
		require.Equal(t, !network, pol.DenyNet)
		got := map[string]uint64{}
		for _, r := range pol.Rules {
			got[r.Path] = r.Access
			const fileAccess = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE
			require.False(t, beneath(src, r.Path) && r.Access&fileAccess != 0, "rule %s opens the config file", r.Path)
		}
		require.Equal(t, sandbox.RuntimeAccess(abi), got[filepath.Join(dir, "rt")])
		require.NotContains(t, got, filepath.Join(dir, "missing.zip"))
		require.Equal(t, sandbox.ReadAccess(abi), got[filepath.Join(dir, "data")])
		require.Equal(t, sandbox.ReadAccess(abi), got[filepath.Join(dir, "pkg")])
		require.Equal(t, sandbox.ReadAccess(abi), got["/proc"])
		require.Equal(t, sandbox.WriteAccess(abi), got[filepath.Join(dir, "work")])
		require.Equal(t, sandbox.WriteAccess(abi), got[filepath.Join(dir, "cg")])
		require.Equal(t, uint64(unix.LANDLOCK_ACCESS_FS_REMOVE_DIR), got[dir], "the extra writable dirs' parent: remove_dir alone")
		require.Zero(t, got[filepath.Join(dir, "work")]&unix.LANDLOCK_ACCESS_FS_EXECUTE, "the write ceiling is not executable")
		require.Equal(t, sandbox.DeviceAccess(abi, true), got["/dev/null"])
		require.Contains(t, pol.String(), "tcp="+map[bool]string{true: "allow", false: "deny"}[network])
	}
}

const selfConfinePIDNSEnv = "PYNOX_SELFCONFINE_PIDNS_CHILD"

// TestSelfConfinementInPIDNamespace starts a pool with Config.ConfineSelf
// as PID 1 of a new PID namespace that kept its parent's /proc (as
// `unshare -p -f` without --mount-proc does). With cgo and a Landlock ABI
// before 8, go-landlock's libpsx would look for the process's threads in
// the wrong /proc entry and wait forever: the pool must start anyway and
// say why it is not confined. Without cgo (or from ABI 8) it confines
// itself as usual.
func TestSelfConfinementInPIDNamespace(t *testing.T) {
	if dir := os.Getenv(selfConfinePIDNSEnv); dir != "" {
		require.Equal(t, 1, os.Getpid(), "the child runs as PID 1 of its namespace")
		// The parent's directory: a confined child could not clean up a
		// temporary directory of its own.
		p, err := New(Config{Python: testPython(), Dir: dir, ConfineSelf: true})
		require.NoError(t, err)
		defer p.Close()
		abi, err := sandbox.ABI()
		require.NoError(t, err)
		sc := p.SelfConfinement()
		if psxFindsThreadsInProc && abi < 8 {
			require.Zero(t, sc.Landlock)
			require.Contains(t, sc.Reason, "PID namespace")
		} else {
			require.Equal(t, min(abi, maxSelfABI), sc.Landlock)
		}
		requireOK(t, run(t, p, Job{Code: "print('ok')"}))
		return
	}
	requireSandbox(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a process in a new PID namespace")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSelfConfinementInPIDNamespace$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), selfConfinePIDNSEnv+"="+t.TempDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child (killed after 2 minutes if it hung):\n%s", out)
	require.Contains(t, string(out), "--- PASS: TestSelfConfinementInPIDNamespace", "child:\n%s", out)
	t.Logf("child:\n%s", out)
}
