package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// pollableStdin returns standard input as a file that Go's poller waits
// on, when it is a pipe: a fresh open file description of the same pipe
// (through /proc/self/fd/0), in non-blocking mode. Reading os.Stdin, a
// blocking descriptor, parks a thread in read(2) between requests; the
// runtime's monitor then finds a P in a system call at every pass and
// keeps polling every 20 µs, waking a CPU each time. The file
// description the pool inherited keeps its mode (a shell or a sibling
// sharing it sees no change); anything other than a pipe (a terminal, a
// file, a socket) is returned as os.Stdin.
func pollableStdin() *os.File {
	var st unix.Stat_t
	if unix.Fstat(0, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return os.Stdin
	}
	f, err := os.OpenFile("/proc/self/fd/0", os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return os.Stdin
	}
	return f
}
