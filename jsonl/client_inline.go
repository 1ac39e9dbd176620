package jsonl

// Host calls answered on the reader (Client.SetInlineHost).

// SetInlineHost declares that the host functions of the requests this
// client makes are cheap: each returns at once, without waiting for
// anything (no I/O that can stall, no lock held for long, no other call
// or answer of this client). With on, the client runs each host call on
// the goroutine that read its call event, once that goroutine has handed
// on its turn to read, instead of on a goroutine of its own: starting
// that goroutine woke another thread of the process whenever one of its
// Ps was idle (issue 12), and a cheap call's round trip took about a
// third longer for it.
//
// What a HostFunc that blocks costs then: while it runs, the goroutine
// running it reads nothing. For a client of [StartCmd], any other call
// waiting for its answer reads meanwhile (a HostFunc may even make calls
// of its own through the client); but when none waits, nothing is read
// until the HostFunc returns: the request's other calls (awaited together
// through pynox_host.aio, or made from several threads) wait rather than
// run concurrently, and its ctx does not end when the job does, since the
// result that would end it is not read. For a client of [NewClient],
// whose one goroutine reads for every request, a HostFunc that blocks
// holds up the answers of every request, and one that waits for another
// answer of the same client waits forever. Leave it off (the default)
// for host functions that may block.
//
// A HostFunc that panics still fails only its call, as without on; the
// MaxHostCalls bound is not needed for calls that hold no goroutine of
// their own. SetInlineHost applies to the call events read after it
// returns, and may be called at any time.
func (c *Client) SetInlineHost(on bool) { c.inline.Store(on) }

// startCall answers host call callID with answer: on the reader once it
// has handed on its turn (SetInlineHost), or on a goroutine of its own
// (spawnCall).
func (c *Client) startCall(callID int64, answer func()) {
	if c.inline.Load() {
		c.inlineCall, c.inlineID = answer, callID
		return
	}
	c.spawnCall(callID, answer)
}

// takeInline returns the answer of the host call the line just read
// brought, to run on the reader (SetInlineHost), or nil. The reader
// takes it before it hands on its turn to read: the next reader's line
// may bring another.
func (c *Client) takeInline() func() {
	answer := c.inlineCall
	c.inlineCall = nil
	return answer
}

// runInline runs a host call's answer that takeInline returned, if any.
func runInline(answer func()) {
	if answer != nil {
		answer()
	}
}
