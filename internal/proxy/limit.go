package proxy

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// DefaultMaxMigrations is the default cap of migrations one proxy relays at
// once: KubeVirt's own default of parallel outbound migrations per cluster
// (parallelMigrationsPerCluster), so the cap bites only where KubeVirt's
// own limit was raised.
const DefaultMaxMigrations = 5

// DefaultQueueWait is how long a stream of a migration over the cap waits
// for a slot before it is refused.
const DefaultQueueWait = 30 * time.Second

var (
	errOverCap          = errors.New("too many migrations in flight")
	errNamespaceOverCap = errors.New("the namespace holds its share of the migrations in flight")
)

// Limiter caps the migrations (not streams: one migration opens two or
// three) a proxy relays at once, and the share of them one namespace may
// hold, so that a tenant who starts many migrations at once cannot keep
// every other tenant's waiting out. A migration holds its slot while it
// has at least one stream open; its further streams never wait.
type Limiter struct {
	// Max is the cap; zero means DefaultMaxMigrations.
	Max int
	// PerNamespace is the most slots one namespace holds at once; zero
	// means half of the cap, rounded up (3 of the default 5), so another
	// namespace always finds a slot beside the busiest one.
	PerNamespace int
	// Wait bounds how long a new migration waits for a slot; zero means
	// DefaultQueueWait.
	Wait time.Duration

	mu      sync.Mutex
	active  map[string]int // streams open per migration ID
	owner   map[string]string
	holding map[string]int // slots held per namespace
	waiting int            // streams waiting for a slot
	freed   chan struct{}  // closed and replaced whenever a slot frees
}

// Waiting is the number of streams waiting for a slot now.
func (l *Limiter) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
}

// QueueWait is how long Acquire may wait, after defaults.
func (l *Limiter) QueueWait() time.Duration {
	if l == nil {
		return 0
	}
	return orDefault(l.Wait, DefaultQueueWait)
}

func (l *Limiter) limits() (all, perNamespace int) {
	all = l.Max
	if all <= 0 {
		all = DefaultMaxMigrations
	}
	perNamespace = l.PerNamespace
	if perNamespace <= 0 {
		perNamespace = (all + 1) / 2
	}
	return all, min(all, perNamespace)
}

// Acquire takes a slot for migration id of namespace ns, waiting up to
// Wait. Release must follow every successful Acquire. A migration ID is
// one slot whatever namespace it arrives with: the namespace that took it
// first holds it.
func (l *Limiter) Acquire(ctx context.Context, ns, id string) error {
	timer := time.NewTimer(l.QueueWait())
	defer timer.Stop()
	all, perNamespace := l.limits()
	for waited := false; ; waited = true {
		l.mu.Lock()
		if l.active == nil {
			l.active, l.owner, l.holding, l.freed = map[string]int{}, map[string]string{}, map[string]int{}, make(chan struct{})
		}
		if waited {
			l.waiting--
		}
		if l.active[id] > 0 {
			l.active[id]++
			l.mu.Unlock()
			return nil
		}
		overall, own := len(l.active) < all, l.holding[ns] < perNamespace
		if overall && own {
			l.active[id]++
			l.owner[id] = ns
			l.holding[ns]++
			l.mu.Unlock()
			return nil
		}
		l.waiting++
		queued.Inc()
		freed := l.freed
		l.mu.Unlock()
		select {
		case <-freed:
			queued.Dec()
		case <-timer.C:
			l.leaveQueue()
			if overall {
				return errNamespaceOverCap
			}
			return errOverCap
		case <-ctx.Done():
			l.leaveQueue()
			return ctx.Err()
		}
	}
}

func (l *Limiter) leaveQueue() {
	queued.Dec()
	l.mu.Lock()
	l.waiting--
	l.mu.Unlock()
}

// Release gives back one stream's hold on id's slot.
func (l *Limiter) Release(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active[id]--; l.active[id] <= 0 {
		ns := l.owner[id]
		delete(l.active, id)
		delete(l.owner, id)
		if l.holding[ns]--; l.holding[ns] <= 0 {
			delete(l.holding, ns)
		}
		close(l.freed)
		l.freed = make(chan struct{})
	}
}

// overCapRefusal is the refusal a failed Acquire reports.
func overCapRefusal(err error) hop.RefusalCode {
	if errors.Is(err, errNamespaceOverCap) {
		return hop.RefusedNamespaceShare
	}
	return hop.RefusedOverCap
}
