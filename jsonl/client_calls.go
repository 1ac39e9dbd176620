package jsonl

import "fmt"

// MaxHostCalls bounds the host calls a [Client] answers at once on one
// connection, as the server's --max-inflight-per-conn (default 64) bounds
// a connection's requests: each call being answered holds a goroutine
// (and its HostFunc's resources), and a hostile or broken server could
// otherwise send call events without end. A call event beyond the bound
// is answered at once with an error reply (the job sees a HostError
// naming the bound), written by the client's reader itself: while that
// write waits for a server that does not read, the client reads nothing
// more from it.
const MaxHostCalls = 64

// spawnCall runs answer, the answer to host call callID, on a goroutine
// of its own when fewer than MaxHostCalls are being answered; otherwise
// it refuses the call with an error reply, without a goroutine.
func (c *Client) spawnCall(callID int64, answer func()) {
	select {
	case c.calls <- struct{}{}:
		go func() {
			defer func() { <-c.calls }()
			answer()
		}()
	default:
		c.reply(callID, nil, fmt.Sprintf("the client answers at most %d host calls of a connection at once (jsonl.MaxHostCalls); this one was refused", MaxHostCalls))
	}
}
