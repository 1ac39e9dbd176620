package main

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReview30CLIAheadAttribution: `pynox pool` (confining itself, two
// workers) gets a burst of JSONL requests whose mounts repeat (so that
// namespaces are attached ahead, taken and taken back) and alternate
// with others at the same path and with a grant beside the mount; each
// job collects from $TMPDIR and writes an output. Every answer carries
// its own request's id, its own /data, its own files and nothing of
// another job's: no result is lost, mixed up or misattributed.
func TestReview30CLIAheadAttribution(t *testing.T) {
	t.Parallel()
	requireSandboxOrSkip(t)
	dir := t.TempDir()
	for _, d := range []string{"a", "b", "g"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, d, "f"), []byte(d), 0o644))
	}
	p := startPoolIn(t, dir, "--workers=2")
	if m, _ := p.ready["mounts"].(map[string]any); m["virtual_paths"] != true {
		t.Skipf("no mount namespaces here: %v", p.ready)
	}
	code := `import os, sys, time
me = sys.argv[1]
t = os.environ["TMPDIR"]
seen = sorted(os.listdir(t))
open(t + "/mine-" + me + ".txt", "w").write(me)
open(os.environ["PYNOX_OUTPUTS"] + "/out-" + me + ".txt", "w").write(me)
g = open("g/f").read() if os.path.exists("g/f") else "-"
time.sleep(0.02 * (int(me) % 3))
print(me, open("/data/f").read(), g, seen)`
	const n = 48
	want := map[string]string{}
	for i := range n {
		src, grant := "a", ""
		switch {
		case i%7 == 3:
			src = "b"
		case i%5 == 4:
			grant = `, "allow_read": ["g"]`
		}
		g := "-"
		if grant != "" {
			g = "g"
		}
		id := fmt.Sprint(i)
		want[id] = fmt.Sprintf("%s %s %s ['outputs']\n", id, src, g)
		line := fmt.Sprintf(`{"id": %q, "code": %q, "args": [%q], "collect": ["$TMPDIR/*.txt"], "mounts": [{"host": %q, "path": "/data"}]%s}`,
			id, code, id, src, grant)
		p.send(t, line)
	}
	for range n {
		r := p.next(t)
		id, _ := r["id"].(string)
		w, ok := want[id]
		require.True(t, ok, "an answer for no pending request: %v", r)
		delete(want, id)
		require.Nil(t, r["error"], "%s: %v", id, r)
		require.Equal(t, w, r["stdout"], "job %s", id)
		files, _ := r["files"].([]any)
		var got []string
		for _, f := range files {
			m := f.(map[string]any)
			b, err := base64.StdEncoding.DecodeString(m["data"].(string))
			require.NoError(t, err)
			got = append(got, filepath.Base(m["path"].(string))+"="+string(b))
		}
		require.ElementsMatch(t, []string{"mine-" + id + ".txt=" + id, "out-" + id + ".txt=" + id}, got, "job %s files", id)
	}
	require.Empty(t, want, "requests never answered")
	_ = strings.TrimSpace
}

// TestReview30CLISessionsAndCancelAhead: over the pool protocol, two
// sessions with the same mounts as the one-shot jobs around them (so
// that namespaces are attached ahead, taken and taken back), whose
// process ends every other step (its replacement may take a namespace
// ahead, and its scratch directory with it), and a long one-shot job
// cancelled while it runs: every request is answered once, with its own
// id, its own output and files, and a fresh scratch directory where one
// is due.
func TestReview30CLISessionsAndCancelAhead(t *testing.T) {
	t.Parallel()
	requireSandboxOrSkip(t)
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "a"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a", "f"), []byte("a"), 0o644))
	p := startPoolIn(t, dir, "--workers=2")
	if m, _ := p.ready["mounts"].(map[string]any); m["virtual_paths"] != true {
		t.Skipf("no mount namespaces here: %v", p.ready)
	}
	mounts := `[{"host": "a", "path": "/data"}]`
	code := `import os, sys
me = sys.argv[1]
t = os.environ["TMPDIR"]
seen = sorted(os.listdir(t))
open(t + "/k-" + me, "w").write(me)
open(os.environ["PYNOX_OUTPUTS"] + "/o-" + me + ".txt", "w").write(me)
print(me, open("/data/f").read(), seen)`
	want := map[string]string{}
	files := map[string]string{}
	started := map[string]bool{}
	send := func(id, session string, exit bool, prev string) {
		c := code
		if exit {
			c += "\nsys.stdout.flush(); os._exit(0)"
		}
		s := `, "mounts": ` + mounts
		if session != "" {
			s = fmt.Sprintf(`, "session": %q`, session)
			// The first request, and the one after a step whose process
			// ended (it starts a new process with the permissions it
			// brings: the pool protocol), bring the mounts.
			if !started[session] {
				s += `, "mounts": ` + mounts
			}
			started[session] = !exit
		}
		p.send(t, fmt.Sprintf(`{"id": %q, "code": %q, "args": [%q]%s}`, id, c, id, s))
		seen := "['outputs']"
		if prev != "" {
			seen = "['k-" + prev + "', 'outputs']"
		}
		want[id] = id + " a " + seen + "\n"
		files[id] = "o-" + id + ".txt=" + id
	}
	p.send(t, `{"id": "long", "code": "import time\ntime.sleep(30)", "mounts": `+mounts+`}`)
	for i := range 6 {
		for s := range 2 {
			prev := ""
			if i%2 == 1 {
				prev = fmt.Sprintf("s%d-%d", s, i-1)
			}
			send(fmt.Sprintf("s%d-%d", s, i), fmt.Sprintf("s%d", s), i%2 == 1, prev)
		}
		send(fmt.Sprintf("j%d", i), "", false, "")
		if i == 3 {
			p.send(t, `{"id": "c", "cancel": "long"}`)
		}
	}
	cancelled, long := false, false
	for len(want) > 0 || !cancelled || !long {
		r := p.next(t)
		id, _ := r["id"].(string)
		switch id {
		case "c":
			require.Equal(t, true, r["cancelled"], "%v", r)
			cancelled = true
			continue
		case "long":
			require.Equal(t, "CancelledError", r["error"].(map[string]any)["type"], "%v", r)
			long = true
			continue
		}
		w, ok := want[id]
		require.True(t, ok, "an answer for no pending request: %v", r)
		delete(want, id)
		require.Nil(t, r["error"], "%s: %v", id, r)
		require.Equal(t, w, r["stdout"], "request %s", id)
		var got []string
		for _, f := range r["files"].([]any) {
			m := f.(map[string]any)
			b, err := base64.StdEncoding.DecodeString(m["data"].(string))
			require.NoError(t, err)
			got = append(got, filepath.Base(m["path"].(string))+"="+string(b))
		}
		require.Equal(t, []string{files[id]}, got, "request %s files", id)
	}
}
