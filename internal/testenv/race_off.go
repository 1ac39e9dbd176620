//go:build !race

package testenv

// raceEnabled: the race detector is off.
const raceEnabled = false
