//go:build !race

package proxy

// raceEnabled: see race_on_test.go.
const raceEnabled = false
