package jsonl

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// The reply line a client writes for a host call's result, read without
// decoding the whole request type.

// Every reply line that decodeReply takes begins and ends so, as
// jsonl.Client writes one (Client.replyResult).
var (
	replyHead = []byte(`{"reply":{"call_id":`)
	replyMid  = []byte(`,"result":`)
	replyTail = []byte(`}}`)
)

// decodeReply reads a request line of exactly the form
// {"reply":{"call_id":N,"result":R}} — no space outside R, N a plain
// decimal integer, R a JSON value with no space around it — as
// decodeRequest would, and reports whether it could. Any other line,
// and one whose R is not valid JSON or repeats a key in an object,
// is left to decodeRequest, which accepts or refuses it with its own
// messages. decodeRequest decodes a line into the whole request type
// (every field of pynox.Job) through reflection, after checking its
// keys; that was about a tenth of `pynox pool`'s CPU per host call
// (issue 12), for a line that carries two fields.
func decodeReply(line []byte) (request, bool) {
	if !bytes.HasPrefix(line, replyHead) || !bytes.HasSuffix(line, replyTail) {
		return request{}, false
	}
	rest := line[len(replyHead) : len(line)-len(replyTail)]
	i := bytes.Index(rest, replyMid)
	if i <= 0 {
		return request{}, false
	}
	num, result := rest[:i], rest[i+len(replyMid):]
	// N: digits, without a leading zero (JSON's own rule), that fit an
	// int64 (encoding/json refuses more).
	for _, c := range num {
		if c < '0' || c > '9' {
			return request{}, false
		}
	}
	if len(num) > 1 && num[0] == '0' {
		return request{}, false
	}
	id, err := strconv.ParseInt(string(num), 10, 64)
	if err != nil {
		return request{}, false
	}
	// R: one valid JSON value, without space around it (the decoder's
	// RawMessage would not hold the space), whose objects repeat no key.
	if len(result) == 0 || isJSONSpace(result[0]) || isJSONSpace(result[len(result)-1]) || !json.Valid(result) {
		return request{}, false
	}
	if checkKeys(line, requestSchema) != nil {
		return request{}, false
	}
	return request{Reply: &replyReq{CallID: &id, Result: json.RawMessage(bytes.Clone(result))}}, true
}

// isJSONSpace reports whether c is JSON whitespace (jsonSpace).
func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }
