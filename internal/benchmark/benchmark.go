// Package benchmark holds what kvnet's benchmarks share.
package benchmark

import (
	"syscall"
	"time"
)

// CPUTime is the CPU time the process has used, in every thread (the
// garbage collector's too). Unlike ns/op it does not count time spent
// waiting for a core, so it stays steady on a shared machine.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err) // RUSAGE_SELF with a valid pointer does not fail
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
