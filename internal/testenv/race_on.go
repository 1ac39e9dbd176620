//go:build race

package testenv

// raceEnabled: the race detector is on (RaiseParallel then keeps to
// RaceMinParallel).
const raceEnabled = true
