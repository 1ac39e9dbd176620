package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

func header(n uint32) []byte {
	var h [HeaderSize]byte
	binary.LittleEndian.PutUint32(h[:], n)
	return h[:]
}

func TestAppend(t *testing.T) {
	require.Equal(t, []byte{3, 0, 0, 0, 'a', 'b', 'c'}, Append(nil, []byte("abc")))
	require.Equal(t, []byte{0, 0, 0, 0}, Append(nil, nil))
	// Append extends dst in place.
	b := Append([]byte("x"), []byte("yz"))
	require.Equal(t, []byte{'x', 2, 0, 0, 0, 'y', 'z'}, b)
	// A length with every byte set shows the byte order.
	payload := make([]byte, 0x010203)
	require.Equal(t, []byte{0x03, 0x02, 0x01, 0x00}, Append(nil, payload)[:HeaderSize])
}

func TestRoundTrip(t *testing.T) {
	payloads := [][]byte{
		[]byte(`{"t":"hello","v":1}`),
		{},
		[]byte("x"),
		bytes.Repeat([]byte("é"), 40000),
		make([]byte, 1<<16), // NUL bytes
		[]byte(`{"t":"done"}`),
	}
	var stream []byte
	for _, p := range payloads {
		stream = Append(stream, p)
	}
	// Whole stream, one byte at a time, and in odd-sized pieces: the
	// reader must not depend on how the stream is cut.
	readers := map[string]io.Reader{
		"whole":    bytes.NewReader(stream),
		"one byte": iotest.OneByteReader(bytes.NewReader(stream)),
		"half":     iotest.HalfReader(bytes.NewReader(stream)),
	}
	for name, src := range readers {
		t.Run(name, func(t *testing.T) {
			r := NewReader(src, 0)
			for i, want := range payloads {
				got, err := r.Next()
				require.NoError(t, err, "frame %d", i)
				require.Equal(t, len(want), len(got), "frame %d", i)
				require.True(t, bytes.Equal(want, got), "frame %d", i)
			}
			_, err := r.Next()
			require.Equal(t, io.EOF, err, "a clean end between frames is io.EOF")
			_, err = r.Next()
			require.Equal(t, io.EOF, err, "and stays so")
		})
	}
	t.Run("split", func(t *testing.T) {
		rest := stream
		for i, want := range payloads {
			got, next, ok, err := Split(rest, 0)
			require.NoError(t, err)
			require.True(t, ok, "frame %d", i)
			require.True(t, bytes.Equal(want, got), "frame %d", i)
			rest = next
		}
		require.Empty(t, rest)
	})
}

func TestReaderPayloadValidUntilNext(t *testing.T) {
	r := NewReader(bytes.NewReader(Append(Append(nil, []byte("first")), []byte("2nd"))), 0)
	a, err := r.Next()
	require.NoError(t, err)
	require.Equal(t, "first", string(a))
	kept := append([]byte(nil), a...)
	b, err := r.Next()
	require.NoError(t, err)
	require.Equal(t, "2nd", string(b))
	require.Equal(t, "first", string(kept))
}

func TestReaderEOF(t *testing.T) {
	full := Append(nil, []byte("payload"))
	tests := []struct {
		name   string
		stream []byte
		frames int
		want   error
	}{
		{"empty stream", nil, 0, io.EOF},
		{"after a whole frame", full, 1, io.EOF},
		{"inside the header", full[:2], 0, io.ErrUnexpectedEOF},
		{"after the header", full[:HeaderSize], 0, io.ErrUnexpectedEOF},
		{"inside the payload", full[:HeaderSize+3], 0, io.ErrUnexpectedEOF},
		{"second frame cut", append(append([]byte(nil), full...), full[:5]...), 1, io.ErrUnexpectedEOF},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(tc.stream), 0)
			for i := 0; i < tc.frames; i++ {
				_, err := r.Next()
				require.NoError(t, err)
			}
			p, err := r.Next()
			require.Nil(t, p)
			require.Equal(t, tc.want, err)
		})
	}
	t.Run("read error passes through", func(t *testing.T) {
		boom := errors.New("boom")
		r := NewReader(iotest.ErrReader(boom), 0)
		_, err := r.Next()
		require.ErrorIs(t, err, boom)
		r = NewReader(io.MultiReader(bytes.NewReader(full[:HeaderSize+1]), iotest.ErrReader(boom)), 0)
		_, err = r.Next()
		require.ErrorIs(t, err, boom)
	})
}

// countingReader counts the bytes handed out.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += n
	return n, err
}

func TestOversizeHeader(t *testing.T) {
	for _, tc := range []struct {
		name string
		max  int
		n    uint32
	}{
		{"one over a small max", 16, 17},
		{"largest header", 16, 0xffffffff},
		{"sign bit", 1 << 20, 0x80000000},
		{"over the default", 0, DefaultMax + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &countingReader{r: bytes.NewReader(append(header(tc.n), bytes.Repeat([]byte("A"), 64)...))}
			r := NewReader(src, tc.max)
			p, err := r.Next()
			require.Nil(t, p)
			require.ErrorIs(t, err, ErrTooLarge)
			require.Equal(t, HeaderSize, src.n, "nothing beyond the header is read")
			require.Zero(t, cap(r.buf), "nothing is allocated for an oversized frame")

			p, rest, ok, err := Split(append(header(tc.n), 'A'), tc.max)
			require.ErrorIs(t, err, ErrTooLarge)
			require.False(t, ok)
			require.Nil(t, p)
			require.Len(t, rest, HeaderSize+1, "Split leaves the input untouched")
		})
	}
	t.Run("exactly max", func(t *testing.T) {
		r := NewReader(bytes.NewReader(Append(nil, bytes.Repeat([]byte("m"), 16))), 16)
		p, err := r.Next()
		require.NoError(t, err)
		require.Len(t, p, 16)
		p, _, ok, err := Split(Append(nil, bytes.Repeat([]byte("m"), 16)), 16)
		require.NoError(t, err)
		require.True(t, ok)
		require.Len(t, p, 16)
	})
	t.Run("default max", func(t *testing.T) {
		require.Equal(t, DefaultMax, NewReader(nil, 0).max)
		require.Equal(t, DefaultMax, NewReader(nil, -5).max)
		// A header of exactly DefaultMax is accepted by Split (it then
		// waits for the payload)...
		_, _, ok, err := Split(header(DefaultMax), -1)
		require.NoError(t, err)
		require.False(t, ok)
		// ...and one byte more is refused.
		_, _, _, err = Split(header(DefaultMax+1), -1)
		require.ErrorIs(t, err, ErrTooLarge)
	})
}

func TestSplitPartial(t *testing.T) {
	full := Append(nil, []byte("hello"))
	for i := 0; i < len(full); i++ {
		p, rest, ok, err := Split(full[:i], 0)
		require.NoError(t, err, "prefix %d", i)
		require.False(t, ok, "prefix %d", i)
		require.Nil(t, p)
		require.Equal(t, full[:i], rest, "prefix %d: input returned unchanged", i)
	}
	p, rest, ok, err := Split(append(append([]byte(nil), full...), 9, 9), 0)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "hello", string(p))
	require.Equal(t, []byte{9, 9}, rest)
}

// fuzzMax is the frame limit the fuzzers use: small, so that most random
// headers are oversized and the limit is exercised constantly.
const fuzzMax = 4096

func fuzzSeeds(f *testing.F) {
	f.Add([]byte{})
	f.Add(Append(nil, []byte(`{"t":"done","exit":0}`)))
	f.Add(Append(Append(nil, []byte("a")), nil))
	f.Add(header(0xffffffff))
	f.Add(header(fuzzMax))
	f.Add(append(header(fuzzMax+1), 'x'))
	f.Add(Append(nil, bytes.Repeat([]byte("z"), fuzzMax))[:100])
	f.Add([]byte{1, 0})
	f.Add([]byte("\n{\"id\": 1}\n"))
}

// FuzzReader feeds arbitrary streams to a Reader: it must never panic,
// never return a payload (or hold a buffer) larger than its maximum, and
// must end with exactly one of its documented errors. The frames it
// returns re-encode to a prefix of the stream.
func FuzzReader(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, stream []byte) {
		src := &countingReader{r: iotest.OneByteReader(bytes.NewReader(stream))}
		r := NewReader(src, fuzzMax)
		var again []byte
		for {
			p, err := r.Next()
			if cap(r.buf) > fuzzMax {
				t.Fatalf("reader holds a %d-byte buffer; max %d", cap(r.buf), fuzzMax)
			}
			if err != nil {
				require.Nil(t, p)
				switch {
				case err == io.EOF:
					require.True(t, bytes.Equal(stream, again), "EOF only at a frame boundary at the end")
				case err == io.ErrUnexpectedEOF:
					require.Equal(t, len(stream), src.n)
					require.Less(t, len(again), len(stream))
				case errors.Is(err, ErrTooLarge):
					require.Equal(t, len(again)+HeaderSize, src.n, "no byte beyond the bad header is read")
					n := binary.LittleEndian.Uint32(stream[len(again):])
					require.Greater(t, uint64(n), uint64(fuzzMax))
				default:
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			require.LessOrEqual(t, len(p), fuzzMax)
			again = Append(again, p)
			require.True(t, bytes.Equal(stream[:len(again)], again), "frames re-encode to the stream")
		}
	})
}

// FuzzSplit checks Split against Reader on the same bytes: the same
// frames, the same outcome at the end, no payload over the maximum, and
// nothing allocated (Split only slices its input).
func FuzzSplit(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, stream []byte) {
		r := NewReader(bytes.NewReader(stream), fuzzMax)
		rest := stream
		for {
			p, next, ok, err := Split(rest, fuzzMax)
			want, rerr := r.Next()
			if err != nil {
				require.ErrorIs(t, err, ErrTooLarge)
				require.ErrorIs(t, rerr, ErrTooLarge)
				require.False(t, ok)
				require.Equal(t, rest, next)
				return
			}
			if !ok {
				require.Equal(t, rest, next)
				if len(rest) == 0 {
					require.Equal(t, io.EOF, rerr)
				} else {
					require.Equal(t, io.ErrUnexpectedEOF, rerr)
				}
				return
			}
			require.NoError(t, rerr)
			require.LessOrEqual(t, len(p), fuzzMax)
			require.True(t, bytes.Equal(want, p), "Split and Reader disagree")
			require.Equal(t, len(rest)-HeaderSize-len(p), len(next))
			if len(p) > 0 {
				require.Same(t, &rest[HeaderSize], &p[0], "the payload aliases the input")
			}
			rest = next
		}
	})
}

func TestSplitAllocatesNothing(t *testing.T) {
	stream := Append(Append(nil, []byte("abc")), bytes.Repeat([]byte("d"), 100))
	stream = append(stream, header(0xffffff00)...)
	allocs := testing.AllocsPerRun(100, func() {
		rest := stream
		for {
			_, next, ok, err := Split(rest, 1<<20)
			if !ok || err != nil {
				return
			}
			rest = next
		}
	})
	// Only the ErrTooLarge error's formatting allocates, a fixed amount
	// whatever the header announces; valid frames cost nothing.
	require.LessOrEqual(t, allocs, 8.0)
	valid := Append(Append(nil, []byte("abc")), bytes.Repeat([]byte("d"), 100))
	allocs = testing.AllocsPerRun(100, func() {
		rest := valid
		for len(rest) > 0 {
			_, next, _, _ := Split(rest, 1<<20)
			rest = next
		}
	})
	require.Zero(t, allocs)
}
