package proxy

import (
	"context"
	"errors"
	"sync"
	"time"
)

// DefaultMaxMigrations is the default cap of migrations one proxy relays at
// once: KubeVirt's own default of parallel outbound migrations per cluster
// (parallelMigrationsPerCluster), so the cap bites only where KubeVirt's
// own limit was raised.
const DefaultMaxMigrations = 5

// DefaultQueueWait is how long a stream of a migration over the cap waits
// for a slot before it is refused.
const DefaultQueueWait = 30 * time.Second

var errOverCap = errors.New("too many migrations in flight")

// Limiter caps the migrations (not streams: one migration opens two or
// three) a proxy relays at once. A migration holds its slot while it has at
// least one stream open; its further streams never wait.
type Limiter struct {
	// Max is the cap; zero means DefaultMaxMigrations.
	Max int
	// Wait bounds how long a new migration waits for a slot; zero means
	// DefaultQueueWait.
	Wait time.Duration

	mu     sync.Mutex
	active map[string]int
	freed  chan struct{} // closed and replaced whenever a slot frees
}

// Acquire takes a slot for migration id, waiting up to Wait. Release must
// follow every successful Acquire.
func (l *Limiter) Acquire(ctx context.Context, id string) error {
	wait := l.Wait
	if wait <= 0 {
		wait = DefaultQueueWait
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		l.mu.Lock()
		if l.active == nil {
			l.active, l.freed = map[string]int{}, make(chan struct{})
		}
		limit := l.Max
		if limit <= 0 {
			limit = DefaultMaxMigrations
		}
		if l.active[id] > 0 || len(l.active) < limit {
			l.active[id]++
			l.mu.Unlock()
			return nil
		}
		freed := l.freed
		l.mu.Unlock()
		select {
		case <-freed:
		case <-timer.C:
			return errOverCap
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Release gives back one stream's hold on id's slot.
func (l *Limiter) Release(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active[id]--; l.active[id] <= 0 {
		delete(l.active, id)
		close(l.freed)
		l.freed = make(chan struct{})
	}
}
