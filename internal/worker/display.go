package worker

// Rich outputs: the "display" frames a job writes (pynox_display.display,
// matplotlib figures), checked and kept for the outcome, and passed to a
// DisplayFunc as they come.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Bounds of a turn's rich outputs (runner.py holds the same numbers and
// sends a "dropped" notice instead of an output beyond them).
const (
	// MaxOutputs is how many rich outputs one job or session step keeps.
	MaxOutputs = 64
	// MaxOutputsBytes bounds the data of one turn's outputs together
	// (base64 text for images).
	MaxOutputsBytes = 8 << 20
	// MaxOutputBytes bounds the data of one output.
	MaxOutputBytes = 1 << 20
)

// DisplayMIME lists the MIME types a rich output may have, and whether
// its data is binary (sent as base64) rather than UTF-8 text.
var DisplayMIME = map[string]bool{
	"image/png":        true,
	"image/jpeg":       true,
	"image/svg+xml":    false,
	"text/html":        false,
	"text/markdown":    false,
	"text/plain":       false,
	"application/json": false,
}

// Output is one rich output of a job: its MIME type (one of DisplayMIME)
// and its data, base64 for binary types, UTF-8 text for the others.
type Output struct {
	MIME string `json:"mime"`
	Data string `json:"data"`
}

// DisplayFunc receives a turn's rich outputs as they come, after the
// pool checked them, one call at a time and in order, from a goroutine of
// the turn's own; every call returns before the turn's outcome does.
type DisplayFunc func(out Output)

// displayer passes a turn's outputs to its DisplayFunc. Its queue holds
// every output a turn can keep, so the turn never waits for the callback
// until its end.
type displayer struct {
	ch   chan Output
	done chan struct{}
}

func startDisplayer(fn DisplayFunc) *displayer {
	d := &displayer{ch: make(chan Output, MaxOutputs), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		for out := range d.ch {
			fn(out)
		}
	}()
	return d
}

// pngSignature and jpegSignature start every PNG and JPEG file.
var (
	pngSignature  = []byte("\x89PNG\r\n\x1a\n")
	jpegSignature = []byte("\xff\xd8\xff")
)

// checkOutput checks a display frame's MIME type and data (a JSON string
// as the job wrote it) and returns the data, or why it is refused.
func checkOutput(mime string, raw json.RawMessage) (string, string) {
	binary, ok := DisplayMIME[mime]
	if !ok {
		if len(mime) > 64 {
			mime = mime[:64] + "..."
		}
		return "", fmt.Sprintf("the MIME type %q is not one of the allowed types", mime)
	}
	if len(raw) < 2 || raw[0] != '"' || !utf8.Valid(raw) {
		return "", "its data is not a string of valid UTF-8"
	}
	var data string
	if err := json.Unmarshal(raw, &data); err != nil {
		return "", "its data is not a string of valid UTF-8"
	}
	if len(data) > MaxOutputBytes {
		return "", fmt.Sprintf("its data is %d bytes; the limit is %d", len(data), MaxOutputBytes)
	}
	switch {
	case binary:
		b, err := base64.StdEncoding.Strict().DecodeString(data)
		if err != nil {
			return "", fmt.Sprintf("its %s data is not valid base64", mime)
		}
		sig := pngSignature
		if mime == "image/jpeg" {
			sig = jpegSignature
		}
		if !bytes.HasPrefix(b, sig) {
			return "", fmt.Sprintf("its data is not %s", mime)
		}
	case mime == "application/json":
		if !json.Valid([]byte(data)) {
			return "", "its application/json data is not valid JSON"
		}
	}
	return data, ""
}

// display keeps a display frame's output, within the turn's bounds, and
// passes it on; anything refused or beyond the bounds is counted in
// Outcome.OutputsDropped, never fatal to the job.
func (t *turn) display(m *childMsg) {
	o := t.o
	why := ""
	var data string
	switch {
	case m.Dropped:
		why = fmt.Sprintf("an output was larger than %d bytes, or past the limit of %d outputs and %d bytes", MaxOutputBytes, MaxOutputs, MaxOutputsBytes)
	case len(o.Outputs) >= MaxOutputs:
		why = fmt.Sprintf("more than %d outputs", MaxOutputs)
	default:
		data, why = checkOutput(m.MIME, m.Data)
		if why == "" && t.displayBytes+len(data) > MaxOutputsBytes {
			why = fmt.Sprintf("more than %d bytes of outputs", MaxOutputsBytes)
		}
	}
	if why != "" {
		if o.OutputsDropped == 0 {
			o.DroppedWhy = why
		}
		o.OutputsDropped++
		return
	}
	t.displayBytes += len(data)
	out := Output{MIME: m.MIME, Data: data}
	o.Outputs = append(o.Outputs, out)
	if t.ts.display != nil {
		if t.disp == nil {
			t.disp = startDisplayer(t.ts.display)
		}
		t.disp.ch <- out // never blocks: the queue holds MaxOutputs
	}
}

// endDisplay waits until the DisplayFunc has had every output.
func (t *turn) endDisplay() {
	if t.disp != nil {
		close(t.disp.ch)
		<-t.disp.done
		t.disp = nil
	}
}
