package pynox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/pynox/pynox/internal/worker"
)

// Tool declares a host function with a description: its name, its
// docstring and its parameters, as a Python signature string, a JSON
// Schema, or both. A job's Tools are declared beside its bare Functions
// (a name may appear in only one of them). Inside the sandbox the
// function has Doc as its __doc__ and the signature as its __signature__,
// so help() and inspect.signature show them, and a call is checked
// against the signature before it reaches the host: a wrong argument is a
// TypeError in the job (also a pynox_host.HostError when the pool finds
// it), never a call to Job.Host.
//
// The signature string is untrusted text. The pool parses it with a strict
// grammar (see [ParseSignature]) and never evaluates it; inside the
// sandbox the runner turns annotations into types with a small evaluator
// that only looks up builtin and typing names (anything else stays the
// annotation's text) and defaults with ast.literal_eval (anything else
// shows as its text). Defaults are for display: a call passes on only the
// arguments the job gave.
type Tool struct {
	// Name is the function's name, a Python identifier of at most 64
	// characters not starting with "_" (as for Job.Functions).
	Name string `json:"name"`
	// Doc is the function's docstring, at most MaxToolDoc bytes.
	Doc string `json:"doc,omitempty"`
	// Signature is a Python signature such as
	// "(query: str, limit: int = 3) -> list[str]", at most MaxSignature
	// bytes on one line. Without it the parameters come from Parameters;
	// with neither, the function takes any arguments.
	Signature string `json:"signature,omitempty"`
	// Parameters is a JSON Schema of type "object" describing the keyword
	// arguments, as OpenAI- and Anthropic-style tool lists carry it. Its
	// properties become positional-or-keyword parameters (required ones
	// first, each other one with its "default", or None); "type" gives
	// the annotation. When Signature is set too, Signature governs the
	// sandbox and Parameters is only what [Tool.Schema] returns.
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// Bounds of a Tool's text.
const (
	// MaxSignature bounds a Tool's Signature, in bytes.
	MaxSignature = 4096
	// MaxToolDoc bounds a Tool's Doc, in bytes.
	MaxToolDoc = 16 << 10
	// maxParameters bounds a Tool's parameters.
	maxParameters = 64
)

// Parameter kinds, as Python's inspect.Parameter names them.
const (
	paramPositionalOnly = "POSITIONAL_ONLY"
	paramPositional     = "POSITIONAL_OR_KEYWORD"
	paramVarPositional  = "VAR_POSITIONAL"
	paramKeywordOnly    = "KEYWORD_ONLY"
	paramVarKeyword     = "VAR_KEYWORD"
)

// Signature is a parsed Python signature: what [ParseSignature] returns
// and the runner builds inspect.Signature from.
type Signature struct {
	// Params are the parameters in order.
	Params []Param `json:"params"`
	// Returns is the return annotation's text; empty for none.
	Returns string `json:"returns,omitempty"`
}

// Param is one parameter of a [Signature].
type Param struct {
	// Name is the parameter's name, a Python identifier.
	Name string `json:"name"`
	// Kind is one of Python's inspect.Parameter kinds:
	// "POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL",
	// "KEYWORD_ONLY" or "VAR_KEYWORD".
	Kind string `json:"kind"`
	// Annotation is the annotation's text; empty for none.
	Annotation string `json:"annotation,omitempty"`
	// Default is the default value's text, when HasDefault.
	Default    string `json:"default,omitempty"`
	HasDefault bool   `json:"has_default,omitempty"`
}

// ParseSignature parses a Python signature string such as
// "(query: str, /, limit: int = 3, *, exact=False, **extra) -> list[str]"
// with a strict grammar, without evaluating anything: the parameter list
// in parentheses, split at the commas outside brackets and string
// literals, each parameter being "/", "*", "*name", "**name" or
// "name[: annotation][= default]", then optionally "-> annotation". It
// applies Python's rules (at most one "/" and one "*", "**" last, a bare
// "*" followed by a keyword-only parameter, no parameter without a default
// after one with a default before the "*", names that are identifiers and
// not keywords, no name twice) and refuses control characters, newlines
// and more than MaxSignature bytes.
func ParseSignature(s string) (*Signature, error) {
	if len(s) > MaxSignature {
		return nil, fmt.Errorf("it is %d bytes; the limit is %d", len(s), MaxSignature)
	}
	if !utf8.ValidString(s) {
		return nil, errors.New("it is not valid UTF-8")
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return nil, errors.New("it holds a control character or a line break; a signature is one line")
		}
	}
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "(") {
		return nil, errors.New(`it must start with "("`)
	}
	end, err := scanTo(s, 1, ")")
	if err != nil {
		return nil, err
	}
	sig := &Signature{}
	rest := strings.TrimSpace(s[end+1:])
	if rest != "" {
		ret, ok := strings.CutPrefix(rest, "->")
		ret = strings.TrimSpace(ret)
		if !ok || ret == "" {
			return nil, fmt.Errorf("%q after the parameters; expected nothing or \"-> annotation\"", rest)
		}
		if err := checkExpr(ret, "the return annotation"); err != nil {
			return nil, err
		}
		sig.Returns = ret
	}
	items, err := splitTop(s[1:end], ',')
	if err != nil {
		return nil, err
	}
	if n := len(items); n > 0 && strings.TrimSpace(items[n-1]) == "" {
		items = items[:n-1] // a trailing comma
		if len(items) == 0 {
			return nil, errors.New("a comma without parameters")
		}
	}
	if len(items) > maxParameters {
		return nil, fmt.Errorf("%d parameters; at most %d are allowed", len(items), maxParameters)
	}
	kind := paramPositional
	slash, star, sawDefault := false, false, false
	bareStar := -1
	seen := map[string]bool{}
	for i, it := range items {
		it = strings.TrimSpace(it)
		switch {
		case it == "":
			return nil, fmt.Errorf("parameter %d is empty", i+1)
		case it == "/":
			if slash || star || i == 0 || kind != paramPositional {
				return nil, errors.New(`"/" must come once, after at least one parameter and before "*"`)
			}
			slash = true
			for j := range sig.Params {
				sig.Params[j].Kind = paramPositionalOnly
			}
			continue
		case it == "*":
			if star {
				return nil, errors.New(`"*" may appear only once`)
			}
			star, kind, bareStar = true, paramKeywordOnly, len(sig.Params)
			continue
		}
		p := Param{Kind: kind}
		name := it
		switch {
		case strings.HasPrefix(it, "**"):
			p.Kind, name = paramVarKeyword, it[2:]
		case strings.HasPrefix(it, "*"):
			if star {
				return nil, errors.New(`"*" may appear only once`)
			}
			p.Kind, name, star, kind = paramVarPositional, it[1:], true, paramKeywordOnly
		}
		name, def, hasDef := cutTop(name, '=')
		name, ann, hasAnn := cutTop(name, ':')
		name = strings.TrimSpace(name)
		if !isIdentifier(name) || slices.Contains(pythonKeywords, name) {
			return nil, fmt.Errorf("parameter %d: %q is not a parameter name (an ASCII Python identifier, not a keyword)", i+1, name)
		}
		if seen[name] {
			return nil, fmt.Errorf("parameter %q appears twice", name)
		}
		seen[name] = true
		p.Name = name
		if hasAnn {
			p.Annotation = strings.TrimSpace(ann)
			if err := checkExpr(p.Annotation, "the annotation of "+name); err != nil {
				return nil, err
			}
		}
		if hasDef {
			if p.Kind == paramVarPositional || p.Kind == paramVarKeyword {
				return nil, fmt.Errorf("%s: a variadic parameter takes no default", name)
			}
			p.Default, p.HasDefault = strings.TrimSpace(def), true
			if err := checkExpr(p.Default, "the default of "+name); err != nil {
				return nil, err
			}
		}
		if len(sig.Params) > 0 && sig.Params[len(sig.Params)-1].Kind == paramVarKeyword {
			return nil, errors.New(`"**" must be the last parameter`)
		}
		if p.Kind == paramPositional {
			if sawDefault && !p.HasDefault {
				return nil, fmt.Errorf("parameter %q has no default but follows one that has", name)
			}
			sawDefault = sawDefault || p.HasDefault
		}
		sig.Params = append(sig.Params, p)
	}
	if slash {
		// Positional-only parameters follow the same rule of defaults.
		sawDefault = false
		for _, p := range sig.Params {
			if p.Kind != paramPositionalOnly && p.Kind != paramPositional {
				break
			}
			if sawDefault && !p.HasDefault {
				return nil, fmt.Errorf("parameter %q has no default but follows one that has", p.Name)
			}
			sawDefault = sawDefault || p.HasDefault
		}
	}
	if bareStar >= 0 && (bareStar == len(sig.Params) || sig.Params[bareStar].Kind != paramKeywordOnly) {
		return nil, errors.New(`a bare "*" must be followed by a keyword-only parameter`)
	}
	return sig, nil
}

// scanTo returns the index in s, from i on, of the first byte of stop
// outside brackets and string literals.
func scanTo(s string, i int, stop string) (int, error) {
	var stack []byte
	for ; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '\'' || ch == '"':
			j := i + 1
			for ; j < len(s) && s[j] != ch; j++ {
				if s[j] == '\\' {
					j++
				}
			}
			if j >= len(s) {
				return 0, errors.New("a string literal is not closed")
			}
			i = j
		case ch == '(' || ch == '[' || ch == '{':
			stack = append(stack, map[byte]byte{'(': ')', '[': ']', '{': '}'}[ch])
		case len(stack) == 0 && strings.IndexByte(stop, ch) >= 0:
			return i, nil
		case ch == ')' || ch == ']' || ch == '}':
			if len(stack) == 0 || stack[len(stack)-1] != ch {
				return 0, fmt.Errorf("unbalanced %q", ch)
			}
			stack = stack[:len(stack)-1]
		}
	}
	return 0, fmt.Errorf("expected %q", stop)
}

// splitTop splits s at the sep bytes outside brackets and strings.
func splitTop(s string, sep byte) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var parts []string
	for {
		i, err := scanTo(s+string(sep), 0, string(sep))
		if err != nil {
			return nil, err
		}
		parts = append(parts, s[:min(i, len(s))])
		if i >= len(s) {
			return parts, nil
		}
		s = s[i+1:]
	}
}

// cutTop cuts s at the first sep outside brackets and strings (for '=',
// not one of ==, <=, >=, !=).
func cutTop(s string, sep byte) (before, after string, found bool) {
	var stack int
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '\'' || ch == '"':
			for i++; i < len(s) && s[i] != ch; i++ {
				if s[i] == '\\' {
					i++
				}
			}
		case ch == '(' || ch == '[' || ch == '{':
			stack++
		case ch == ')' || ch == ']' || ch == '}':
			stack--
		case stack == 0 && ch == sep:
			if sep == '=' && (i+1 < len(s) && s[i+1] == '=' || i > 0 && strings.IndexByte("=<>!", s[i-1]) >= 0) {
				continue
			}
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// checkExpr checks an annotation's or a default's text: not empty, and
// balanced.
func checkExpr(s, what string) error {
	if s == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if _, err := splitTop(s, 0); err != nil {
		return fmt.Errorf("%s: %v", what, err)
	}
	return nil
}

// bindError checks a call's arguments (nargs positional ones, and the
// keyword ones by name, in order) against sig as Python's
// inspect.Signature.bind does, in the same order and words; "" when they
// fit.
func (sig *Signature) bindError(nargs int, kwargs []string) string {
	kw := make(map[string]bool, len(kwargs))
	for _, k := range kwargs {
		kw[k] = true
	}
	params := sig.Params
	i := 0
	var rest []Param
	// Positional arguments, and the parameters they bind.
	for a := 0; ; a++ {
		if a >= nargs {
			if i >= len(params) {
				break
			}
			p := params[i]
			i++
			if p.Kind == paramVarPositional {
				break
			}
			if kw[p.Name] {
				if p.Kind == paramPositionalOnly {
					return fmt.Sprintf("'%s' parameter is positional only, but was passed as a keyword", p.Name)
				}
				rest = []Param{p}
				break
			}
			if p.Kind == paramVarKeyword || p.HasDefault {
				rest = []Param{p}
				break
			}
			return fmt.Sprintf("missing a required argument: '%s'", p.Name)
		}
		if i >= len(params) {
			return "too many positional arguments"
		}
		p := params[i]
		i++
		if p.Kind == paramVarKeyword || p.Kind == paramKeywordOnly {
			return "too many positional arguments"
		}
		if p.Kind == paramVarPositional {
			break
		}
		if kw[p.Name] && p.Kind != paramPositionalOnly {
			return fmt.Sprintf("multiple values for argument '%s'", p.Name)
		}
	}
	// Keyword arguments, and the parameters left.
	varKw := false
	for _, p := range append(rest, params[i:]...) {
		switch {
		case p.Kind == paramVarKeyword:
			varKw = true
		case p.Kind == paramVarPositional:
		case !kw[p.Name]:
			if !p.HasDefault {
				return fmt.Sprintf("missing a required argument: '%s'", p.Name)
			}
		case p.Kind == paramPositionalOnly:
			return fmt.Sprintf("'%s' parameter is positional only, but was passed as a keyword", p.Name)
		default:
			delete(kw, p.Name)
		}
	}
	if len(kw) > 0 && !varKw {
		for _, k := range kwargs {
			if kw[k] {
				return fmt.Sprintf("got an unexpected keyword argument '%s'", k)
			}
		}
	}
	return ""
}

// toolSignature returns the signature that governs a Tool in the sandbox:
// its Signature parsed, or one made from its Parameters; nil when it has
// neither.
func (t *Tool) signature() (*Signature, error) {
	if t.Signature != "" {
		sig, err := ParseSignature(t.Signature)
		if err != nil {
			return nil, fmt.Errorf("signature: %v", err)
		}
		if len(t.Parameters) > 0 {
			if _, err := schemaSignature(t.Parameters); err != nil {
				return nil, fmt.Errorf("parameters: %v", err)
			}
		}
		return sig, nil
	}
	if len(t.Parameters) > 0 {
		sig, err := schemaSignature(t.Parameters)
		if err != nil {
			return nil, fmt.Errorf("parameters: %v", err)
		}
		return sig, nil
	}
	return nil, nil
}

// schemaSignature makes a signature from a JSON Schema of type object:
// its properties in order, required ones first, each other with its
// "default" (a JSON scalar) or None.
func schemaSignature(raw json.RawMessage) (*Signature, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, errors.New("a JSON Schema must be an object")
	}
	if t, ok := top["type"]; ok && string(bytes.TrimSpace(t)) != `"object"` {
		return nil, errors.New(`the schema's "type" must be "object"`)
	}
	var required []string
	if r, ok := top["required"]; ok {
		if err := json.Unmarshal(r, &required); err != nil {
			return nil, errors.New(`"required" must be an array of strings`)
		}
	}
	names, props, err := orderedObject(top["properties"], maxParameters)
	if err != nil {
		return nil, fmt.Errorf(`"properties": %v`, err)
	}
	if len(names) > maxParameters {
		return nil, fmt.Errorf("%d properties; at most %d are allowed", len(names), maxParameters)
	}
	for _, r := range required {
		if !slices.Contains(names, r) {
			return nil, fmt.Errorf("%q is required but not among the properties", r)
		}
	}
	sig := &Signature{}
	var optional []Param
	for i, name := range names {
		if !isIdentifier(name) || slices.Contains(pythonKeywords, name) {
			return nil, fmt.Errorf("property %q is not a parameter name (an ASCII Python identifier, not a keyword)", name)
		}
		var prop struct {
			Type    json.RawMessage `json:"type"`
			Default json.RawMessage `json:"default"`
		}
		if err := json.Unmarshal(props[i], &prop); err != nil {
			return nil, fmt.Errorf("property %q must be an object", name)
		}
		p := Param{Name: name, Kind: paramPositional, Annotation: schemaAnnotation(prop.Type)}
		if slices.Contains(required, name) {
			sig.Params = append(sig.Params, p)
			continue
		}
		p.HasDefault, p.Default = true, "None"
		if lit, ok := pythonLiteral(prop.Default); ok {
			p.Default = lit
		}
		optional = append(optional, p)
	}
	sig.Params = append(sig.Params, optional...)
	return sig, nil
}

// orderedObject returns the keys of a JSON object in order, and their
// values; nothing for an absent one. With max > 0 it stops, with an
// error, at the key after the first max. Its cost is linear in the
// object's size: the object may be a job's call arguments (MaxCall bytes,
// some 150,000 keys).
func orderedObject(raw json.RawMessage, max int) ([]string, []json.RawMessage, error) {
	if len(raw) == 0 {
		return nil, nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, errors.New("must be an object")
	}
	var names []string
	var vals []json.RawMessage
	seen := map[string]struct{}{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, err
		}
		k := tok.(string)
		if _, dup := seen[k]; dup {
			return nil, nil, fmt.Errorf("%q appears twice", k)
		}
		if max > 0 && len(names) == max {
			return nil, nil, fmt.Errorf("more than %d keys; at most %d are allowed", max, max)
		}
		seen[k] = struct{}{}
		names = append(names, k)
		vals = append(vals, v)
	}
	return names, vals, nil
}

// schemaTypes maps JSON Schema types to Python annotations.
var schemaTypes = map[string]string{"string": "str", "integer": "int", "number": "float", "boolean": "bool",
	"array": "list", "object": "dict", "null": "None"}

// schemaAnnotation is the Python annotation of a JSON Schema "type" (a
// name or a list of names); empty when there is none.
func schemaAnnotation(raw json.RawMessage) string {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return schemaTypes[one]
	}
	var many []string
	if json.Unmarshal(raw, &many) != nil {
		return ""
	}
	var out []string
	for _, t := range many {
		if a := schemaTypes[t]; a != "" {
			out = append(out, a)
		}
	}
	return strings.Join(out, " | ")
}

// pythonLiteral writes a JSON scalar as a Python literal.
func pythonLiteral(raw json.RawMessage) (string, bool) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if len(raw) == 0 || dec.Decode(&v) != nil {
		return "", false
	}
	switch v := v.(type) {
	case nil:
		return "None", true
	case bool:
		if v {
			return "True", true
		}
		return "False", true
	case json.Number:
		return v.String(), true
	case string:
		return pythonString(v), true
	}
	return "", false
}

// pythonString quotes s as a Python string literal of printable ASCII.
func pythonString(s string) string {
	var b strings.Builder
	b.WriteByte('\'')
	for _, r := range s {
		switch {
		case r == '\\' || r == '\'':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r >= 0x20 && r < 0x7f:
			b.WriteRune(r)
		case r <= 0xff:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// Schema returns the tool's parameters as a JSON Schema of type object,
// for a model's tool list: Parameters when set, otherwise one made from
// the Signature (each named parameter a property, typed when its
// annotation is a plain str, int, float, bool, list or dict, possibly
// subscripted; those without a default required). A tool with neither
// takes any object.
func (t *Tool) Schema() (json.RawMessage, error) {
	if len(t.Parameters) > 0 {
		return t.Parameters, nil
	}
	sig, err := t.signature()
	if err != nil {
		return nil, err
	}
	type prop struct {
		Type string `json:"type,omitempty"`
	}
	props := map[string]prop{}
	required := []string{}
	if sig != nil {
		for _, p := range sig.Params {
			if p.Kind == paramVarPositional || p.Kind == paramVarKeyword {
				continue
			}
			base, _, _ := strings.Cut(p.Annotation, "[")
			var typ string
			for k, v := range schemaTypes {
				if v == strings.TrimSpace(base) && k != "null" {
					typ = k
				}
			}
			props[p.Name] = prop{Type: typ}
			if !p.HasDefault {
				required = append(required, p.Name)
			}
		}
	}
	return json.Marshal(map[string]any{"type": "object", "properties": props, "required": required})
}

// checkTools validates a job's Tools and returns their signatures for
// the sandbox, by name.
func checkTools(tools []Tool, functions []string) (map[string]*Signature, *Error) {
	if len(tools) == 0 {
		return nil, nil
	}
	names := slices.Clone(functions)
	sigs := make(map[string]*Signature, len(tools))
	for i := range tools {
		t := &tools[i]
		names = append(names, t.Name)
		if len(t.Doc) > MaxToolDoc || !utf8.ValidString(t.Doc) {
			return nil, requestErrorf("functions: the doc of %q must be valid UTF-8 of at most %d bytes", t.Name, MaxToolDoc)
		}
		sig, err := t.signature()
		if err != nil {
			return nil, requestErrorf("functions: %q: %v", t.Name, err)
		}
		sigs[t.Name] = sig
	}
	if err := checkFunctions(names); err != nil {
		return nil, err
	}
	return sigs, nil
}

// workerTools is what the runner needs of a job's Tools.
func workerTools(tools []Tool, sigs map[string]*Signature) []worker.Tool {
	out := make([]worker.Tool, 0, len(tools))
	for _, t := range tools {
		wt := worker.Tool{Name: t.Name, Doc: t.Doc}
		if sig := sigs[t.Name]; sig != nil {
			b, _ := json.Marshal(sig)
			wt.Signature = b
		}
		out = append(out, wt)
	}
	return out
}

// checkedHost refuses, with a TypeError the job sees, a call whose
// arguments do not fit its tool's signature, before it reaches next: a
// job that bypasses its pynox_host's own check gets no further.
func checkedHost(sigs map[string]*Signature, next worker.HostFunc) worker.HostFunc {
	if len(sigs) == 0 || next == nil {
		return next
	}
	return func(ctx context.Context, c worker.Call) worker.Reply {
		if sig := sigs[c.Function]; sig != nil {
			var args []json.RawMessage
			keys, _, kerr := orderedObject(c.Kwargs, 0)
			if json.Unmarshal(c.Args, &args) != nil || kerr != nil {
				msg := c.Function + "(): the arguments are not a JSON array and object"
				return worker.Reply{Error: &msg, ErrorType: "TypeError"}
			}
			if msg := sig.bindError(len(args), keys); msg != "" {
				msg = c.Function + "(): " + msg
				return worker.Reply{Error: &msg, ErrorType: "TypeError"}
			}
		}
		return next(ctx, c)
	}
}
