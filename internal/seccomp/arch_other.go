//go:build linux && !amd64 && !arm64

package seccomp

// nativeTable is nil: the policy has no syscall table for this architecture,
// so Build reports it as unsupported.
var nativeTable *archTable
