package mountns

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestBuildAfterRefusal checks the mounter's builders: a request the
// builder refuses (a path with a ".." component) gets exactly one answer,
// an error naming the path, and the next request is served by a new
// builder; namespaces built one after another are distinct, and Close
// returns.
func TestBuildAfterRefusal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the mounter needs root (CAP_SYS_ADMIN in the initial user namespace)")
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("user namespaces are disabled (user.max_user_namespaces = 0)")
	}
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	usr, err := os.OpenFile("/usr", unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer usr.Close()
	etc, err := os.OpenFile("/etc/hosts", unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer etc.Close()
	m, err := Start(python)
	require.NoError(t, err)
	good := Plan{Binds: []Bind{
		{Source: fd(usr), Path: "/usr", ReadOnly: true},
		{Source: fd(etc), Path: "/etc/hosts", ReadOnly: true},
		{Source: fd(etc), Path: "/etc/a/hosts", ReadOnly: true},
	}, Links: HostLinks()}
	var inodes []uint64
	for i := range 3 {
		_, err := m.Build(Plan{Binds: []Bind{{Source: fd(usr), Path: "/x/../usr", ReadOnly: true}}})
		require.Error(t, err, "request %d", i)
		require.Contains(t, err.Error(), "/x/../usr")
		ns, err := m.Build(good)
		require.NoError(t, err, "request %d", i)
		defer ns.Close()
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(int(ns.Mount.Fd()), &st))
		require.NotContains(t, inodes, st.Ino, "a namespace served twice")
		inodes = append(inodes, st.Ino)
	}
	require.NoError(t, m.Close())
}
