// Package proxy is kvnet's cross-cluster migration proxy: an L4 TCP relay,
// a controller that opens one relay per remote migration port of a
// decentralized live migration source, and the admission handler that points
// the source virt-handler at those relays instead of the unreachable remote
// node. See docs/migration-proxy.md.
package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// DefaultDialTimeout bounds the dial to the target when Relay.DialTimeout is
// zero: long enough for a cross-cluster TCP handshake, short enough that
// virt-handler sees a closed connection instead of a hang.
const DefaultDialTimeout = 10 * time.Second

// Relay copies TCP connections accepted on a listener to Target, byte for
// byte. It never looks inside the stream: virt-handler's migration
// connections are mutual TLS end to end, and a relay that terminates nothing
// keeps that trust between the two virt-handlers intact.
//
// The zero value with Target set is ready to use.
type Relay struct {
	// Target is the host:port every accepted connection is relayed to.
	Target string
	// DialTimeout bounds the dial to Target; zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// Log receives connection events; the zero logger discards them.
	Log logr.Logger
	// OnDialError, if set, is called when Target cannot be reached. Tests
	// and callers use it to observe failures without scraping metrics.
	OnDialError func(error)
}

func (r *Relay) dialTimeout() time.Duration {
	if r.DialTimeout > 0 {
		return r.DialTimeout
	}
	return DefaultDialTimeout
}

// Serve accepts connections on ln and relays each to Target until ctx is
// cancelled or ln fails. Cancelling ctx closes ln and every relayed
// connection; Serve returns only after all of its connections have ended, so
// a caller that waits for Serve knows no goroutine is left behind. It returns
// nil after a cancel and the accept error otherwise.
func (r *Relay) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	defer ln.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.handle(ctx, c)
		}()
	}
}

// handle relays one accepted connection. Each direction runs in its own
// goroutine and, when its source reaches EOF, half-closes its destination
// (CloseWrite) so the other side sees the end of that direction while the
// opposite one keeps flowing; both are awaited before the sockets close.
func (r *Relay) handle(ctx context.Context, src net.Conn) {
	log := r.Log.WithValues("client", src.RemoteAddr().String(), "target", r.Target)
	connections.Inc()
	active.Inc()
	defer active.Dec()
	defer src.Close()

	dctx, cancel := context.WithTimeout(ctx, r.dialTimeout())
	var d net.Dialer
	dst, err := d.DialContext(dctx, "tcp", r.Target)
	cancel()
	if err != nil {
		dialErrors.Inc()
		log.Error(err, "dialing the migration target; closing the client connection")
		if r.OnDialError != nil {
			r.OnDialError(err)
		}
		return
	}
	defer dst.Close()
	log.V(1).Info("relaying")

	// A cancel (the migration ended, the proxy stops) aborts both directions.
	stop := context.AfterFunc(ctx, func() {
		_ = src.Close()
		_ = dst.Close()
	})
	defer stop()

	var wg sync.WaitGroup
	wg.Add(2)
	var up, down int64
	go func() { defer wg.Done(); up = proxyCopy(log, "to-target", dst, src) }()
	go func() { defer wg.Done(); down = proxyCopy(log, "from-target", src, dst) }()
	wg.Wait()
	log.V(1).Info("relay ended", "bytesToTarget", up, "bytesFromTarget", down)
}

// closeWriter is what *net.TCPConn and *net.UnixConn offer for half-close.
type closeWriter interface{ CloseWrite() error }

// proxyCopy copies src to dst until src ends, then half-closes dst. On an
// error (reset, cancel) it closes both sockets so the opposite direction
// cannot block forever on a peer that is gone. io.Copy between two
// *net.TCPConn uses splice on Linux; counting happens once at the end so as
// not to defeat it.
func proxyCopy(log logr.Logger, direction string, dst, src net.Conn) int64 {
	n, err := io.Copy(dst, src)
	bytesRelayed.WithLabelValues(direction).Add(float64(n))
	if err != nil {
		if !errors.Is(err, net.ErrClosed) {
			log.V(1).Info("relay direction failed", "direction", direction, "error", err.Error())
		}
		_ = src.Close()
		_ = dst.Close()
		return n
	}
	if cw, ok := dst.(closeWriter); ok {
		if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
			log.V(1).Info("half-closing", "direction", direction, "error", err.Error())
		}
	} else {
		_ = dst.Close()
	}
	return n
}
