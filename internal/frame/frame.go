// Package frame implements the length-prefixed framing pynox uses on every
// channel between the Go host, its templates and their job children.
//
// A frame is a 4-byte little-endian payload length followed by that many
// bytes of payload (a JSON object). The reader enforces a hard maximum
// frame size before allocating anything, so a peer that writes garbage can
// make a read fail but cannot make the host buffer without bound.
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// HeaderSize is the number of bytes in a frame header.
const HeaderSize = 4

// DefaultMax is the largest payload accepted unless a reader says
// otherwise: room for a 1 MiB line of code plus 1 MB host-function payloads
// after JSON escaping.
const DefaultMax = 8 << 20

// ErrTooLarge reports a frame header announcing more than the reader's
// maximum.
var ErrTooLarge = errors.New("frame: frame exceeds maximum size")

// Append appends payload framed to dst and returns the extended slice.
func Append(dst, payload []byte) []byte {
	var h [HeaderSize]byte
	binary.LittleEndian.PutUint32(h[:], uint32(len(payload)))
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// Reader reads whole frames from an underlying stream.
type Reader struct {
	r   io.Reader
	max int
	hdr [HeaderSize]byte
	buf []byte
}

// NewReader returns a Reader over r that refuses frames larger than max
// bytes (DefaultMax when max <= 0).
func NewReader(r io.Reader, max int) *Reader {
	if max <= 0 {
		max = DefaultMax
	}
	return &Reader{r: r, max: max}
}

// Next returns the next frame's payload. The slice is valid until the next
// call. It returns io.EOF at a clean end of stream (between frames),
// io.ErrUnexpectedEOF for a stream cut inside a frame, and ErrTooLarge for
// an oversized header (after which the stream is out of sync and must be
// abandoned).
func (r *Reader) Next() ([]byte, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(r.hdr[:]))
	if n > r.max {
		return nil, fmt.Errorf("%w: %d bytes (max %d)", ErrTooLarge, n, r.max)
	}
	if cap(r.buf) < n {
		r.buf = make([]byte, n)
	}
	r.buf = r.buf[:n]
	if _, err := io.ReadFull(r.r, r.buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return r.buf, nil
}

// Split parses one frame from the front of b. It returns the payload, the
// remaining bytes, and ok=false when b does not yet hold a whole frame. An
// oversized header yields ErrTooLarge.
func Split(b []byte, max int) (payload, rest []byte, ok bool, err error) {
	if max <= 0 {
		max = DefaultMax
	}
	if len(b) < HeaderSize {
		return nil, b, false, nil
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n > max {
		return nil, b, false, fmt.Errorf("%w: %d bytes (max %d)", ErrTooLarge, n, max)
	}
	if len(b)-HeaderSize < n {
		return nil, b, false, nil
	}
	return b[HeaderSize : HeaderSize+n], b[HeaderSize+n:], true, nil
}
