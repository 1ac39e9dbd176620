package main

import (
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/pynox/pynox"
)

const probeScript = `import json, sys
d = {"version": "%d.%d.%d" % sys.version_info[:3]}
try:
    import pandas, numpy
    d["pandas"] = pandas.__version__
    d["numpy"] = numpy.__version__
except BaseException as e:
    d["pandas_error"] = "%s: %s" % (type(e).__name__, e)
try:
    import matplotlib
    d["matplotlib"] = matplotlib.__version__
except BaseException as e:
    d["matplotlib_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(d))
`

func pythonInfo(name string) (PythonInfo, error) {
	path, err := pynox.FindPython(name)
	if err != nil {
		return PythonInfo{}, err
	}
	out, err := exec.Command(path, "-c", probeScript).Output()
	if err != nil {
		return PythonInfo{}, fmt.Errorf("%s: %w", path, err)
	}
	info := PythonInfo{Requested: name, Path: path}
	if err := json.Unmarshal(out, &info); err != nil {
		return PythonInfo{}, fmt.Errorf("%s: %w (%q)", path, err, out)
	}
	info.Requested, info.Path = name, path
	return info, nil
}

// cold runs `python -c code` n times from Go, fork/exec to exit.
// vcsInfo describes the commit a Go binary was built from.
func vcsInfo(bin string) string {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return ""
	}
	var rev, modified string
	for _, st := range bi.Settings {
		switch st.Key {
		case "vcs.revision":
			rev = st.Value
		case "vcs.modified":
			modified = st.Value
		}
	}
	if rev == "" {
		return ""
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		return " (commit " + rev + " plus uncommitted changes)"
	}
	return " (commit " + rev + ")"
}

// gitInfo describes the checkout the current directory is in, for
// binaries built with -buildvcs=false.
func gitInfo() string {
	rev, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	st, err := exec.Command("git", "status", "--porcelain").Output()
	if err != nil {
		return ""
	}
	if len(bytes.TrimSpace(st)) > 0 {
		return " (commit " + strings.TrimSpace(string(rev)) + " plus uncommitted or untracked changes)"
	}
	return " (commit " + strings.TrimSpace(string(rev)) + ")"
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if k, v, ok := strings.Cut(string(line), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
