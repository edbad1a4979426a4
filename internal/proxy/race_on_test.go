//go:build race

package proxy

// raceEnabled: this binary runs under the race detector, which multiplies
// the memory of every process it instruments (the child proxies too), so
// figures of RSS say nothing of the proxy's own.
const raceEnabled = true
