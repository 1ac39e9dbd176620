//go:build cgo

package pynox

// psxFindsThreadsInProc is true when go-landlock's thread-by-thread
// enforcement (Landlock ABI before 8) goes through libpsx's C code, which
// finds the process's threads in /proc/<getpid()>/task.
const psxFindsThreadsInProc = true
