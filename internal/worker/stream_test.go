package worker

import (
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// Every way of cutting a stream into reads gives the same valid text: a
// character cut between reads is passed whole, and each byte that is not
// part of a character becomes U+FFFD, as encoding/json writes it.
func TestUTF8CarryEverySplit(t *testing.T) {
	in := []byte("a\u20acb\U0001F600\xff\xe2\x82c\xed\xa0\x80\xf0\x9f")
	want := "a\u20acb\U0001F600\uFFFD\uFFFD\uFFFDc\uFFFD\uFFFD\uFFFD\uFFFD\uFFFD"
	for i := 0; i <= len(in); i++ {
		for j := i; j <= len(in); j++ {
			var c utf8Carry
			var got string
			for _, part := range [][]byte{in[:i], in[i:j], in[j:]} {
				s := c.text(part, false)
				require.True(t, utf8.ValidString(s))
				got += s
			}
			got += c.text(nil, true)
			require.Equal(t, want, got, "split at %d and %d", i, j)
		}
	}
}
