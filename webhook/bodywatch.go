package webhook

import (
	"net/http"
	"sync"
	"time"
)

// bodyWatch bounds how long a caller may take to send its request body,
// for every request of one Edge, with one watcher rather than a read
// deadline set and lifted on the connection around every body.
//
// A deadline per request is the obvious way, and it is what kvnet did:
// but each one arms a runtime timer, which wakes the network poller or
// starts a thread to run it, twice per request, and at one connection that
// measured about 1% of kvnet's throughput against the same kvnet without
// it (docs/performance.md). The watcher ticks four times per timeout while
// bodies are being read, cuts those that have taken longer by putting
// their connection's read deadline in the past (the read then fails at
// once, as at a deadline), and stops when no body has been read for two
// ticks. A body is cut between one and one and a quarter timeouts after
// its read began.
type bodyWatch struct {
	mu       sync.Mutex
	reads    []bodyRead // a free slot has a nil w
	free     []int
	active   int
	watching bool
	// begun says a body began since the watcher's last tick: between
	// ticks, bodies that begin and end leave active at 0.
	begun bool
	// starts counts the watchers started, for tests.
	starts int
}

type bodyRead struct {
	w     http.ResponseWriter
	since time.Time
	cut   bool
}

// begin notes that a body is being read for w and returns its slot for
// end; timeout is the Edge's body timeout.
func (b *bodyWatch) begin(w http.ResponseWriter, timeout time.Duration) int {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	var slot int
	if n := len(b.free); n > 0 {
		slot = b.free[n-1]
		b.free = b.free[:n-1]
	} else {
		slot = len(b.reads)
		b.reads = append(b.reads, bodyRead{})
	}
	b.reads[slot] = bodyRead{w: w, since: now}
	b.active++
	b.begun = true
	if !b.watching {
		b.watching = true
		b.starts++
		go b.watch(timeout)
	}
	return slot
}

// end notes that the body of slot has been read, or has failed. After
// end the watcher no longer touches the connection, so a slow handler's
// answer and the next request are not cut.
func (b *bodyWatch) end(slot int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reads[slot] = bodyRead{}
	b.free = append(b.free, slot)
	b.active--
}

// watch cuts the bodies that have taken longer than timeout, until no
// body has been read for two ticks.
func (b *bodyWatch) watch(timeout time.Duration) {
	t := time.NewTicker(max(timeout/4, time.Millisecond))
	defer t.Stop()
	idle := 0
	for now := range t.C {
		b.mu.Lock()
		if b.active == 0 && !b.begun {
			if idle++; idle == 2 {
				b.watching = false
				b.mu.Unlock()
				return
			}
		} else {
			idle = 0
		}
		b.begun = false
		for i := range b.reads {
			r := &b.reads[i]
			if r.w != nil && !r.cut && now.Sub(r.since) >= timeout {
				r.cut = true
				// A deadline in the past fails the read at once. Not an
				// API server (it sends a review at once): a client that
				// stalled, whose connection then closes.
				_ = http.NewResponseController(r.w).SetReadDeadline(time.Unix(1, 0))
			}
		}
		b.mu.Unlock()
	}
}
