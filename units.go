package pynox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Duration is a time.Duration written as a string with a unit, as in
// "500ms", "5s" or "1m" (Go's time.ParseDuration syntax, positive only):
// the form durations take in request lines and configuration files. The
// Go API itself uses time.Duration. The zero value means "not set".
type Duration time.Duration

// UnmarshalText parses a duration such as "5s".
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalText formats the duration as time.Duration does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// durationSyntax is time.ParseDuration's syntax, for a positive duration.
var durationSyntax = regexp.MustCompile(`^\+?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

// ParseDuration parses a positive duration with a unit: "500ms", "5s",
// "1m", "1m30s". A bare number is refused, since its unit would be a guess.
func ParseDuration(s string) (time.Duration, error) {
	v, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		if durationSyntax.MatchString(strings.TrimSpace(s)) {
			// Well formed, but beyond time.Duration.
			return 0, fmt.Errorf("invalid duration %q: too large; the longest is %s", s, time.Duration(math.MaxInt64).Truncate(time.Second))
		}
		return 0, fmt.Errorf("invalid duration %q: want a number with a unit, such as \"500ms\", \"5s\" or \"1m\"", s)
	}
	if v <= 0 {
		return 0, fmt.Errorf("invalid duration %q: must be positive", s)
	}
	return v, nil
}

// Size is a byte count, written either as an integer number of bytes or as
// a string with a binary unit suffix: "64k", "512m", "1g", "1t" (case
// insensitive; an optional trailing "b" or "ib" is accepted, as in "512MiB"):
// the form sizes take in request lines and configuration files. The Go API
// itself uses byte counts (int64). The zero value means "not set".
type Size int64

// UnmarshalJSON accepts an integer or a string with a unit.
func (s *Size) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		return s.UnmarshalText([]byte(str))
	}
	v, err := strconv.ParseInt(string(b), 10, 64)
	if errors.Is(err, strconv.ErrRange) && v > 0 {
		return fmt.Errorf("invalid size %s: too large; the largest is %d bytes", b, int64(math.MaxInt64))
	}
	if err != nil || v <= 0 {
		return fmt.Errorf("invalid size %s: want a positive integer of bytes or a string such as \"512m\"", b)
	}
	*s = Size(v)
	return nil
}

// UnmarshalText parses a size string such as "512m".
func (s *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = Size(v)
	return nil
}

// MarshalJSON writes the size as an integer of bytes.
func (s Size) MarshalJSON() ([]byte, error) { return strconv.AppendInt(nil, int64(s), 10), nil }

// ParseSize parses a positive size: an integer of bytes, or an integer
// followed by k, m, g or t (powers of 1024).
func ParseSize(str string) (int64, error) {
	s := strings.ToLower(strings.TrimSpace(str))
	bad := fmt.Errorf("invalid size %q: want bytes or a number with a unit, such as \"512m\" or \"1g\"", str)
	s = strings.TrimSuffix(s, "ib")
	s = strings.TrimSuffix(s, "b")
	mult := int64(1)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k':
			mult = 1 << 10
		case 'm':
			mult = 1 << 20
		case 'g':
			mult = 1 << 30
		case 't':
			mult = 1 << 40
		}
		if mult != 1 {
			s = s[:n-1]
		}
	}
	if s == "" || strings.ContainsAny(s, "+-") {
		return 0, bad
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if (errors.Is(err, strconv.ErrRange) && v > 0) || (err == nil && v > math.MaxInt64/mult) {
		return 0, fmt.Errorf("invalid size %q: too large; the largest is %d bytes", str, int64(math.MaxInt64))
	}
	if err != nil || v <= 0 {
		return 0, bad
	}
	return v * mult, nil
}

// formatDuration renders nanoseconds as a time.Duration does.
func formatDuration(ns int64) string { return time.Duration(ns).String() }

// formatSize renders a byte count the way a person would write it.
func formatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
