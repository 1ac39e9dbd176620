package sandbox

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRightsByABI(t *testing.T) {
	tests := []struct {
		abi     int
		refer   bool
		trunc   bool
		ioctl   bool
		net     bool
		scoping bool
	}{
		{1, false, false, false, false, false},
		{2, true, false, false, false, false},
		{3, true, true, false, false, false},
		{4, true, true, false, true, false},
		{5, true, true, true, true, false},
		{6, true, true, true, true, true},
		{7, true, true, true, true, true},
	}
	for _, tc := range tests {
		fs := HandledFS(tc.abi)
		require.Equal(t, tc.refer, fs&accessFSRefer != 0, "abi %d refer", tc.abi)
		require.Equal(t, tc.trunc, fs&accessFSTruncate != 0, "abi %d truncate", tc.abi)
		require.Equal(t, tc.ioctl, fs&accessFSIoctlDev != 0, "abi %d ioctl", tc.abi)
		require.Equal(t, tc.net, HandledNet(tc.abi, false) != 0, "abi %d net", tc.abi)
		require.Zero(t, HandledNet(tc.abi, true), "a granted network is not handled")
		require.Equal(t, tc.scoping, Scoped(tc.abi) == scopeSignal|scopeAbstractUnixSocket, "abi %d scoping", tc.abi)
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
