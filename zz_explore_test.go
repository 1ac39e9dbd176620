package pynox

import (
	"testing"
)

func TestZZExplore(t *testing.T) {
	p := newTestPool(t, Config{Workers: 1})
	r := run(t, p, Job{AllowWrite: []string{"."}, Code: advCode(`
import socket, struct, stat, mmap
fd = os.open("suid", os.O_CREAT|os.O_WRONLY, 0o6755)
R["suid_create_mode"] = oct(os.fstat(fd).st_mode)
attempt("suid_write", lambda: os.write(fd, b"\x7fELF" * 100))
R["suid_after_write"] = oct(os.fstat(fd).st_mode)
os.close(fd)
fd = os.open("suid2", os.O_CREAT|os.O_RDWR, 0o4755)
attempt("suid2_ftrunc", lambda: os.ftruncate(fd, 4096))
R["suid2_after_trunc"] = oct(os.fstat(fd).st_mode)
os.close(fd)
fd = os.open("suid3", os.O_CREAT|os.O_RDWR, 0o4755)
attempt("suid3_falloc", lambda: os.posix_fallocate(fd, 0, 4096))
R["suid3_after_falloc"] = oct(os.fstat(fd).st_mode) + " size %d" % os.fstat(fd).st_size
os.close(fd)
a, b = socket.socketpair()
attempt("oob_send", lambda: a.send(b"x", socket.MSG_OOB))
attempt("oob_recv", lambda: b.recv(1, socket.MSG_OOB))
attempt("attach_filter", lambda: a.setsockopt(socket.SOL_SOCKET, 26, struct.pack("HBBI", 6, 0, 0, 0xffff) ))
s3 = socket.socket(fileno=3)
attempt("peercred", lambda: R.__setitem__("peercred_v", str(struct.unpack("3i", s3.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)))))
def pfd():
    v = s3.getsockopt(socket.SOL_SOCKET, 77, 4)
    R["peerpidfd_v"] = str(struct.unpack("i", v)[0])
attempt("peerpidfd", pfd)
attempt("passpidfd", lambda: s3.setsockopt(socket.SOL_SOCKET, 76, 1))
s3.detach()
attempt("timerfd_alarm", lambda: sc("tfd", 283, 8, 0))
class A(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32), ("flags", ctypes.c_uint64), ("nice", ctypes.c_int32), ("prio", ctypes.c_uint32), ("rt", ctypes.c_uint64), ("dl", ctypes.c_uint64), ("per", ctypes.c_uint64), ("umin", ctypes.c_uint32), ("umax", ctypes.c_uint32)]
at = A(ctypes.sizeof(A), 0, 0x20|0x40, 0, 0, 0, 0, 0, 1024, 1024)
sc("uclamp", 314, 0, ctypes.byref(at), 0)
`)})
	t.Logf("err %+v", r.Error)
	for k, v := range advProbes(t, r) {
		t.Logf("%s = %s", k, v)
	}
}
