package framework

import "testing"

// FreePort never hands out a port twice in one process, however quickly
// the kernel reuses the ones just closed.
func TestFreePortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 500 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
