// Package proxy is kvnet's cross-cluster migration proxy. One binary runs
// at both ends of a decentralized live migration:
//
//   - source side: a controller opens one listener per remote migration
//     port on the proxy's in-cluster address and publishes the mapping in
//     a ConfigMap only the proxy may write; kvnet's admission handler then
//     points the source virt-handler at those listeners;
//   - the hop: each accepted stream goes to the target cluster's proxy over
//     mutual TLS, with a preamble naming the migration and port;
//   - target side: the peer's proxy checks the peer, the migration and the
//     port against its own cluster and dials the target virt-handler's
//     in-cluster address.
//
// See docs/migration-proxy.md.
package proxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// DefaultDialTimeout bounds a dial when none is configured: long enough for
// a cross-cluster TCP handshake, short enough that virt-handler sees a
// closed connection instead of a hang.
const DefaultDialTimeout = 10 * time.Second

// Relay accepts migration streams from the source virt-handlers on a
// listener and relays each, byte for byte, to an upstream: the peer proxy
// (Upstream set) or a plain TCP address (Target). It never looks inside the
// stream: virt-handler's migration connections are mutual TLS end to end.
type Relay struct {
	// Target is the host:port dialed over plain TCP when Upstream is nil.
	Target string
	// Upstream, if set, opens the upstream connection of each stream.
	Upstream func(ctx context.Context) (net.Conn, error)
	// DialTimeout bounds the dial to Target; zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// IdleTimeout ends a stream that moved no byte for this long.
	IdleTimeout time.Duration
	// AllowedSources, when not empty, are the only client ranges accepted
	// (the in-cluster migration network): anything else is closed at once.
	AllowedSources []netip.Prefix
	// MigrationID labels the stream counters; Limiter, if set, caps the
	// migrations relayed at once and Namespace's share of them (the VMI's).
	MigrationID string
	Namespace   string
	Limiter     *Limiter
	// MaxConns caps the clients relayed at once; one more is closed at
	// once (refusal too-many-connections). Zero means DefaultMaxRelayConns.
	MaxConns int
	// Log receives connection events; the zero logger discards them.
	Log logr.Logger
	// OnDialError, if set, is called when the upstream cannot be reached;
	// OnRefused with each refused client. Tests observe failures with them.
	OnDialError func(error)
	OnRefused   func(hop.RefusalCode)

	conns atomic.Int64
}

// DefaultMaxRelayConns bounds the clients of one relay listener: a
// migration opens one connection per port it announces (three at most) and
// libvirt's parallel migration a few more on the main port; anything
// beyond is not KubeVirt's and only costs descriptors and memory.
const DefaultMaxRelayConns = 16

// Serve accepts connections on ln and relays each until ctx is cancelled.
// Cancelling ctx closes ln and every relayed connection; Serve returns only
// after all of its connections have ended, so a caller that waits for Serve
// knows no goroutine is left behind.
func (r *Relay) Serve(ctx context.Context, ln net.Listener) error {
	return serveListener(ctx, ln, r.Log, r.allowed, r.handle)
}

func (r *Relay) allowed(c net.Conn) bool {
	if len(r.AllowedSources) == 0 || allowedSource(r.AllowedSources, c.RemoteAddr()) {
		return true
	}
	refused.WithLabelValues("source", hop.RefusedSourceRange.String()).Inc()
	r.Log.Info("refused a client outside the allowed migration ranges", "client", c.RemoteAddr().String())
	if r.OnRefused != nil {
		r.OnRefused(hop.RefusedSourceRange)
	}
	return false
}

func allowedSource(ranges []netip.Prefix, a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return false
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return false
	}
	ip = ip.Unmap()
	for _, p := range ranges {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Accept-error backoff: EMFILE and friends clear up by themselves once
// other streams end, so the listener waits and retries instead of dying
// (a dead relay would leave its published mapping pointing at nothing).
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// serveListener is the accept loop of every proxy listener: filter each
// client, handle it in its own goroutine, back off on accept errors, and
// reopen the same address when the listener itself dies. It returns nil
// once ctx ends and every handler has returned.
func serveListener(ctx context.Context, ln net.Listener, log logr.Logger, filter func(net.Conn) bool, handle func(context.Context, net.Conn)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	cur := ln
	closeCur := func() { mu.Lock(); _ = cur.Close(); mu.Unlock() }
	stop := context.AfterFunc(ctx, closeCur)
	defer stop()
	defer closeCur()
	addr := ln.Addr().String()
	backoff := acceptBackoffMin
	wait := func() bool {
		t := time.NewTimer(backoff)
		defer t.Stop()
		backoff = min(2*backoff, acceptBackoffMax)
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for {
		c, err := cur.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			acceptErrors.Inc()
			if !errors.Is(err, net.ErrClosed) {
				log.Info("accept failed; retrying", "listen", addr, "error", err.Error(), "backoff", backoff.String())
				if !wait() {
					return nil
				}
				continue
			}
			// The listener is gone although nobody stopped it: open the
			// same address again, so the published port stays valid.
			log.Info("listener closed underneath; reopening it", "listen", addr)
			for {
				if !wait() {
					return nil
				}
				nl, lerr := net.Listen("tcp", addr)
				if lerr == nil {
					mu.Lock()
					cur = nl
					mu.Unlock()
					if ctx.Err() != nil {
						_ = nl.Close()
						return nil
					}
					listenerReopens.Inc()
					break
				}
				log.Info("reopening the listener failed; retrying", "listen", addr, "error", lerr.Error())
			}
			continue
		}
		backoff = acceptBackoffMin
		if filter != nil && !filter(c) {
			_ = c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			handle(ctx, c)
		}()
	}
}

// handle relays one accepted connection to the upstream.
func (r *Relay) handle(ctx context.Context, src net.Conn) {
	log := r.Log.WithValues("client", src.RemoteAddr().String())
	defer src.Close()
	limit := int64(r.MaxConns)
	if limit <= 0 {
		limit = DefaultMaxRelayConns
	}
	defer r.conns.Add(-1)
	if r.conns.Add(1) > limit {
		r.refuse(log, hop.RefusedTooManyConnections, nil)
		return
	}
	if r.Limiter != nil && r.MigrationID != "" {
		if err := r.Limiter.Acquire(ctx, r.Namespace, r.MigrationID); err != nil {
			r.refuse(log, overCapRefusal(err), err)
			return
		}
		defer r.Limiter.Release(r.MigrationID)
	}
	dst, err := r.dial(ctx)
	if err != nil {
		dialErrors.Inc()
		log.Error(err, "opening the upstream of a migration stream; closing the client connection")
		if r.OnDialError != nil {
			r.OnDialError(err)
		}
		return
	}
	defer dst.Close()
	runStream(ctx, log, "source", r.MigrationID, r.IdleTimeout, src, dst)
}

func (r *Relay) refuse(log logr.Logger, reason hop.RefusalCode, err error) {
	refused.WithLabelValues("source", reason.String()).Inc()
	if err != nil {
		log.Info("refused a stream", "migrationID", r.MigrationID, "namespace", r.Namespace, "reason", reason.String(), "error", err.Error())
	} else {
		log.Info("refused a stream", "migrationID", r.MigrationID, "namespace", r.Namespace, "reason", reason.String())
	}
	if r.OnRefused != nil {
		r.OnRefused(reason)
	}
}

func (r *Relay) dial(ctx context.Context) (net.Conn, error) {
	if r.Upstream != nil {
		return r.Upstream(ctx)
	}
	timeout := r.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	return d.DialContext(dctx, "tcp", r.Target)
}
