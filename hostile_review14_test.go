package pynox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// Review 14: probes of performance round 2's changes. The template
// rewrites one byte of each read-only private mapping of its runtime
// (through /proc/self/mem, or through an mprotect it undoes) so that forks
// copy their page-table entries; a spare receives its job frame into a
// buffer the template allocated; job cgroups hold their control files open
// and are reused; children's bells are read through one epoll instance per
// template; host-call arguments are decoded for repeated keys only when
// they hold two keys or more.

// r14Mapping is one line of /proc/<pid>/maps.
type r14Mapping struct {
	lo, hi uint64
	perms  string
	offset int64
	path   string
}

func r14ReadMaps(t *testing.T, pid int) []r14Mapping {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	require.NoError(t, err)
	var out []r14Mapping
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			// An exiting process (the last job's, say) shows no
			// mappings: nothing to check.
			continue
		}
		lohi := strings.SplitN(f[0], "-", 2)
		lo, _ := strconv.ParseUint(lohi[0], 16, 64)
		hi, _ := strconv.ParseUint(lohi[1], 16, 64)
		off, _ := strconv.ParseInt(f[2], 16, 64)
		m := r14Mapping{lo: lo, hi: hi, perms: f[1], offset: off}
		if len(f) > 5 {
			m.path = f[5]
		}
		out = append(out, m)
	}
	return out
}

// r14Family returns the template's pid and its children's (its spare, a
// session's process).
func r14Family(t *testing.T, p *Pool) []int {
	t.Helper()
	pids := p.templatePIDs()
	require.Len(t, pids, 1)
	fam := []int{pids[0]}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pids[0], pids[0]))
	require.NoError(t, err)
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		require.NoError(t, err)
		fam = append(fam, pid)
	}
	return fam
}

// r14Holds reports whether the process pid's readable memory holds
// needle (read as root through /proc/<pid>/mem).
func r14Holds(t *testing.T, pid int, needle []byte) bool {
	t.Helper()
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return false // gone
	}
	defer mem.Close()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if f[1][0] != 'r' || (len(f) > 5 && strings.HasPrefix(f[5], "[v")) {
			continue
		}
		lohi := strings.SplitN(f[0], "-", 2)
		lo, _ := strconv.ParseUint(lohi[0], 16, 64)
		hi, _ := strconv.ParseUint(lohi[1], 16, 64)
		buf := make([]byte, hi-lo)
		n, _ := mem.ReadAt(buf, int64(lo))
		if bytes.Contains(buf[:n], needle) {
			return true
		}
	}
	return false
}

// TestHostileReview14NoWritableCodeMapping checks what the template's
// byte rewrite leaves behind: in the template and its children (a spare,
// a session's process), no mapping is writable and executable at once;
// and every first byte the template rewrote still equals the file's (the
// rewrite stores the byte back onto itself).
func TestHostileReview14NoWritableCodeMapping(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
	co := checkout(t, p, Job{})
	requireOK(t, feed(t, co, "x = 1"))
	fam := r14Family(t, p)
	require.GreaterOrEqual(t, len(fam), 2, "the template has no child")
	for _, pid := range fam {
		for _, m := range r14ReadMaps(t, pid) {
			require.False(t, strings.Contains(m.perms, "w") && strings.Contains(m.perms, "x"),
				"process %d (template %d) has a writable and executable mapping: %+v", pid, fam[0], m)
		}
	}
	tpl := fam[0]
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", tpl))
	require.NoError(t, err)
	defer mem.Close()
	checked := 0
	for _, m := range r14ReadMaps(t, tpl) {
		if !strings.HasPrefix(m.path, "/") || (m.perms != "r-xp" && (m.perms != "r--p" || m.offset != 0)) {
			continue
		}
		// A read-only private file mapping that the loader did not
		// relocate (code, or the file's head; a RELRO region holds
		// relocated pointers): its first bytes are the file's.
		want := make([]byte, 64)
		f, err := os.Open(m.path)
		if err != nil {
			continue
		}
		n, _ := f.ReadAt(want, m.offset)
		f.Close()
		if n == 0 {
			continue
		}
		got := make([]byte, n)
		_, err = mem.ReadAt(got, int64(m.lo))
		require.NoError(t, err, "reading the template's %+v", m)
		require.Equal(t, want[:n], got, "the template's copy of %s at %#x differs from the file", m.path, m.lo)
		checked++
	}
	t.Logf("%d read-only file mappings of the template checked", checked)
	require.Greater(t, checked, 3, "no read-only file mapping of the template was checked")
}

// r14Patch is Python that overwrites the four bytes at ADDR (the ELF
// header of the interpreter's executable: a page the template rewrote,
// held as an anonymous page every fork shares) through /proc/self/mem and
// by making the page writable, and prints what each way did.
const r14Patch = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
lo = ADDR
print("BEFORE", ctypes.string_at(lo, 4))
try:
    fd = os.open("/proc/self/mem", os.O_RDWR)
    os.pwrite(fd, b"PWND", lo)
    print("PROCMEM ok")
except OSError as e:
    print("PROCMEM", e.errno)
if libc.mprotect(lo, 4096, 3) == 0:
    ctypes.memmove(lo, b"PWND", 4)
    libc.mprotect(lo, 4096, 1)
    print("MPROTECT ok")
else:
    print("MPROTECT", ctypes.get_errno())
print("AFTER", ctypes.string_at(lo, 4))
`

// TestHostileReview14CodePatchStaysInJob patches a page of the
// interpreter that the template rewrote: a job, and a session, may change
// their own copy of it, and no other job, nor the template, sees the
// change.
func TestHostileReview14CodePatchStaysInJob(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	requireOK(t, run(t, p, Job{Code: "print(1)"}))
	pids := p.templatePIDs()
	require.Len(t, pids, 1)
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pids[0]))
	require.NoError(t, err)
	var a uint64
	for _, m := range r14ReadMaps(t, pids[0]) {
		if m.path == exe && m.offset == 0 && m.perms == "r--p" {
			a = m.lo
			break
		}
	}
	require.NotZero(t, a, "no read-only mapping of %s at offset 0 in the template", exe)
	patch := strings.Replace(r14Patch, "ADDR", strconv.FormatUint(a, 10), 1)

	r := run(t, p, Job{Code: patch})
	requireOK(t, r)
	t.Logf("patching job: %s", r.Stdout)
	require.Contains(t, r.Stdout, "BEFORE b'\\x7fELF'")
	patched := strings.Contains(r.Stdout, "AFTER b'PWND'")

	check := fmt.Sprintf("import ctypes\nprint('SEEN', ctypes.string_at(%d, 4))\n", a)
	// Another job forked from the same template sees the file's bytes.
	r = run(t, p, Job{Code: check})
	requireOK(t, r)
	require.Equal(t, "SEEN b'\\x7fELF'\n", r.Stdout, "a job saw an earlier job's patch (patched: %v)", patched)

	// A session patches its copy and keeps it across steps; a job run
	// while it lives does not see it.
	co := checkout(t, p, Job{})
	sr := feed(t, co, patch)
	requireOK(t, sr)
	sr = feed(t, co, check)
	requireOK(t, sr)
	if patched {
		require.Equal(t, "SEEN b'PWND'\n", sr.Stdout, "the session lost its own patch")
	}
	r = run(t, p, Job{Code: check})
	requireOK(t, r)
	require.Equal(t, "SEEN b'\\x7fELF'\n", r.Stdout, "a job saw a live session's patch")

	// The template's own copy is untouched.
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pids[0]))
	require.NoError(t, err)
	head := make([]byte, 4)
	_, err = mem.ReadAt(head, int64(a))
	mem.Close()
	require.NoError(t, err)
	require.Equal(t, []byte("\x7fELF"), head, "the template's copy was patched")
}

func r14Secret(t *testing.T) string {
	b := make([]byte, 16)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return "R14MARK-" + hex.EncodeToString(b)
}

// TestHostileReview14NoFrameOfEarlierJob runs jobs and session steps
// whose frames (code and environment) carry a secret, in sizes below, at
// and above the 64 KiB receive buffer, then reads the whole memory of the
// template and of its children (the next spare, a live session's
// process): the buffer a spare receives into is the template's, so a job's
// frame must be in its own process only, never in the template nor in a
// copy another job is forked with.
func TestHostileReview14NoFrameOfEarlierJob(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	for _, pad := range []int{0, 60 << 10, 200 << 10} {
		secret := r14Secret(t)
		env := r14Secret(t)
		code := fmt.Sprintf("s = '%s'\n# %s\nprint(len(s))\n", secret, strings.Repeat("y", pad))
		r := run(t, p, Job{Code: code, Env: map[string]string{"R14": env}})
		requireOK(t, r)
		requireOK(t, run(t, p, Job{Code: "print(2)"}))
		for _, pid := range r14Family(t, p) {
			require.False(t, r14Holds(t, pid, []byte(secret)), "pad %d: process %d holds an earlier job's code", pad, pid)
			require.False(t, r14Holds(t, pid, []byte(env)), "pad %d: process %d holds an earlier job's environment", pad, pid)
		}

		// A live session holds its step's secret; no other process does.
		co := checkout(t, p, Job{})
		requireOK(t, feed(t, co, code))
		sr := feed(t, co, "1")
		requireOK(t, sr)
		requireOK(t, run(t, p, Job{Code: "print(3)"}))
		holders := 0
		for _, pid := range r14Family(t, p) {
			if r14Holds(t, pid, []byte(secret)) {
				holders++
			}
		}
		// The session's own process holds it (which shows the search
		// finds what is there); no other does.
		require.Equal(t, 1, holders, "pad %d: processes holding a live session's step", pad)
		co.Finish(context.Background())
	}
}

// TestHostileReview14FrameSizes sends job and step frames whose length
// falls on every side of the 64 KiB receive buffer (and multi-byte
// characters across its end): each job runs exactly its own code, and a
// short step after a long one is not read with the long one's leftovers.
func TestHostileReview14FrameSizes(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	// The frame's fields other than the code take a few hundred bytes.
	var sizes []int
	for k := (64 << 10) - 900; k <= (64<<10)+100; k += 53 {
		sizes = append(sizes, k)
	}
	sizes = append(sizes, 1<<20)
	for _, k := range sizes {
		for _, ch := range []string{"a", "é", "🐍"} {
			n := k / len(ch)
			code := "s = '" + strings.Repeat(ch, n) + "'\nprint(len(s), len(s.encode()))\n"
			r := run(t, p, Job{Code: code})
			requireOK(t, r)
			require.Equal(t, fmt.Sprintf("%d %d\n", n, n*len(ch)), r.Stdout, "code of %d bytes of %q", k, ch)
		}
	}

	co := checkout(t, p, Job{})
	long := "s = '" + strings.Repeat("z", 100<<10) + "'\n"
	for i := 0; i < 3; i++ {
		requireOK(t, feed(t, co, long))
		r := feed(t, co, "print(len(s))")
		requireOK(t, r)
		require.Equal(t, "102400\n", r.Stdout)
		r = feed(t, co, "t = '"+strings.Repeat("q", 60<<10)+"'\nprint(len(t))")
		requireOK(t, r)
		require.Equal(t, "61440\n", r.Stdout)
		r = feed(t, co, "1+1")
		requireOK(t, r)
	}
}

// r14ReadReply is Python that reads the host's answer to a forged call
// (a frame on descriptor 3) and prints it.
const r14ReadReply = `
import struct
def _exact(n):
    b = b""
    while len(b) < n:
        c = os.read(3, n - len(b))
        if not c:
            break
        b += c
    return b
(n,) = struct.unpack("<I", _exact(4))
print("REPLY", _exact(n).decode())
`

// TestHostileReview14CallKeys forges host calls whose arguments hold one
// key per object at many depths (which skip the repeated-key decoding) and
// calls that repeat a key somewhere: the first reach the host as sent,
// the others never do.
func TestHostileReview14CallKeys(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	cases := []struct {
		name, args, kwargs string
		reach              bool
	}{
		{"one key nested", `[{"k":{"k":{"k":1}}}]`, `{}`, true},
		{"one key in kwargs, colon in a string", `[]`, `{"a":"x:y:z"}`, true},
		{"same key in sibling objects", `[{"a":1},{"a":2}]`, `{}`, true},
		{"escaped quote key once", `[]`, `{"a\"":1}`, true},
		{"repeat at top", `[]`, `{"a":1,"a":2}`, false},
		{"repeat deep in args", `[[[{"x":{"k":1,"k":2}}]]]`, `{}`, false},
		{"repeat by escape", `[]`, `{"path":1,"p\u0061th":2}`, false},
		{"repeat with escaped quotes", `[]`, `{"a\"":1,"a\"":2}`, false},
		{"repeat with colons in strings", `[{"a:":"b:","a:":"c"}]`, `{}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var seen []string
			host := func(ctx context.Context, c *Call) (any, error) {
				mu.Lock()
				seen = append(seen, string(c.Args)+" "+string(c.Kwargs))
				mu.Unlock()
				return "ok", nil
			}
			frame := fmt.Sprintf(`{"t":"call","step":1,"function":"f","args":%s,"kwargs":%s}`, tc.args, tc.kwargs)
			r := run(t, p, Job{Functions: []string{"f"}, Host: host, Timeout: 10 * time.Second,
				Code: forgeSend + fmt.Sprintf("send(%q)\n", frame) + r14ReadReply})
			mu.Lock()
			defer mu.Unlock()
			t.Logf("%+v; the host saw %q", r.Error, seen)
			if tc.reach {
				require.Len(t, seen, 1, "an honest call did not reach the host")
				var a, wa, k, wk any
				args, kwargs, _ := strings.Cut(seen[0], " ")
				require.NoError(t, json.Unmarshal([]byte(args), &a))
				require.NoError(t, json.Unmarshal([]byte(tc.args), &wa))
				require.NoError(t, json.Unmarshal([]byte(kwargs), &k))
				require.NoError(t, json.Unmarshal([]byte(tc.kwargs), &wk))
				require.Equal(t, wa, a)
				require.Equal(t, wk, k)
				require.Contains(t, r.Stdout, `REPLY`, "the job had no answer")
				require.NotContains(t, r.Stdout, "cannot be passed on")
			} else {
				require.Empty(t, seen, "a call whose arguments repeat a key reached the host")
				require.Contains(t, r.Stdout, "repeats the key", "the job was not told why")
			}
		})
	}
}

// TestHostileReview14BellAbuse closes, dups and floods the bell in several
// jobs at once on the templates' shared epoll instance: each abusive job
// ends (within its timeout), and honest jobs run beside them unharmed.
func TestHostileReview14BellAbuse(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	abusers := map[string]string{
		"close then work": "import os\nos.close(4)\nprint(sum(range(10)))\n",
		"dup, close, flood the dup": "import os, time\nfd = os.dup(4)\nos.close(4)\nend = time.monotonic() + 3\n" +
			"while time.monotonic() < end:\n    os.write(fd, b'!' * 4096)\nprint('flooded')\n",
		"dup2 onto 9 then flood": "import os, time\nos.dup2(4, 9)\nend = time.monotonic() + 3\n" +
			"while time.monotonic() < end:\n    os.write(9, b'!')\nprint('flooded')\n",
		"threads flood": "import os, threading, time\ndef f():\n    end = time.monotonic() + 3\n    while time.monotonic() < end:\n        os.write(4, b'!' * 512)\n" +
			"ts = [threading.Thread(target=f) for _ in range(4)]\nfor x in ts: x.start()\nfor x in ts: x.join()\nprint('flooded')\n",
		"flood and exit": "import os\nfor i in range(10000):\n    os.write(4, b'!')\nos._exit(0)\n",
	}
	var wg sync.WaitGroup
	for round := 0; round < 2; round++ {
		for name, code := range abusers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				start := time.Now()
				res, err := p.Run(ctx, Job{Code: code, Timeout: 10 * time.Second})
				if err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
				t.Logf("%s: %v after %v; stdout %q", name, res.Error, time.Since(start).Round(time.Millisecond), res.Stdout)
				if name == "close then work" {
					// Without a bell the turn still ends: the end of the
					// control channel is read at the process's exit.
					if res.Error != nil || res.Stdout != "45\n" {
						t.Errorf("%s: %+v %q", name, res.Error, res.Stdout)
					}
					return
				}
				if res.Error == nil || res.Error.Type != "PoolWorkerError" || !strings.Contains(res.Error.Message, "rang its bell") {
					t.Errorf("%s: not ended as a protocol break: %+v", name, res.Error)
				}
				if strings.Contains(res.Stdout, "flooded") {
					t.Errorf("%s: the flood ran to its end: %+v", name, res.Error)
				}
			}()
		}
	}
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := run(t, p, Job{Code: "print(6 * 7)", Timeout: 30 * time.Second})
			requireOK(t, r)
			require.Equal(t, "42\n", r.Stdout)
		}()
	}
	wg.Wait()
	advServes(t, p)
}

// TestHostileReview14LimitsPerJob runs jobs with different limits one
// after another on one template, whose spares now take the template's
// values from a plan built before the first fork: each job has its own
// address-space, file-size and CPU limits, not the plan's nor an earlier
// job's.
func TestHostileReview14LimitsPerJob(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	code := "import resource\nprint(*[resource.getrlimit(r)[1] for r in (resource.RLIMIT_AS, resource.RLIMIT_FSIZE, resource.RLIMIT_CPU)])"
	lim := func(j Job) []int64 {
		j.Code = code
		r := run(t, p, j)
		requireOK(t, r)
		var v [3]int64
		_, err := fmt.Sscan(r.Stdout, &v[0], &v[1], &v[2])
		require.NoError(t, err, r.Stdout)
		return v[:]
	}
	small := Job{Memory: 64 << 20, MaxFileSize: 1 << 20, Timeout: 3 * time.Second}
	big := Job{Memory: 512 << 20, MaxFileSize: 8 << 20, Timeout: 30 * time.Second}
	a := lim(small)
	b := lim(big)
	c := lim(small)
	t.Logf("small %v, big %v, small again %v", a, b, c)
	require.Equal(t, a, c, "the same limits gave different rlimits after a larger job")
	require.Equal(t, int64(1<<20), a[1])
	require.Equal(t, int64(8<<20), b[1])
	require.Less(t, a[0], b[0])
	require.Less(t, a[0], int64(128<<20), "a 64 MiB job's address space")
	require.Less(t, a[2], b[2])
}

// TestHostileReview14ManyGrants sends a job frame that carries the most
// descriptors a job may have (MaxGrants paths, half read, half write,
// beside its scratch directory) together with code larger than the 64 KiB
// receive buffer, to a job and to a session: every grant arrives, in its
// place, and the frame's tail is read after the descriptors.
func TestHostileReview14ManyGrants(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	p := newTestPool(t, Config{Workers: 1, Limits: Limits{AllowRead: []string{base}, AllowWrite: []string{base}}})
	var read, write []string
	for i := 0; i < MaxGrants; i++ {
		d := fmt.Sprintf("%s/g%02d", base, i)
		require.NoError(t, os.Mkdir(d, 0o755))
		require.NoError(t, os.WriteFile(d+"/f", []byte(strconv.Itoa(i)), 0o644))
		if i%2 == 0 {
			read = append(read, d)
		} else {
			write = append(write, d)
		}
	}
	code := "pad = '" + strings.Repeat("p", 80<<10) + "'\n" + fmt.Sprintf(`import os
got = []
for i in range(%d):
    d = "%s/g%%02d" %% i
    got.append(open(d + "/f").read() == str(i))
    if i %% 2:
        with open(d + "/w", "w") as f:
            f.write("x")
print(sum(got), len(pad))
`, MaxGrants, base)
	r := run(t, p, Job{Code: code, AllowRead: read, AllowWrite: write})
	requireOK(t, r)
	require.Equal(t, fmt.Sprintf("%d %d\n", MaxGrants, 80<<10), r.Stdout)
	for i := 1; i < MaxGrants; i += 2 {
		_, err := os.Stat(fmt.Sprintf("%s/g%02d/w", base, i))
		require.NoError(t, err, "grant %d was not writable", i)
	}
	co := checkout(t, p, Job{AllowRead: read, AllowWrite: write})
	for i := 0; i < 2; i++ {
		sr := feed(t, co, code)
		requireOK(t, sr)
		require.Equal(t, fmt.Sprintf("%d %d\n", MaxGrants, 80<<10), sr.Stdout)
	}
}

// TestHostileReview14SessionFloodThenIdle has a session's steps flood
// stdout and stderr (more than the pipes hold) and then idle between
// steps: each step gets all of its own output and none of another's, a
// job beside it is served, and the idle session waits in poll for its
// next step (the template's other children aside, it is the process that
// is not the spare).
func TestHostileReview14SessionFloodThenIdle(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, Config{Workers: 1})
	co := checkout(t, p, Job{})
	for i := 0; i < 3; i++ {
		tag := fmt.Sprintf("s%d", i)
		r := feed(t, co, fmt.Sprintf(`import sys
for k in range(20000):
    print("%s", k)
    sys.stderr.write("e%s %%d\n" %% k)
`, tag, tag))
		requireOK(t, r)
		lines := strings.Split(strings.TrimSuffix(r.Stdout, "\n"), "\n")
		require.Len(t, lines, 20000, "step %d's stdout", i)
		require.Equal(t, tag+" 0", lines[0])
		require.Equal(t, tag+" 19999", lines[19999])
		require.Equal(t, 20000, strings.Count(r.Stderr, "e"+tag+" "), "step %d's stderr", i)
		require.NotContains(t, r.Stdout, fmt.Sprintf("s%d ", i-1))

		j := run(t, p, Job{Code: "print(6 * 7)"})
		requireOK(t, j)
		require.Equal(t, "42\n", j.Stdout)
	}
	// The session is idle now: one of the template's children waits in
	// poll (7) or ppoll (271), the spare in its receive or its own poll.
	// (Read until it shows: on a loaded machine the children may still be
	// running, the spare warming, when the last job has answered.)
	inPoll := 0
	eventually(func() bool {
		inPoll = 0
		fam := r14Family(t, p)
		for _, pid := range fam[1:] {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid))
			if err != nil {
				continue
			}
			f := strings.Fields(string(b))
			if len(f) > 0 && (f[0] == "7" || f[0] == "271") {
				inPoll++
			}
		}
		return inPoll >= 1
	})
	require.GreaterOrEqual(t, inPoll, 1, "the idle session does not wait in poll")
	r := feed(t, co, "print('after idle')")
	requireOK(t, r)
	require.Equal(t, "after idle\n", r.Stdout)
}

// r14MemfdCode fills n MiB of memfd (memory RLIMIT_AS does not see, the
// cgroup's).
func r14MemfdCode(mib int) string {
	return fmt.Sprintf(`import os
fd = os.memfd_create("r14")
os.posix_fallocate(fd, 0, %d << 20)
print("filled")
`, mib)
}

// TestHostileReview14CgroupReuseAfterOOM runs, on one worker whose job
// cgroups are reused, jobs that hit their memory limit between jobs with
// other limits: each reports its own verdict and its own limit (an OOM
// count or a limit left from an earlier job would fail an honest job or
// name the wrong limit); and neither the template nor its children (a
// spare, a session's process) hold a descriptor of a cgroup file, which
// the host now keeps open for each group's life.
func TestHostileReview14CgroupReuseAfterOOM(t *testing.T) {
	p := newCgroupPool(t, Config{Workers: 1})
	for round := 0; round < 3; round++ {
		r := run(t, p, Job{Code: r14MemfdCode(256), Memory: 32 << 20})
		requireErrorType(t, r, "MemoryError")
		require.Contains(t, r.Error.Hint, "32 MiB", "round %d", round)
		require.Contains(t, r.Error.Message, "memory than its limit", "round %d: not the cgroup's kill", round)
		require.NotContains(t, r.Stdout, "filled")

		// Larger than the last job's limit, within its own: it must run.
		r = run(t, p, Job{Code: r14MemfdCode(96), Memory: 256 << 20})
		requireOK(t, r)
		require.Contains(t, r.Stdout, "filled")

		r = run(t, p, Job{Code: r14MemfdCode(256), Memory: 48 << 20})
		requireErrorType(t, r, "MemoryError")
		require.Contains(t, r.Error.Hint, "48 MiB", "round %d", round)
		require.Contains(t, r.Error.Message, "memory than its limit", "round %d: not the cgroup's kill", round)

		r = run(t, p, Job{Code: "print('ok')"})
		requireOK(t, r)
	}
	co := checkout(t, p, Job{Memory: 256 << 20})
	r := feed(t, co, r14MemfdCode(16))
	requireOK(t, r)
	fam := r14Family(t, p)
	require.GreaterOrEqual(t, len(fam), 2)
	for _, pid := range fam {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		require.NoError(t, err)
		var links []string
		for _, e := range ents {
			l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
			if err == nil {
				links = append(links, e.Name()+"->"+l)
			}
		}
		t.Logf("process %d (template %d): %v", pid, fam[0], links)
		for _, l := range links {
			require.NotContains(t, l, "cgroup", "process %d holds a cgroup file", pid)
		}
	}
}
