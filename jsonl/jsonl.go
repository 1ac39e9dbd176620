package jsonl

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/pynox/pynox"
	"github.com/pynox/pynox/internal/poolhook"
)

// hooks are the entry points of package pynox that the protocol needs
// beyond its public API (see internal/poolhook).
var hooks = poolhook.Impl.(interface {
	Usable(p *pynox.Pool) error
	Run(p *pynox.Pool, ctx context.Context, job pynox.Job) (*pynox.Result, func(), error)
	Checkout(p *pynox.Pool, ctx context.Context, job pynox.Job, name string, onEnd func(*pynox.Checkout)) (*pynox.Checkout, error)
	Reconfigure(c *pynox.Checkout, job pynox.Job) error
	SetRestore(c *pynox.Checkout, d []byte) error
	Finished(c *pynox.Checkout) error
	Refuse(p *pynox.Pool, job *pynox.Job, session string, e *pynox.Error) *pynox.Result
	Fail(p *pynox.Pool, job *pynox.Job, session, msg string, accepted time.Time) *pynox.Result
	Cancelled(p *pynox.Pool, job *pynox.Job, accepted time.Time) *pynox.Result
	PathProblem(err error, want string) string
	EmptyPath() error
})

// requestErrorf returns a KindRequest error: a request the pool refuses.
func requestErrorf(format string, args ...any) *pynox.Error {
	return &pynox.Error{Kind: pynox.KindRequest, Type: pynox.KindRequest.String(), Message: fmt.Sprintf(format, args...)}
}

// checkID accepts the ids the protocol echoes: absent, a string, or a
// number.
func checkID(id any) *pynox.Error {
	switch id.(type) {
	case nil, string, json.Number:
		return nil
	}
	return requestErrorf("id must be a string or a number")
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// beneath reports whether path is base or lies inside it. Both must be
// clean absolute paths.
func beneath(path, base string) bool {
	if base == "/" {
		return true
	}
	return path == base || strings.HasPrefix(path, base+"/")
}
