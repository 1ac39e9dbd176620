package jsonl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/pynox/pynox"
)

// functionDecl is one entry of a request's "functions": a bare name, or
// an object {"name", "doc", "signature", "parameters"} declaring a
// [pynox.Tool].
type functionDecl struct {
	name string
	tool *pynox.Tool
}

// functionDecls is a request's "functions", in order.
type functionDecls []functionDecl

// toolKeys are the keys a function object may hold.
var toolKeys = map[string]bool{"name": true, "doc": true, "signature": true, "parameters": true}

// UnmarshalJSON reads a name or a function object; an object's keys must
// be exactly among name, doc, signature and parameters.
func (d *functionDecl) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, &d.name)
	}
	if len(b) == 0 || b[0] != '{' {
		return errors.New(`functions: each entry must be a name or an object {"name", "doc", "signature", "parameters"}`)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("functions: %v", err)
	}
	for k := range raw {
		if !toolKeys[k] {
			return fmt.Errorf("functions: unknown key %q in a function object; expected name, doc, signature or parameters", k)
		}
	}
	t := &pynox.Tool{Parameters: raw["parameters"]}
	for key, dst := range map[string]*string{"name": &t.Name, "doc": &t.Doc, "signature": &t.Signature} {
		if v, ok := raw[key]; ok {
			if err := json.Unmarshal(v, dst); err != nil {
				return fmt.Errorf("functions: %q of a function object must be a string", key)
			}
		}
	}
	if t.Name == "" {
		return errors.New(`functions: a function object needs "name"`)
	}
	d.tool = t
	return nil
}

// MarshalJSON writes a name, or a function object.
func (d functionDecl) MarshalJSON() ([]byte, error) {
	if d.tool != nil {
		return json.Marshal(d.tool)
	}
	return json.Marshal(d.name)
}

// split returns the bare names (non-nil) and the tools.
func (ds functionDecls) split() ([]string, []pynox.Tool) {
	names := []string{}
	var tools []pynox.Tool
	for _, d := range ds {
		if d.tool != nil {
			tools = append(tools, *d.tool)
		} else {
			names = append(names, d.name)
		}
	}
	return names, tools
}

// declsOf is the "functions" of a job's request line.
func declsOf(names []string, tools []pynox.Tool) functionDecls {
	var ds functionDecls
	for _, n := range names {
		ds = append(ds, functionDecl{name: n})
	}
	for i := range tools {
		ds = append(ds, functionDecl{tool: &tools[i]})
	}
	return ds
}
