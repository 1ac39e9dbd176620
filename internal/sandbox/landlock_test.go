package sandbox

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestRightsByABI(t *testing.T) {
	tests := []struct {
		abi     int
		refer   bool
		trunc   bool
		ioctl   bool
		net     bool
		scoping bool
		unix    bool
	}{
		{1, false, false, false, false, false, false},
		{2, true, false, false, false, false, false},
		{3, true, true, false, false, false, false},
		{4, true, true, false, true, false, false},
		{5, true, true, true, true, false, false},
		{6, true, true, true, true, true, false},
		{7, true, true, true, true, true, false},
		{8, true, true, true, true, true, false},
		{9, true, true, true, true, true, true},
	}
	for _, tc := range tests {
		fs := HandledFS(tc.abi)
		require.Equal(t, tc.refer, fs&accessFSRefer != 0, "abi %d refer", tc.abi)
		require.Equal(t, tc.trunc, fs&accessFSTruncate != 0, "abi %d truncate", tc.abi)
		require.Equal(t, tc.ioctl, fs&accessFSIoctlDev != 0, "abi %d ioctl", tc.abi)
		require.Equal(t, tc.net, HandledNet(tc.abi, false) != 0, "abi %d net", tc.abi)
		require.Zero(t, HandledNet(tc.abi, true), "a granted network is not handled")
		require.Equal(t, tc.scoping, Scoped(tc.abi) == scopeSignal|scopeAbstractUnixSocket, "abi %d scoping", tc.abi)
		require.Equal(t, tc.unix, fs&accessFSResolveUnix != 0, "abi %d resolve_unix", tc.abi)
		// Every right a grant gives is one the ruleset handles.
		for _, a := range []uint64{RuntimeAccess(tc.abi), ReadAccess(tc.abi), WriteAccess(tc.abi), DeviceAccess(tc.abi, true)} {
			require.Equal(t, a, a&fs, "abi %d", tc.abi)
		}
	}
}

func TestGrants(t *testing.T) {
	require.Zero(t, ReadAccess(7)&accessFSWriteFile, "a read grant writes nothing")
	require.Zero(t, WriteAccess(7)&(accessFSExecute|accessFSMakeChar|accessFSMakeBlock), "a write grant executes and makes devices nothing")
	require.NotZero(t, WriteAccess(7)&accessFSRefer, "renames within write grants work")
	// Rules on files may only carry file rights.
	require.Equal(t, accessFSReadFile|accessFSWriteFile|accessFSTruncate|accessFSIoctlDev, ForFile(WriteAccess(7)))
	require.Zero(t, ForFile(accessFSReadDir|accessFSMakeReg))
	// Pathname unix sockets (ABI 9) are handled and granted by no rule.
	require.Equal(t, uint64(1<<16), accessFSResolveUnix, "LANDLOCK_ACCESS_FS_RESOLVE_UNIX")
	for _, a := range []uint64{RuntimeAccess(9), ReadAccess(9), WriteAccess(9), DeviceAccess(9, true)} {
		require.Zero(t, a&accessFSResolveUnix)
	}
	require.Equal(t, accessFSResolveUnix, ForFile(accessFSResolveUnix), "a rule on a socket file may carry resolve_unix")
	require.Contains(t, FSRights(HandledFS(9)), "resolve_unix")
}

// TestResolveUnixKernel applies, on one OS thread that is then discarded,
// a ruleset handling every right of the running ABI with a write grant
// on a directory holding a host's listening unix socket, and checks that
// connect fails with EACCES: with ABI 9 a job reaches no pathname socket
// bound outside its domain.
func TestResolveUnixKernel(t *testing.T) {
	abi, err := ABI()
	if err != nil {
		t.Skipf("kernel without Landlock: %v", err)
	}
	if abi < 9 {
		t.Skipf("kernel Landlock ABI %d has no LANDLOCK_ACCESS_FS_RESOLVE_UNIX (ABI 9, Linux 7.1): pathname unix sockets are kept out of reach by seccomp alone", abi)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "svc.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer l.Close()

	res := make(chan error, 1)
	go func() {
		// The thread is never unlocked: Go ends it with this goroutine,
		// and the Landlock domain with it.
		runtime.LockOSThread()
		res <- connectUnderRuleset(abi, dir, sock)
	}()
	require.ErrorIs(t, <-res, unix.EACCES)
}

// connectUnderRuleset restricts the calling thread to a ruleset that
// handles HandledFS(abi) and grants WriteAccess(abi) beneath dir, then
// connects to the unix socket at path.
func connectUnderRuleset(abi int, dir, path string) error {
	attr := struct{ fs, net, scoped uint64 }{HandledFS(abi), 0, 0}
	rs, _, e := unix.RawSyscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if e != 0 {
		return fmt.Errorf("landlock_create_ruleset: %w", e)
	}
	defer unix.Close(int(rs))
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	rule := make([]byte, 12) // struct landlock_path_beneath_attr, packed
	*(*uint64)(unsafe.Pointer(&rule[0])) = WriteAccess(abi)
	*(*int32)(unsafe.Pointer(&rule[8])) = int32(dfd)
	if _, _, e := unix.RawSyscall6(unix.SYS_LANDLOCK_ADD_RULE, rs, unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&rule[0])), 0, 0, 0); e != 0 {
		return fmt.Errorf("landlock_add_rule: %w", e)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	if _, _, e := unix.RawSyscall(unix.SYS_LANDLOCK_RESTRICT_SELF, rs, 0, 0); e != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", e)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return os.NewSyscallError("connect", unix.Connect(fd, &unix.SockaddrUnix{Name: path}))
}

func TestRulesetString(t *testing.T) {
	r := Ruleset{ABI: 7, HandledFS: HandledFS(7), HandledNet: HandledNet(7, false), Scoped: Scoped(7),
		Rules: []Rule{{Path: "/usr/lib", Access: RuntimeAccess(7)}, {Path: "/data", Access: ReadAccess(7)}}}
	s := r.String()
	require.Contains(t, s, "landlock abi=7")
	require.Contains(t, s, "handled_net=bind_tcp|connect_tcp")
	require.Contains(t, s, "scoped=abstract_unix_socket|signal")
	require.Contains(t, s, "  /data read_file|read_dir\n")
	require.Less(t, strings.Index(s, "/data"), strings.Index(s, "/usr/lib"), "rules are sorted")
}

func TestABI(t *testing.T) {
	abi, err := ABI()
	if err != nil {
		t.Skipf("kernel without Landlock: %v", err)
	}
	require.GreaterOrEqual(t, abi, MinABI)
}
