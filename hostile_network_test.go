package pynox

// Adversarial suite (helpers in hostile_test.go): the network, sockets to
// host endpoints a job must not reach.

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pynox/pynox/internal/testenv"
)

// advListener records whether anything reached a host endpoint a job must
// not reach.
type advListener struct {
	name    string
	target  string // what the job connects to, as Python source
	family  string // Python socket family expression
	kind    string // Python socket type expression
	stream  bool
	ln      net.Listener
	pc      net.PacketConn
	mu      sync.Mutex
	reached []string
}

func (l *advListener) serve() {
	if l.ln != nil {
		for {
			c, err := l.ln.Accept()
			if err != nil {
				return
			}
			l.mu.Lock()
			l.reached = append(l.reached, "connection from "+c.RemoteAddr().String())
			l.mu.Unlock()
			c.Close()
		}
	}
	buf := make([]byte, 2048)
	for {
		n, addr, err := l.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		l.mu.Lock()
		l.reached = append(l.reached, fmt.Sprintf("%d bytes from %v", n, addr))
		l.mu.Unlock()
	}
}

// quiet asserts that nothing reached the endpoint, waiting a moment for
// stragglers.
func (l *advListener) quiet(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(300 * time.Millisecond)
	if l.ln != nil {
		_ = l.ln.(interface{ SetDeadline(time.Time) error }).SetDeadline(deadline)
	} else {
		_ = l.pc.SetReadDeadline(deadline)
	}
	time.Sleep(time.Until(deadline) + 50*time.Millisecond)
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Empty(t, l.reached, "%s: a job reached the host", l.name)
}

func (l *advListener) close() {
	if l.ln != nil {
		l.ln.Close()
	} else {
		l.pc.Close()
	}
}

// advListeners starts one listener per reachable kind of host endpoint.
func advListeners(t *testing.T, sockDir string) []*advListener {
	t.Helper()
	var ls []*advListener
	add := func(l *advListener) {
		ls = append(ls, l)
		go l.serve()
		t.Cleanup(l.close)
	}
	tcp, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	add(&advListener{name: "tcp loopback", ln: tcp, stream: true, family: "socket.AF_INET", kind: "socket.SOCK_STREAM",
		target: fmt.Sprintf("('127.0.0.1', %d)", tcp.Addr().(*net.TCPAddr).Port)})
	udp, err := net.ListenPacket("udp4", "127.0.0.1:0")
	require.NoError(t, err)
	add(&advListener{name: "udp loopback", pc: udp, family: "socket.AF_INET", kind: "socket.SOCK_DGRAM",
		target: fmt.Sprintf("('127.0.0.1', %d)", udp.LocalAddr().(*net.UDPAddr).Port)})
	if tcp6, err := net.Listen("tcp6", "[::1]:0"); err == nil {
		add(&advListener{name: "tcp6 loopback", ln: tcp6, stream: true, family: "socket.AF_INET6", kind: "socket.SOCK_STREAM",
			target: fmt.Sprintf("('::1', %d)", tcp6.Addr().(*net.TCPAddr).Port)})
	} else {
		t.Logf("no IPv6 loopback (%v): IPv6 probes skipped", err)
	}
	if udp6, err := net.ListenPacket("udp6", "[::1]:0"); err == nil {
		add(&advListener{name: "udp6 loopback", pc: udp6, family: "socket.AF_INET6", kind: "socket.SOCK_DGRAM",
			target: fmt.Sprintf("('::1', %d)", udp6.LocalAddr().(*net.UDPAddr).Port)})
	}
	path := filepath.Join(sockDir, "s.sock")
	us, err := net.Listen("unix", path)
	require.NoError(t, err)
	add(&advListener{name: "unix pathname stream", ln: us, stream: true, family: "socket.AF_UNIX", kind: "socket.SOCK_STREAM",
		target: fmt.Sprintf("%q", path)})
	dpath := filepath.Join(sockDir, "d.sock")
	ud, err := net.ListenPacket("unixgram", dpath)
	require.NoError(t, err)
	add(&advListener{name: "unix pathname datagram", pc: ud, family: "socket.AF_UNIX", kind: "socket.SOCK_DGRAM",
		target: fmt.Sprintf("%q", dpath)})
	abstract := fmt.Sprintf("pynox-hostile-%d-%d", os.Getpid(), time.Now().UnixNano())
	ua, err := net.Listen("unix", "@"+abstract)
	require.NoError(t, err)
	add(&advListener{name: "unix abstract stream", ln: ua, stream: true, family: "socket.AF_UNIX", kind: "socket.SOCK_STREAM",
		target: fmt.Sprintf("'\\0%s'", abstract)})
	return ls
}

// advConnect is a job that tries to reach l and reports how far it got.
func advConnect(l *advListener) string {
	send := "s.sendto(b'pwned', " + l.target + ")"
	if l.stream {
		send = "s.settimeout(2)\n    s.connect(" + l.target + ")\n    s.sendall(b'pwned')"
	}
	return advCode(`import socket
def go():
    s = socket.socket(` + l.family + `, ` + l.kind + `)
    ` + send + `
attempt("reach", go)
`)
}

func TestHostileNetwork(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	p := newTestPool(t, Config{Workers: 2})
	sockDir := filepath.Join(p.cfg.Dir, "sock")
	require.NoError(t, os.Mkdir(sockDir, 0o755))
	ls := advListeners(t, sockDir)

	// Without the network, nothing reaches any endpoint: socket() itself
	// fails. The unix sockets' directory is even granted for reading.
	for _, l := range ls {
		t.Run("denied/"+l.name, func(t *testing.T) {
			r := run(t, p, Job{Code: advConnect(l), AllowRead: []string{"sock"}})
			requireOK(t, r)
			advExpect(t, advProbes(t, r), map[string][]string{"reach": {"EPERM"}})
			l.quiet(t)
		})
	}
	families := advCode(`import socket
attempt("netlink route", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
attempt("netlink audit", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9))
attempt("packet raw", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)))
attempt("packet dgram", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(3)))
attempt("vsock stream", lambda: socket.socket(40, socket.SOCK_STREAM))
attempt("vsock dgram", lambda: socket.socket(40, socket.SOCK_DGRAM))
attempt("unix stream", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("inet raw icmp", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("alg", lambda: socket.socket(38, socket.SOCK_SEQPACKET))
attempt("bluetooth", lambda: socket.socket(31, socket.SOCK_STREAM))
sc("raw syscall socket AF_NETLINK", 41, 16, 3, 0)
def pair():
    a, b = socket.socketpair()
    a.sendall(b"x")
    assert b.recv(1) == b"x"
attempt("control socketpair", pair)
`)
	t.Run("denied/other families", func(t *testing.T) {
		r := run(t, p, Job{Code: families})
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			"netlink route": {"EPERM"}, "netlink audit": {"EPERM"}, "packet raw": {"EPERM"}, "packet dgram": {"EPERM"},
			"vsock stream": {"EPERM"}, "vsock dgram": {"EPERM"}, "unix stream": {"EPERM"}, "inet raw icmp": {"EPERM"},
			"alg": {"EPERM"}, "bluetooth": {"EPERM"}, "raw syscall socket AF_NETLINK": {"EPERM"},
			"control socketpair": {"ok"},
		})
	})
	advServes(t, p)

	// Granted the network, a job reaches TCP and UDP (the positive control
	// that shows the denials above are the sandbox's), but still no unix,
	// netlink, packet or vsock endpoint.
	pn := newTestPool(t, Config{Workers: 1, Limits: Limits{AllowNetwork: true}})
	psock := filepath.Join(pn.cfg.Dir, "sock")
	require.NoError(t, os.Mkdir(psock, 0o755))
	for _, l := range advListeners(t, psock) {
		t.Run("network granted/"+l.name, func(t *testing.T) {
			r := run(t, pn, Job{Code: advConnect(l), AllowRead: []string{"sock"}, AllowNetwork: true})
			requireOK(t, r)
			if strings.Contains(l.family, "AF_UNIX") {
				advExpect(t, advProbes(t, r), map[string][]string{"reach": {"EPERM"}})
				l.quiet(t)
				return
			}
			advExpect(t, advProbes(t, r), map[string][]string{"reach": {"ok"}})
			require.Eventually(t, func() bool {
				l.mu.Lock()
				defer l.mu.Unlock()
				return len(l.reached) > 0
			}, 5*time.Second, 10*time.Millisecond, "%s: the granted job's traffic never arrived", l.name)
		})
	}
	t.Run("network granted/other families", func(t *testing.T) {
		r := run(t, pn, Job{Code: families, AllowNetwork: true})
		requireOK(t, r)
		advExpect(t, advProbes(t, r), map[string][]string{
			"netlink route": {"EPERM"}, "netlink audit": {"EPERM"}, "packet raw": {"EPERM"}, "packet dgram": {"EPERM"},
			"vsock stream": {"EPERM"}, "vsock dgram": {"EPERM"}, "unix stream": {"EPERM"},
			// AF_INET is allowed by the filter; a raw socket still needs CAP_NET_RAW.
			"inet raw icmp": {"EPERM"},
			"alg":           {"EPERM"}, "bluetooth": {"EPERM"}, "raw syscall socket AF_NETLINK": {"EPERM"},
			"control socketpair": {"ok"},
		})
	})
	advServes(t, pn)
}
