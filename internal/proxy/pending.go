package proxy

import (
	"container/list"
	"errors"
	"net"
	"sync"
)

// handshakes are a hop listener's connections whose TLS handshake is
// under way, oldest first. When they are at the cap, a new connection
// displaces the oldest rather than being refused itself: a cap that
// refused newcomers would be held by whoever opened that many connections
// and let them stall for the handshake timeout (256 stalled connections,
// about 26 a second from addresses enough to pass the per-source rate,
// would refuse every peer). Displacing the oldest turns that into
// opening the cap's worth of connections within the round trip or two of
// a peer's own handshake, which completes in milliseconds; the same
// defence as a SYN queue that drops its oldest half-open connection.
type handshakes struct {
	mu sync.Mutex
	l  list.List // of *handshake
}

// handshake is one pending entry: the raw connection, closed if the entry
// is displaced.
type handshake struct {
	conn      net.Conn
	elem      *list.Element
	displaced bool // guarded by handshakes.mu
}

// errDisplaced is why a displaced handshake ended.
var errDisplaced = errors.New("displaced as the oldest pending handshake by a new connection")

// begin adds c, displacing the oldest entry (closing its connection) when
// limit entries are already there.
func (h *handshakes) begin(c net.Conn, limit int) *handshake {
	e := &handshake{conn: c}
	h.mu.Lock()
	var oldest *handshake
	if h.l.Len() >= limit {
		oldest = h.l.Remove(h.l.Front()).(*handshake)
		oldest.displaced = true
	} else {
		pendingHandshakes.Inc()
	}
	e.elem = h.l.PushBack(e)
	h.mu.Unlock()
	if oldest != nil {
		// Its handler, reading in the handshake, sees the close and
		// finds it displaced in end.
		_ = oldest.conn.Close()
	}
	return e
}

// end removes e once its handshake has returned, and reports whether it
// had been displaced (its connection is then closed, whatever the
// handshake's outcome).
func (h *handshakes) end(e *handshake) (displaced bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e.displaced {
		return true
	}
	h.l.Remove(e.elem)
	pendingHandshakes.Dec()
	return false
}

// len is how many handshakes are pending.
func (h *handshakes) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.l.Len()
}
