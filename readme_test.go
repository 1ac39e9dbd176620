package pynox_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/pynox/pynox/internal/sandbox"
)

// readmeBlock is one fenced code block of README.md.
type readmeBlock struct {
	lang string // the word after the opening fence; "" for none
	line int    // the line of the opening fence
	text string
}

// readmeSkip is a command of the README that the test does not run, and
// why. A line of a shell block that contains match is replaced by a
// no-op; when is nil or says yes.
type readmeSkip struct {
	match, reason string
	when          func() bool
}

// readmeSkips is the whole skip list: keep it short, and give a reason.
var readmeSkips = []readmeSkip{
	{match: "go test ./...", reason: "the test suite itself: running it from a test would recurse"},
	{match: "-fuzz", reason: "fuzzing runs for minutes; .ci/run runs short passes"},
	{match: "go run ./cmd/pynox-bench", reason: "the benchmark runs for minutes and is for a quiet machine"},
	{match: "-bench", reason: "benchmarks measure; they are not tests"},
	{match: "--preload=pandas", reason: "/usr/bin/python3 cannot import pandas and numpy (Debian: python3-pandas)",
		when: func() bool { return exec.Command("/usr/bin/python3", "-c", "import pandas, numpy").Run() != nil }},
}

// readmeBlocks returns the fenced code blocks of a Markdown text.
func readmeBlocks(text string) []readmeBlock {
	var blocks []readmeBlock
	var cur *readmeBlock
	var body strings.Builder
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		fence := strings.HasPrefix(strings.TrimSpace(line), "```")
		switch {
		case cur == nil && fence:
			lang, _, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "```")), " ")
			cur = &readmeBlock{lang: strings.ToLower(lang), line: n}
			body.Reset()
		case cur != nil && fence:
			cur.text = body.String()
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			body.WriteString(line + "\n")
		}
	}
	return blocks
}

// TestREADMEBlocks checks every fenced code block of README.md, so that
// what a newcomer copies works as written: it runs the shell and Python
// blocks in order in one bash session from the repository root, as a
// reader following the README in one terminal would (an export in one
// block holds for the next), and checks that the JSON blocks are JSON and
// the TOML blocks TOML. Go blocks are fragments (their `...` elide what a
// program adds; example_test.go runs the Go API), and blocks with no
// language or another one are output samples and diagrams: none of these
// run. Commands in readmeSkips are replaced by a no-op, each for its
// reason. New blocks anywhere in the README are checked without changes
// here.
//
// The blocks may write where the README says (./pynox); the test puts a
// ./pynox that was there before back afterwards, removes one it did not
// find, points TMPDIR and Python's bytecode cache into t.TempDir, and fails
// if anything else is left in the repository. It is a long test: it runs
// with PYNOX_LONG=1 (as in .ci/run).
func TestREADMEBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the README's blocks build pynox and start several pools")
	}
	if os.Getenv("PYNOX_LONG") != "1" {
		t.Skip("the README's blocks build pynox and start several pools: a long test, run with PYNOX_LONG=1 (as .ci/run does)")
	}
	if _, err := sandbox.ABI(); err != nil {
		t.Skipf("kernel lacks Landlock, so the README's jobs cannot run confined: %v", err)
	}
	for _, tool := range []string{"bash", "go", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s on PATH to run the README's blocks with", tool)
		}
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()

	var script strings.Builder
	script.WriteString("set -eo pipefail\n")
	ran, used := 0, map[string]bool{}
	for _, b := range readmeBlocks(string(readme)) {
		where := fmt.Sprintf("README.md:%d", b.line)
		switch b.lang {
		case "sh", "bash", "shell", "console":
			fmt.Fprintf(&script, "cd %q\necho '=== %s (%s)' >&2\n", root, where, b.lang)
			for _, line := range strings.Split(strings.TrimSuffix(b.text, "\n"), "\n") {
				if b.lang == "console" {
					cmd, ok := strings.CutPrefix(line, "$ ")
					if !ok {
						continue // output
					}
					line = cmd
				}
				for _, s := range readmeSkips {
					if strings.Contains(line, s.match) && (s.when == nil || s.when()) {
						t.Logf("%s: not run: %s (%s)", where, strings.TrimSpace(line), s.reason)
						line, used[s.match] = ": skipped by TestREADMEBlocks", true
						break
					}
				}
				script.WriteString(line + "\n")
			}
			ran++
		case "python", "py", "python3":
			file := filepath.Join(tmp, fmt.Sprintf("README-%d.py", b.line))
			if err := os.WriteFile(file, []byte(b.text), 0o644); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&script, "cd %q\necho '=== %s (python)' >&2\npython3 %q\n", root, where, file)
			ran++
		case "json":
			dec := json.NewDecoder(strings.NewReader(b.text))
			for {
				var v map[string]any
				if err := dec.Decode(&v); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Errorf("%s: a json block holds one JSON object per line: %v", where, err)
					break
				}
			}
		case "toml":
			var v map[string]any
			if err := toml.Unmarshal([]byte(b.text), &v); err != nil {
				t.Errorf("%s: not TOML: %v", where, err)
			}
		default:
			t.Logf("%s: not run: a %q block (Go fragments, output samples and diagrams are not programs)", where, b.lang)
		}
	}
	if ran == 0 {
		t.Fatal("README.md has no shell or Python block: the extractor is broken")
	}
	for _, s := range readmeSkips {
		if !used[s.match] && (s.when == nil || s.when()) {
			t.Logf("skip list entry %q matches no README line any more", s.match)
		}
	}

	before := repoFiles(t, root)
	saved := filepath.Join(tmp, "pynox.saved")
	hadBinary := os.Rename(filepath.Join(root, "pynox"), saved) == nil
	defer func() {
		os.Remove(filepath.Join(root, "pynox"))
		if hadBinary {
			if err := os.Rename(saved, filepath.Join(root, "pynox")); err != nil {
				t.Errorf("could not put ./pynox back: %v", err)
			}
		}
		after := repoFiles(t, root)
		for p := range after {
			if !before[p] && p != "pynox" {
				t.Errorf("the README's blocks left %s behind in the repository", p)
			}
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
	cmd.Dir = root
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "PYNOX_BIN" && k != "PYTHONPATH" && k != "TMPDIR" {
			env = append(env, kv) // the README's own set-up must provide these
		}
	}
	cmd.Env = append(env, "TMPDIR="+tmp, "PYTHONPYCACHEPREFIX="+filepath.Join(tmp, "pycache"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		block, tail := "before the first block", out.String()
		if i := strings.LastIndex(tail, "=== README.md:"); i >= 0 {
			tail = tail[i:]
			block, _, _ = strings.Cut(tail[4:], "\n")
		}
		t.Fatalf("a README block fails as written (%v), in %s; its output:\n%s", err, block, tail)
	}
	t.Logf("%d blocks ran; output:\n%s", ran, out.String())
}

// repoFiles lists the repository's files and directories (not .git),
// relative to root.
func repoFiles(t *testing.T, root string) map[string]bool {
	t.Helper()
	files := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == ".git" {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, p)
		files[rel] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
