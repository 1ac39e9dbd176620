//go:build !cgo

package pynox

// psxFindsThreadsInProc is false without cgo: go-landlock's
// thread-by-thread enforcement goes through the Go runtime's
// syscall.AllThreadsSyscall, which knows its threads.
const psxFindsThreadsInProc = false
