package jsonl

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// encoding/json matches object keys to struct fields case-insensitively,
// with Unicode folding ("CODE", "ſession" with a long s), and keeps the
// last of duplicated keys. A front end that vets request lines by exact
// key could then be bypassed: {"code": "ok", "CODE": "evil"} reads one
// way to it and another way to the pool. So before decoding, the pool
// walks the line's tokens once and refuses any key that is not exactly a
// field name of the object it is in, and any key that appears twice in
// one object (also in free-form objects such as env or a reply's result).
// encoding/json/v2, which can decode exactly, is still behind
// GOEXPERIMENT in Go 1.26.

// keySchema describes the keys an object may hold: fields maps each
// allowed key to the schema of its value; a nil fields map allows any key
// (a map, or free-form JSON), whose values are free-form too.
type keySchema struct {
	what   string // "a request", "a reply": for messages
	fields map[string]*keySchema
	elem   *keySchema // with nil fields: the schema of every value (a map of structs); nil means free-form
	// strs says the array's elements or the object's values are strings
	// (args, allow_read, env): a null among them is refused, since
	// encoding/json would decode it as "", a value the client never
	// wrote.
	strs bool
}

var freeSchema = &keySchema{}

// requestSchema is the exact key set of a request line.
var requestSchema = schemaOf(reflect.TypeFor[request](), "json", "a request")

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// schemaOf derives a schema from a struct type's tags (tag is "json" or
// "toml"), as encoding/json reads them: embedded structs promote their
// fields. A map of structs takes any key and checks its values; any other
// type, or one that decodes itself, takes free-form values.
func schemaOf(t reflect.Type, tag, what string) *keySchema {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler) {
		return freeSchema
	}
	switch t.Kind() {
	case reflect.Map, reflect.Slice, reflect.Array:
		if isPlainString(t.Elem()) {
			return &keySchema{what: what, strs: true}
		}
	}
	switch t.Kind() {
	case reflect.Map:
		if e := schemaOf(t.Elem(), tag, what); e != freeSchema {
			return &keySchema{what: what, elem: e}
		}
		return freeSchema
	case reflect.Slice, reflect.Array:
		// keyScan checks each element against the array's schema: an
		// array of structs ("mounts") takes exactly their keys, else
		// encoding/json would take "HOST" or "Mode" for "host" or "mode"
		// and keep the last of the two.
		return schemaOf(t.Elem(), tag, what)
	case reflect.Struct:
	default:
		return freeSchema
	}
	s := &keySchema{what: what, fields: map[string]*keySchema{}}
	var add func(t reflect.Type)
	add = func(t reflect.Type) {
		for f := range t.Fields() {
			tv := f.Tag.Get(tag)
			if tv == "-" {
				continue
			}
			name, _, _ := strings.Cut(tv, ",")
			if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
				add(f.Type)
				continue
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			s.fields[name] = schemaOf(f.Type, tag, "\""+name+"\"")
		}
	}
	add(t)
	return s
}

// isPlainString reports whether t is a string type that decodes as one
// (no decoder of its own).
func isPlainString(t reflect.Type) bool {
	return t.Kind() == reflect.String && !reflect.PointerTo(t).Implements(jsonUnmarshaler) && !reflect.PointerTo(t).Implements(textUnmarshaler)
}

// child is the schema of key's value, or nil when s does not allow key.
func (s *keySchema) child(key string) *keySchema {
	if s.fields == nil {
		if s.elem != nil {
			return s.elem
		}
		return freeSchema
	}
	return s.fields[key]
}

// names lists the schema's keys, sorted.
func (s *keySchema) names() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for k := range s.fields {
			if !yield(k) {
				return
			}
		}
	})
}

// keyError is a key the exact decoding refuses.
type keyError struct {
	segs []string // where the object is: keys, and "[]" for array elements
	key  string
	dup  bool
	null bool // a null where a string belongs: key's value, or an array element when key is ""
	s    *keySchema
}

// path names the object the key is in: "" for the request itself, else
// e.g. "reply", "env", "reply.result[].b".
func (e *keyError) path() string {
	var b strings.Builder
	for i, s := range e.segs {
		if i > 0 && s != "[]" {
			b.WriteByte('.')
		}
		b.WriteString(s)
	}
	return b.String()
}

func (e *keyError) Error() string {
	where := ""
	if p := e.path(); p != "" {
		where = p + ": "
	}
	if e.dup {
		return fmt.Sprintf("%skey %q appears twice; each key may appear once in an object", where, e.key)
	}
	if e.null {
		if e.key == "" {
			return fmt.Sprintf("%sexpected an array of strings, got one holding null", where)
		}
		return fmt.Sprintf("%s%q: expected a string, got null", where, e.key)
	}
	msg := fmt.Sprintf("%sunknown field %q", where, e.key)
	for _, n := range e.s.names() {
		if strings.EqualFold(n, e.key) {
			return msg + fmt.Sprintf(": field names are exact and case-sensitive; did you mean %q?", n)
		}
	}
	return msg + fmt.Sprintf("; the fields of %s are %s", e.s.what, strings.Join(e.s.names(), ", "))
}

// errKeyScanStop ends a key check early, on input that is not JSON or is
// nested deeper than encoding/json accepts: the decoder that follows
// reports it.
var errKeyScanStop = errors.New("stop")

// maxKeyScanDepth is encoding/json's own nesting limit.
const maxKeyScanDepth = 10000

// checkKeys scans the first JSON value of line and returns a *keyError for
// the first key that is not exactly one of its object's fields, or that
// repeats within its object. It returns nil for a line without such a key,
// and for a line that is not valid JSON, which the decoder that follows
// refuses with its own message. Keys with escapes or non-ASCII bytes are
// compared as encoding/json decodes them.
func checkKeys(line []byte, top *keySchema) error {
	return checkKeysTop(line, top, nil)
}

// topValues are the raw values of a request's top-level "id", "session"
// and "cancel" (nil when absent; keys compared as encoding/json decodes
// them), as the key scan passes them: decodeRequest's checks of these
// read them there instead of decoding the line once more. done says the
// scan reached the end of the top-level object.
type topValues struct {
	id, session, cancel []byte
	done                bool
}

// get returns the raw value of key ("id", "session" or "cancel").
func (tv *topValues) get(key string) ([]byte, bool) {
	var v []byte
	switch key {
	case "id":
		v = tv.id
	case "session":
		v = tv.session
	case "cancel":
		v = tv.cancel
	}
	return v, v != nil
}

// checkKeysTop is checkKeys that also fills tv (when not nil) with the
// top-level values it passes.
func checkKeysTop(line []byte, top *keySchema, tv *topValues) error {
	k := keyScan{b: line, top: tv}
	k.ws()
	if k.i >= len(k.b) || k.b[k.i] != '{' {
		return nil // not an object: the decoder says so
	}
	if err := k.value(top, 0); err != errKeyScanStop {
		return err
	}
	return nil
}

// keyScan is a minimal JSON scanner: it reads keys and skips everything
// else, leaving validation to encoding/json.
type keyScan struct {
	b   []byte
	i   int
	top *topValues // see checkKeysTop
}

// null reports whether the value at k.i (after whitespace) is null.
func (k *keyScan) null() bool {
	k.ws()
	rest := k.b[k.i:]
	return bytes.HasPrefix(rest, []byte("null")) && (len(rest) == 4 || strings.IndexByte(",]} \t\r\n", rest[4]) >= 0)
}

func (k *keyScan) ws() {
	for k.i < len(k.b) {
		switch k.b[k.i] {
		case ' ', '\t', '\r', '\n':
			k.i++
		default:
			return
		}
	}
}

// str scans a string at k.i and returns its raw bytes, quotes excluded,
// and whether it holds escapes or non-ASCII bytes.
func (k *keyScan) str() (raw []byte, special bool, ok bool) {
	start := k.i + 1
	for j := start; j < len(k.b); j++ {
		switch c := k.b[j]; {
		case c == '"':
			k.i = j + 1
			return k.b[start:j], special, true
		case c == '\\':
			special = true
			j++
		case c >= 0x80:
			special = true
		}
	}
	return nil, false, false
}

func (k *keyScan) value(s *keySchema, depth int) error {
	k.ws()
	if k.i >= len(k.b) || depth > maxKeyScanDepth {
		return errKeyScanStop
	}
	switch k.b[k.i] {
	case '{':
		return k.object(s, depth+1)
	case '[':
		return k.array(s, depth+1)
	case '"':
		if _, _, ok := k.str(); !ok {
			return errKeyScanStop
		}
		return nil
	}
	// A number or a literal: up to the next delimiter.
	j := k.i
	for j < len(k.b) && strings.IndexByte(",]} \t\r\n", k.b[j]) < 0 {
		j++
	}
	if j == k.i {
		return errKeyScanStop
	}
	k.i = j
	return nil
}

func (k *keyScan) array(s *keySchema, depth int) error {
	k.i++ // [
	k.ws()
	if k.i < len(k.b) && k.b[k.i] == ']' {
		k.i++
		return nil
	}
	for {
		if s.strs && k.null() {
			return &keyError{null: true}
		}
		if err := k.value(s, depth); err != nil {
			if ke, ok := err.(*keyError); ok {
				ke.segs = append([]string{"[]"}, ke.segs...)
			}
			return err
		}
		k.ws()
		if k.i >= len(k.b) {
			return errKeyScanStop
		}
		switch k.b[k.i] {
		case ',':
			k.i++
		case ']':
			k.i++
			return nil
		default:
			return errKeyScanStop
		}
	}
}

func (k *keyScan) object(s *keySchema, depth int) error {
	k.i++ // {
	k.ws()
	if k.i < len(k.b) && k.b[k.i] == '}' {
		k.i++
		return nil
	}
	// The keys so far: a short list (most objects are small), then a map.
	var buf [16][]byte
	few := buf[:0]
	var many map[string]struct{}
	for {
		k.ws()
		if k.i >= len(k.b) || k.b[k.i] != '"' {
			return errKeyScanStop
		}
		key, special, ok := k.str()
		if !ok {
			return errKeyScanStop
		}
		if special {
			// As encoding/json reads it: escapes decoded, invalid UTF-8
			// replaced by U+FFFD.
			var dec string
			if json.Unmarshal(k.b[k.i-len(key)-2:k.i], &dec) != nil {
				return errKeyScanStop
			}
			key = []byte(dec)
		}
		dup := false
		if many != nil {
			_, dup = many[string(key)]
			many[string(key)] = struct{}{}
		} else {
			for _, f := range few {
				dup = dup || bytes.Equal(f, key)
			}
			few = append(few, key)
			if len(few) == cap(buf) {
				many = make(map[string]struct{}, 2*len(few))
				for _, f := range few {
					many[string(f)] = struct{}{}
				}
			}
		}
		if dup {
			return &keyError{key: string(key), dup: true}
		}
		val := s.child(string(key))
		if val == nil {
			return &keyError{key: string(key), s: s}
		}
		k.ws()
		if k.i >= len(k.b) || k.b[k.i] != ':' {
			return errKeyScanStop
		}
		k.i++
		k.ws()
		start := k.i
		if s.strs && k.null() {
			return &keyError{key: string(key), null: true}
		}
		if err := k.value(val, depth); err != nil {
			if ke, ok := err.(*keyError); ok {
				ke.segs = append([]string{string(key)}, ke.segs...)
			}
			return err
		}
		if depth == 1 && k.top != nil {
			switch string(key) {
			case "id":
				k.top.id = k.b[start:k.i]
			case "session":
				k.top.session = k.b[start:k.i]
			case "cancel":
				k.top.cancel = k.b[start:k.i]
			}
		}
		k.ws()
		if k.i >= len(k.b) {
			return errKeyScanStop
		}
		switch k.b[k.i] {
		case ',':
			k.i++
		case '}':
			k.i++
			if depth == 1 && k.top != nil {
				k.top.done = true
			}
			return nil
		default:
			return errKeyScanStop
		}
	}
}
