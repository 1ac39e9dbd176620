package main

import (
	"crypto/sha256"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpOwners records which token opened each MCP session of /v1/mcp, as
// the token's SHA-256 digest ("" on a server without tokens), so that
// --max-mcp-sessions-per-token bounds each token's sessions apart.
type mcpOwners struct {
	mu    sync.Mutex
	owner map[string][sha256.Size]byte // session id -> token digest
}

// mcpOwner is the owner key of a request guard has admitted: its token's
// digest, or the zero digest on a server without tokens.
func (s *httpServer) mcpOwner(r *http.Request) [sha256.Size]byte {
	if s.tokens == nil {
		return [sha256.Size]byte{}
	}
	_, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	return sha256.Sum256([]byte(strings.TrimSpace(token)))
}

// add records that owner opened the session id.
func (o *mcpOwners) add(id string, owner [sha256.Size]byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.owner == nil {
		o.owner = map[string][sha256.Size]byte{}
	}
	o.owner[id] = owner
}

// count returns how many of server's live sessions owner opened, and
// forgets the sessions that have ended (so the map holds at most the
// live sessions and those opened since the last count).
func (o *mcpOwners) count(server *mcp.Server, owner [sha256.Size]byte) int {
	live := map[string]bool{}
	for ss := range server.Sessions() {
		live[ss.ID()] = true
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for id, who := range o.owner {
		switch {
		case !live[id]:
			delete(o.owner, id)
		case who == owner:
			n++
		}
	}
	return n
}
