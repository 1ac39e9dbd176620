//go:build race

package worker

// raceEnabled: the race detector is on. Under it sync.Pool drops a
// quarter of what is put back (on purpose, to find misuse), so tests that
// count the allocations a pool saves do not apply.
const raceEnabled = true
