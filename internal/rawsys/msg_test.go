//go:build linux

package rawsys

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sendmsg and Recvmsg allocate nothing: they are called per frame on the
// pool's way (the mounter's round trips, the children's control frames),
// whose raw calls exist to cost the runtime nothing.
func TestMsgAllocatesNothing(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	out, in := make([]byte, 16), make([]byte, 64)
	oob := unix.UnixRights(fds[0])
	rb := make([]byte, unix.CmsgSpace(4))
	allocs := testing.AllocsPerRun(100, func() {
		if n, err := Sendmsg(fds[0], out, oob, unix.MSG_DONTWAIT); err != nil || n != len(out) {
			t.Fatalf("Sendmsg: %d, %v", n, err)
		}
		n, oobn, _, err := Recvmsg(fds[1], in, rb, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		if err != nil || n != len(out) || oobn == 0 {
			t.Fatalf("Recvmsg: %d, %d, %v", n, oobn, err)
		}
		// The one descriptor sent, after the control message's header.
		unix.Close(int(*(*int32)(unsafe.Pointer(&rb[unix.CmsgLen(0)]))))
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per send and receive; want none", allocs)
	}
}
