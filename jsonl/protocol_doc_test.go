package jsonl

import (
	"encoding"
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pynox/pynox"
)

// protocolDoc is the reference of the pool protocol, which
// TestProtocolDocCoversTheCode holds to the code (tests run in the
// package's directory).
const protocolDoc = "../docs/protocol.md"

// docPart is one part of the pool protocol and what docs/protocol.md must
// say about it.
type docPart struct {
	// heading is a heading line of the document (such as "### Request
	// fields"); the part's section runs from it to the next heading of the
	// same or a higher level. Empty means the whole document.
	heading string
	// names must each appear in the section in backticks, as `name`.
	names []string
	// exact: every table row of the section whose first cell is one
	// backticked name (| `name` | …) names one of names, so that a field
	// the code has dropped does not live on in the document.
	exact bool
}

// protocolDocParts is the one place that ties the protocol's code to its
// reference: the keys the request decoder accepts (its own schema, as
// checkKeys enforces it), the JSON names of every line the pool writes
// (by reflection over the types it encodes), the error types of results,
// the keys of the configuration file (LoadConfig's schema) and the
// protocol's limits. A new field in any of them fails the test until the
// document describes it.
//
// It and decodeRequest (in TestProtocolDocExamples) are the test's only
// ties to the protocol's code; the limits in limitValues are the root
// package's exported bounds and this package's own.
func protocolDocParts() []docPart {
	parts := []docPart{
		{heading: "### Request fields", names: requestSchema.names(), exact: true},
		{heading: "### The ready event", names: jsonNames(reflect.TypeFor[Ready]()), exact: true},
		{heading: "## Results", names: jsonNames(reflect.TypeFor[pynox.Result]()), exact: true},
		{heading: "## Error types", names: resultErrorTypes()},
		{heading: "### Closing a session", names: jsonNames(reflect.TypeFor[closedEvent]())},
		{heading: "### Interrupting a step", names: jsonNames(reflect.TypeFor[interruptedEvent]()), exact: true},
		{heading: "### Cancelling a job", names: jsonNames(reflect.TypeFor[cancelEvent]()), exact: true},
		{heading: "### Dumping and restoring a session", names: jsonNames(reflect.TypeFor[dumpEvent]()), exact: true},
		{heading: "### Call events", names: jsonNames(reflect.TypeFor[callEvent]()), exact: true},
		{heading: "### Replies", names: jsonNames(reflect.TypeFor[replyError]())},
		{heading: "## Stats", names: jsonNames(reflect.TypeFor[statsEvent]()), exact: true},
		{heading: "## Streamed output", names: jsonNames(reflect.TypeFor[outputEvent]()), exact: true},
		{heading: "### Rich outputs", names: jsonNames(reflect.TypeFor[displayEvent]())},
		{heading: "## Log lines", names: jsonNames(reflect.TypeFor[jobLine]()), exact: true},
		{heading: "## Limits and units", names: limitValues()},
	}
	// Objects inside a request (the reply of a host call) are documented
	// where their request is.
	nested := map[string]string{"reply": "### Replies"}
	for _, k := range requestSchema.names() {
		if s := requestSchema.child(k); s.fields != nil {
			parts = append(parts, docPart{heading: nested[k], names: s.names(), exact: nested[k] != ""})
		}
	}
	return append(parts, tomlDocParts(fileKeys, nil)...)
}

// tomlDocParts lists a part per table of the configuration file, under
// the heading "### `[pool.limits]`" (a table of tables is
// "[profiles.NAME]"), whose rows must be exactly the table's keys.
func tomlDocParts(s *keySchema, path []string) []docPart {
	var parts []docPart
	var keys []string
	for _, k := range s.names() {
		child := s.child(k)
		switch {
		case child.fields != nil:
			parts = append(parts, tomlDocParts(child, append(slices.Clone(path), k))...)
		case child.elem != nil:
			parts = append(parts, tomlDocParts(child.elem, append(slices.Clone(path), k, "NAME"))...)
		default:
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		h := "### `[" + strings.Join(path, ".") + "]`"
		parts = append([]docPart{{heading: h, names: keys, exact: true}}, parts...)
	}
	return parts
}

// jsonNames lists the JSON names encoding/json gives t's fields, those of
// embedded structs and of nested structs (through pointers, slices and
// maps) included.
func jsonNames(t reflect.Type) []string {
	seen := map[string]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct ||
			t.Implements(reflect.TypeFor[json.Marshaler]()) || t.Implements(reflect.TypeFor[encoding.TextMarshaler]()) {
			return
		}
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
				walk(ft)
				continue
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			seen[name] = true
			walk(f.Type)
		}
	}
	walk(t)
	return slices.Sorted(func(yield func(string) bool) {
		for n := range seen {
			if !yield(n) {
				return
			}
		}
	})
}

// resultErrorTypes lists the error types the pool itself puts in
// results (the Python exception classes aside).
func resultErrorTypes() []string {
	var types []string
	for k := pynox.KindRequest; k <= pynox.KindCrashed; k++ {
		types = append(types, k.String())
	}
	return types
}

// limitValues lists the protocol's limits and defaults as the document
// writes them: durations and sizes in the protocol's units ("30s",
// "1g"), counts as integers.
func limitValues() []string {
	d := func(v time.Duration) string {
		s := v.String() // "10m0s", "1h0m0s"
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return s
	}
	size := func(n int64) string {
		for _, u := range []struct {
			suffix string
			shift  uint
		}{{"t", 40}, {"g", 30}, {"m", 20}, {"k", 10}} {
			if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
				return strconv.FormatInt(n>>u.shift, 10) + u.suffix
			}
		}
		return strconv.FormatInt(n, 10)
	}
	n := func(v int) string { return strconv.Itoa(v) }
	return []string{
		n(pynox.DefaultWorkers), d(pynox.DefaultTimeout), size(pynox.DefaultMemory), size(pynox.DefaultMaxOutput),
		size(pynox.DefaultMaxFileSize), n(pynox.DefaultMaxSessions), d(pynox.DefaultSessionIdle), n(pynox.DefaultThreads),
		size(MaxLine), n(MaxPendingSteps), size(pynox.MaxCallBytes), n(pynox.MaxCalls), n(pynox.MaxFunctions),
		n(maxSessionName), n(pynox.MaxGrants), size(pynox.MaxCodeSize), size(pynox.MaxScriptSize),
	}
}

// docSection returns the text under heading: up to the next heading of
// the same or a higher level, fenced code blocks skipped when looking for
// it. Empty heading means the whole document.
func docSection(doc, heading string) (string, bool) {
	if heading == "" {
		return doc, true
	}
	level := func(line string) int {
		n := len(line) - len(strings.TrimLeft(line, "#"))
		if n == 0 || !strings.HasPrefix(line[n:], " ") {
			return 0
		}
		return n
	}
	lines := strings.Split(doc, "\n")
	start, fence := -1, false
	for i, line := range lines {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		switch l := level(line); {
		case start < 0 && strings.TrimSpace(line) == heading:
			start = i
		case start >= 0 && l > 0 && l <= level(heading):
			return strings.Join(lines[start:i], "\n"), true
		}
	}
	if start < 0 {
		return "", false
	}
	return strings.Join(lines[start:], "\n"), true
}

// tableRowName matches a table row whose first cell is one backticked
// name.
var tableRowName = regexp.MustCompile("^\\|\\s*`([^`]+)`\\s*\\|")

// TestProtocolDocCoversTheCode holds docs/protocol.md to the code: every
// key the request decoder accepts, every field of the lines the pool
// writes, every error type of results, every configuration key and the
// protocol's limits appear in it, each in the section about it; and the
// tables of fields name no field the code lacks.
func TestProtocolDocCoversTheCode(t *testing.T) {
	b, err := os.ReadFile(protocolDoc)
	if err != nil {
		t.Fatalf("the protocol reference: %v", err)
	}
	doc := string(b)
	for _, part := range protocolDocParts() {
		where := part.heading
		if where == "" {
			where = "the document"
		}
		sec, ok := docSection(doc, part.heading)
		if !ok {
			t.Errorf("%s has no heading %q: the code has %s to document there", protocolDoc, part.heading, strings.Join(part.names, ", "))
			continue
		}
		for _, name := range part.names {
			if !strings.Contains(sec, "`"+name+"`") {
				t.Errorf("%s does not document `%s` under %s", protocolDoc, name, where)
			}
		}
		if !part.exact {
			continue
		}
		for _, line := range strings.Split(sec, "\n") {
			if m := tableRowName.FindStringSubmatch(line); m != nil && !slices.Contains(part.names, m[1]) {
				t.Errorf("%s lists `%s` under %s, which the code does not have (it has %s)", protocolDoc, m[1], where, strings.Join(part.names, ", "))
			}
		}
	}
}

// TestProtocolDocParts checks the derivation itself: it finds the fields
// the protocol is known to have, wherever they are declared.
func TestProtocolDocParts(t *testing.T) {
	all := map[string][]string{}
	for _, p := range protocolDocParts() {
		all[p.heading] = append(all[p.heading], p.names...)
	}
	for heading, want := range map[string][]string{
		"### Request fields":    {"code", "timeout", "memory", "max_file_size", "session", "reply", "functions"}, // Job's and request's own
		"### Replies":           {"call_id", "result", "error", "exit", "id"},                                    // the reply object and the answer to a bad reply
		"## Results":            {"exit", "type", "hint", "python", "allow_write", "cgroups", "session_ended"},   // nested error, runtime, policy
		"### Call events":       {"event", "id", "call_id", "function", "args", "kwargs", "session"},             // embedded *Call
		"## Stats":              {"id", "event", "uptime_ms", "errors"},                                          // embedded Stats
		"### `[pool]`":          {"workers", "cgroups", "pid_namespace"},
		"### `[pool.limits]`":   {"allow_write", "threads", "max_file_size"},
		"### `[profiles.NAME]`": {"env", "allow_network"},
		"## Error types":        {"RequestError", "TimeoutError", "SignalError", "SandboxSetupError", "PoolWorkerError"},
		"### The ready event":   {"pid_namespace", "cgroups", "config"},
		"## Log lines":          {"ts_ms", "truncated"},
		"### Closing a session": {"closed"},
		"## Limits and units":   {"30s", "1g", "10m", "1m", "256m", "8", "1000"},
	} {
		for _, w := range want {
			if !slices.Contains(all[heading], w) {
				t.Errorf("%s: %q not derived from the code (got %v)", heading, w, all[heading])
			}
		}
	}
	if slices.Contains(all["### Request fields"], "Timeout") || slices.Contains(all["### Request fields"], "Host") {
		t.Errorf("request fields include a field the decoder never reads: %v", all["### Request fields"])
	}
}

// TestProtocolDocExamples checks the document's JSON examples: every
// complete line (one not shortened with "…") is a JSON object, and every
// request among them (a line that is no event, result or answer) is one
// the pool's decoder accepts — unless the line after it answers it with a
// RequestError, which must then carry the decoder's own message when the
// decoder is what refuses it.
func TestProtocolDocExamples(t *testing.T) {
	b, err := os.ReadFile(protocolDoc)
	if err != nil {
		t.Fatalf("the protocol reference: %v", err)
	}
	type pending struct {
		line int
		err  *pynox.Error
	}
	var prev *pending // the request on the line before, when refused by the decoder
	flush := func() {
		if prev != nil {
			t.Errorf("%s:%d: the decoder refuses this request: %v", protocolDoc, prev.line, prev.err)
		}
		prev = nil
	}
	requests := 0
	inJSON := false
	for i, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			flush()
			inJSON = line == "```json"
			continue
		}
		if !inJSON || strings.TrimSpace(line) == "" {
			continue
		}
		if prev != nil {
			msg, _ := json.Marshal(prev.err.Message)
			if !strings.Contains(line, `"RequestError"`) || !strings.Contains(line, string(msg[1:len(msg)-1])) {
				t.Errorf("%s:%d: the answer to line %d is not the decoder's refusal %q", protocolDoc, i+1, prev.line, prev.err.Message)
			}
			prev = nil
			continue
		}
		if strings.Contains(line, "…") {
			continue
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("%s:%d: not a JSON object: %v", protocolDoc, i+1, err)
			continue
		}
		if m["event"] != nil || m["exit"] != nil || m["closed"] != nil || m["interrupted"] != nil || m["cancelled"] != nil {
			continue
		}
		requests++
		if _, rerr := decodeRequest([]byte(line)); rerr != nil {
			prev = &pending{line: i + 1, err: rerr}
		}
	}
	flush()
	if requests == 0 {
		t.Errorf("%s has no example request", protocolDoc)
	}
}
