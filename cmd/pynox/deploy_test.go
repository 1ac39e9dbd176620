package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/pynox/pynox/internal/testenv"
)

// deployDir is the repository's deploy directory.
const deployDir = "../../deploy"

// manifests reads every document of deploy/kubernetes/*.yaml but the
// kustomization, by kind.
func manifests(t *testing.T) map[string]map[string]any {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "kubernetes", "*.yaml"))
	require.NoError(t, err)
	byKind := map[string]map[string]any{}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); err != nil {
				require.ErrorContains(t, err, "EOF", f)
				break
			}
			kind, _ := doc["kind"].(string)
			require.NotEmpty(t, kind, "%s: a document without kind", f)
			require.NotNil(t, doc["apiVersion"], f)
			require.Equal(t, "pynox", dig(doc, "metadata", "name"), f)
			require.NotContains(t, byKind, kind, "%s: a second %s", f, kind)
			byKind[kind] = doc
		}
	}
	return byKind
}

// dig follows keys (strings for maps, ints for lists) into a parsed
// document; it returns nil where the path does not exist.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// checkServeFlags runs `pynox serve` (in this process) with args and an
// invalid --max-conns: every flag of args must parse, so that it stops at
// --max-conns, before starting anything.
func checkServeFlags(t *testing.T, where string, args []string) {
	t.Helper()
	var out, errb strings.Builder
	code := run(append(append([]string{"serve"}, args...), "--max-conns=0"), strings.NewReader(""), &out, &errb)
	require.Equal(t, 2, code, "%s: %s", where, errb.String())
	require.Equal(t, "pynox serve: --max-conns=0: expected a positive integer\n", errb.String(), "%s: a flag pynox serve does not take, or a bad value: %q", where, args)
}

// TestDeployManifests: the Kubernetes manifests parse, hold the five kinds
// docs/deploy.md describes, agree with each other (selectors, ports, the
// Secret's mount and the token file, the grace period and
// --drain-timeout, probes on /readyz and /healthz) and name only flags
// pynox serve takes; `kubectl kustomize` (which needs no cluster) builds
// them where kubectl is installed.
func TestDeployManifests(t *testing.T) {
	m := manifests(t)
	for _, kind := range []string{"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy"} {
		require.Contains(t, m, kind)
	}
	d := m["Deployment"]
	labels := dig(d, "spec", "template", "metadata", "labels")
	require.Equal(t, labels, dig(d, "spec", "selector", "matchLabels"))
	require.Equal(t, labels, dig(m["Service"], "spec", "selector"))
	require.Equal(t, labels, dig(m["PodDisruptionBudget"], "spec", "selector", "matchLabels"))
	require.Equal(t, labels, dig(m["NetworkPolicy"], "spec", "podSelector", "matchLabels"))
	require.Equal(t, "Deployment", dig(m["HorizontalPodAutoscaler"], "spec", "scaleTargetRef", "kind"))
	require.Equal(t, "pynox", dig(m["HorizontalPodAutoscaler"], "spec", "scaleTargetRef", "name"))
	require.Equal(t, []any{}, dig(m["NetworkPolicy"], "spec", "egress"), "no egress")
	require.Contains(t, dig(m["NetworkPolicy"], "spec", "policyTypes"), "Egress")

	pod := dig(d, "spec", "template", "spec")
	c := dig(pod, "containers", 0)
	var args []string
	for _, a := range dig(c, "args").([]any) {
		args = append(args, a.(string))
	}
	checkServeFlags(t, "deployment.yaml", args)
	flag := func(name string) string {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		return ""
	}

	// The port the server listens on is the container's, which the
	// Service and the NetworkPolicy use.
	port := strings.TrimPrefix(flag("listen"), ":")
	require.Equal(t, port, strconv.Itoa(dig(c, "ports", 0, "containerPort").(int)))
	require.Equal(t, dig(c, "ports", 0, "name"), dig(m["Service"], "spec", "ports", 0, "targetPort"))
	require.Equal(t, port, strconv.Itoa(dig(m["NetworkPolicy"], "spec", "ingress", 0, "ports", 0, "port").(int)))

	// Probes: readiness on /readyz, liveness (and startup) on /healthz,
	// both endpoints of the server.
	require.Equal(t, "/readyz", dig(c, "readinessProbe", "httpGet", "path"))
	require.Equal(t, "/healthz", dig(c, "livenessProbe", "httpGet", "path"))
	require.Equal(t, "/healthz", dig(c, "startupProbe", "httpGet", "path"))
	for _, p := range []string{"/readyz", "/healthz"} {
		require.Contains(t, serveUsage, "GET  "+p)
	}

	// The grace period outlasts the drain.
	drain, err := time.ParseDuration(flag("drain-timeout"))
	require.NoError(t, err)
	grace := time.Duration(dig(pod, "terminationGracePeriodSeconds").(int)) * time.Second
	require.Greater(t, grace, drain+5*time.Second, "terminationGracePeriodSeconds vs --drain-timeout")

	// The token file is in the mounted Secret.
	tokenFile := flag("token-file")
	require.NotEmpty(t, tokenFile, "a server on a pod address needs --token-file")
	var secretMount string
	for _, vm := range dig(c, "volumeMounts").([]any) {
		if dig(vm, "name") == "tokens" {
			secretMount = dig(vm, "mountPath").(string)
		}
	}
	require.Equal(t, secretMount, filepath.Dir(tokenFile))
	var secret any
	for _, v := range dig(pod, "volumes").([]any) {
		if dig(v, "name") == "tokens" {
			secret = dig(v, "secret")
		}
	}
	require.Equal(t, "pynox-tokens", dig(secret, "secretName"))

	// The security settings docs/deploy.md explains.
	require.Equal(t, "RuntimeDefault", dig(pod, "securityContext", "seccompProfile", "type"))
	require.Equal(t, true, dig(pod, "securityContext", "runAsNonRoot"))
	require.Equal(t, false, dig(c, "securityContext", "allowPrivilegeEscalation"))
	require.Equal(t, []any{"ALL"}, dig(c, "securityContext", "capabilities", "drop"))

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Log("kubectl is not installed: kubectl kustomize not run")
		return
	}
	out, err := exec.Command(kubectl, "kustomize", filepath.Join(deployDir, "kubernetes")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, kind := range []string{"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy"} {
		require.Contains(t, string(out), "kind: "+kind)
	}
}

// dockerfileArgs returns the JSON array of the Dockerfile's instruction
// (ENTRYPOINT or CMD).
func dockerfileArgs(t *testing.T, text, instr string) []string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + instr + ` (\[.*\])$`)
	sub := re.FindStringSubmatch(text)
	require.NotNil(t, sub, "the Dockerfile has no %s in exec form", instr)
	var a []string
	require.NoError(t, json.Unmarshal([]byte(sub[1]), &a))
	return a
}

// TestDeployDockerfile: the image's entrypoint is pynox serve, its default
// flags are flags pynox serve takes, its python is Debian's, and the
// build is static; and where a Docker daemon answers (and PYNOX_LONG=1),
// the image builds and serves a job.
func TestDeployDockerfile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	require.NoError(t, err)
	text := string(b)
	require.Equal(t, []string{"/usr/local/bin/pynox", "serve"}, dockerfileArgs(t, text, "ENTRYPOINT"))
	cmd := dockerfileArgs(t, text, "CMD")
	checkServeFlags(t, "Dockerfile CMD", cmd)
	require.Contains(t, cmd, "--python=/usr/bin/python3")
	require.Contains(t, text, "CGO_ENABLED=0 go build")
	require.Contains(t, text, "FROM debian:bookworm-slim")
	require.Regexp(t, `(?m)^USER 65532`, text)

	docker, err := exec.LookPath("docker")
	if err != nil {
		t.Skip("docker is not installed: the image is not built")
	}
	if out, err := exec.Command(docker, "version", "--format", "{{.Server.Version}}").CombinedOutput(); err != nil {
		t.Skipf("no Docker daemon answers (docker version: %s): the image is not built", strings.TrimSpace(string(out)))
	}
	testenv.RequireLong(t, "docker build of deploy/Dockerfile")
	tag := "pynox-test:" + strconv.Itoa(os.Getpid())
	build := exec.Command(docker, "build", "-f", filepath.Join(deployDir, "Dockerfile"), "-t", tag, "../..")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() { _ = exec.Command(docker, "rmi", "-f", tag).Run() })
	// The image runs a job (pynox pool on stdin, as the image's user).
	run := exec.Command(docker, "run", "--rm", "-i", "--entrypoint", "/usr/local/bin/pynox", tag, "pool", "--python=/usr/bin/python3")
	run.Stdin = strings.NewReader(`{"id": 1, "code": "import sys; print(sys.version_info[:2])"}` + "\n")
	out, err = run.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("docker run: %v: %s", err, ee.Stderr)
	}
	require.NoError(t, err)
	require.Contains(t, string(out), `"stdout":"(3, 11)\n"`)
}
