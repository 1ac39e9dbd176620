package jsonl

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pynox/pynox"
	"github.com/stretchr/testify/require"
)

// The decoder's exact check leaves well-formed requests alone, keys
// written with escapes included, and every field name it accepts is one
// the request types declare.
func TestDecodeRequestExactKeys(t *testing.T) {
	t.Parallel()
	req, err := decodeRequest([]byte(`{"id": 1, "c\u006fde": "print(1)", "env": {"ſ": "1", "s": "2", "S": "3"}, "reply": null}`))
	require.Nil(t, err)
	require.Equal(t, "print(1)", req.Code)
	require.Equal(t, map[string]string{"ſ": "1", "s": "2", "S": "3"}, req.Env, "map keys differing only in case are distinct")
	require.Contains(t, requestSchema.fields, "code")
	require.Contains(t, requestSchema.fields, "session")
	require.Equal(t, []string{"call_id", "error", "error_type", "result"}, requestSchema.fields["reply"].names())
	require.NotContains(t, requestSchema.fields, "Host", "Job.Host is not part of the protocol")

	// Many keys (past the short list) are still checked for repeats.
	var env []string
	for i := range 40 {
		env = append(env, fmt.Sprintf("%q: \"v\"", fmt.Sprint("K", i)))
	}
	env = append(env, `"K7": "again"`)
	_, err = decodeRequest([]byte(`{"code": "1", "env": {` + strings.Join(env, ", ") + `}}`))
	require.NotNil(t, err)
	require.Contains(t, err.Message, `env: key "K7" appears twice`)

	// Syntax errors keep the decoder's own message.
	_, err = decodeRequest([]byte(`{"code": "1", "env": {"A": }`))
	require.NotNil(t, err)
	require.Contains(t, err.Message, "not valid JSON at column 28")
	// A stray closing brace was taken for the end of input by dec.More.
	_, err = decodeRequest([]byte(`{"code": "1"}}`))
	require.NotNil(t, err)
	require.Contains(t, err.Message, "trailing data")
	b, merr := json.Marshal(request{Job: pynox.Job{ID: "x", Code: "1", Env: map[string]string{"A": "b"}}})
	require.NoError(t, merr)
	_, err = decodeRequest(b)
	require.Nil(t, err, "%s", b)
}

// Request keys are matched exactly: encoding/json alone would take "CODE"
// or "ſession" (a long s folds to s) for a field and keep the last of two
// "code" keys, so a front end vetting lines by exact key could be
// bypassed. Each line is refused with a RequestError that names the key,
// nothing runs, and the pool keeps serving.
func TestHostileFrontKeyFolding(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, pynox.Config{Workers: 1})
	ran := "print('" + "folded key ran" + "')"
	cases := []struct {
		id, line, want string
	}{
		{"upper", `{"id": "upper", "CODE": "` + ran + `"}`, `unknown field "CODE": field names are exact and case-sensitive; did you mean "code"?`},
		{"mixed", `{"id": "mixed", "code": "` + ran + `", "ALLOW_WRITE": ["."]}`, `unknown field "ALLOW_WRITE"`},
		{"longs", `{"id": "longs", "ſession": "nb", "code": "` + ran + `"}`, `unknown field "ſession": field names are exact and case-sensitive; did you mean "session"?`},
		{"dup", `{"id": "dup", "code": "print('vetted')", "code": "` + ran + `"}`, `key "code" appears twice`},
		{"escdup", `{"id": "escdup", "code": "print('vetted')", "cod\u0065": "` + ran + `"}`, `key "code" appears twice`},
		{"envdup", `{"id": "envdup", "code": "` + ran + `", "env": {"A": "1", "A": "2"}}`, `env: key "A" appears twice`},
		{"reply", `{"id": "reply", "reply": {"CALL_ID": 1, "result": 1}}`, `reply: unknown field "CALL_ID"`},
		{"replydup", `{"id": "replydup", "reply": {"call_id": 1, "call_id": 2, "result": 1}}`, `reply: key "call_id" appears twice`},
		{"resultdup", `{"id": "resultdup", "reply": {"call_id": 1, "result": [{"a": 1, "a": 2}]}}`, `reply.result[]: key "a" appears twice`},
		{"session", `{"id": "session", "session": "nb", "Code": "` + ran + `"}`, `unknown field "Code"`},
	}
	var in []string
	for _, c := range cases {
		in = append(in, c.line)
	}
	// A duplicated id is echoed as null: the answer must not pick one.
	in = append(in, `{"id": "first", "id": "second", "code": "`+ran+`"}`)
	in = append(in, `{"id": "after", "code": "print('still serving')"}`)
	lines := serveLines(t, p, strings.Join(in, "\n")+"\n")
	require.Len(t, lines, 1+len(in), "one answer per line")
	got := map[string]map[string]any{}
	for _, l := range lines[1:] {
		got[fmt.Sprint(l["id"])] = l
		if out, ok := l["stdout"]; ok { // a reply's refusal has none
			require.NotContains(t, out, "folded key ran", "%v", l)
		}
	}
	for _, c := range cases {
		require.Equal(t, "RequestError", errType(got[c.id]), c.id)
		require.Contains(t, errMessage(got[c.id]), c.want, c.id)
	}
	require.Equal(t, "RequestError", errType(got["<nil>"]))
	require.Contains(t, errMessage(got["<nil>"]), `key "id" appears twice`)
	require.Equal(t, "still serving\n", got["after"]["stdout"])
}

// The configuration file is read as exactly as request lines: go-toml,
// like encoding/json, folds case when decoding into a struct, so
// "WORKERS" or "[POOL]" passed for a setting — against LoadConfig's
// promise that no typo in a security setting passes silently.
func TestHostileFrontConfigKeysExact(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ content, want string }{
		{"[pool]\nWORKERS = 3\n", ":2: unknown key pool.WORKERS: keys are exact and case-sensitive; did you mean workers?"},
		{"[POOL]\nworkers = 3\n", ":1: unknown key POOL: keys are exact and case-sensitive; did you mean pool?"},
		{"[pool.limits]\nALLOW_WRITE = [\"/nonexistent\"]\n", ":2: unknown key pool.limits.ALLOW_WRITE"},
		{"[profiles.Mixed]\ntimeout = \"1s\"\n[profiles.x]\nTimeout = \"2s\"\n", ":4: unknown key profiles.x.Timeout"},
	} {
		path := writeFile(t, filepath.Join(t.TempDir(), "pynox.toml"), tc.content)
		_, err := LoadConfig(path)
		require.Error(t, err, tc.content)
		require.Contains(t, err.Error(), path+tc.want)
	}
	// Profile names are the operator's own: any case is fine.
	path := writeFile(t, filepath.Join(t.TempDir(), "pynox.toml"), "[profiles.Mixed]\ntimeout = \"1s\"\n")
	f, err := LoadConfig(path)
	require.NoError(t, err)
	require.Equal(t, []string{"Mixed"}, f.Config.ProfileNames())
}
