package proxy

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Defaults of the hop listener's rate limits. A peer proxy opens two or
// three streams per migration it sends, at most the cap's worth at once,
// and one CA offer per sync interval (30 s) or CA change; these leave it
// several times that and stop a flood.
const (
	// DefaultHandshakeRate and DefaultHandshakeBurst bound the new
	// connections one source address may open per second. Within one
	// handshake timeout (10 s) a source opens at most 48 + 10*10 = 148,
	// so no single source can, alone, open the 256 connections at once
	// that would displace every pending handshake (a peer's among them).
	DefaultHandshakeRate  = 10
	DefaultHandshakeBurst = 48
	// DefaultCAOfferEvery and DefaultCAOfferBurst bound the CA offers one
	// peer may make: each one reads, parses and may write
	// kubevirt-external-ca, which virt-operator then rolls out.
	DefaultCAOfferEvery = 5 * time.Second
	DefaultCAOfferBurst = 6
)

// maxRateKeys bounds the sources (or peers) one keyedLimiter tracks, so
// that a flood from many addresses cannot grow it without end.
const maxRateKeys = 4096

// keyedLimiter is a token bucket per key (a source address, a peer name),
// from golang.org/x/time/rate. A key whose bucket is full again is
// forgotten when room is needed: it is then no different from a new one.
// When every tracked key is still draining, a new key is refused (fail
// closed): the keys already tracked, the peers among them, keep their
// buckets.
type keyedLimiter struct {
	limit rate.Limit
	burst int

	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func newKeyedLimiter(limit rate.Limit, burst int) *keyedLimiter {
	return &keyedLimiter{limit: limit, burst: burst, m: map[string]*rate.Limiter{}}
}

// allow takes one token of key's bucket at now.
func (k *keyedLimiter) allow(key string, now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	l, ok := k.m[key]
	if !ok {
		if len(k.m) >= maxRateKeys {
			for other, ol := range k.m {
				if ol.TokensAt(now) >= float64(k.burst) {
					delete(k.m, other)
				}
			}
			if len(k.m) >= maxRateKeys {
				return false
			}
		}
		l = rate.NewLimiter(k.limit, k.burst)
		k.m[key] = l
	}
	return l.AllowN(now, 1)
}
