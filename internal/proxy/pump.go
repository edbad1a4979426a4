package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// chunk is how many bytes one copy step moves before the counters and the
// idle clock are updated. Between two plain TCP sockets a step is one
// io.CopyN, which the runtime turns into splice(2) (it accepts an
// *io.LimitedReader), so the bytes never enter user space; 1 MiB keeps the
// step overhead far below 1% at tens of Gbit/s while a migration's progress
// stays visible within a second even at a few MB/s.
const chunk = 1 << 20

// tlsBuffer is the copy buffer when one side is TLS: big enough that every
// Write fills many maximum-size (16 KiB) records.
const tlsBuffer = 256 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, tlsBuffer); return &b }}

// DefaultIdleTimeout ends a stream on which neither direction moved a byte
// for this long. A live migration keeps its connections busy or closes
// them; a stream idle this long has a dead peer that TCP has not noticed.
const DefaultIdleTimeout = 5 * time.Minute

// stream is one relayed connection pair.
type stream struct {
	log  logr.Logger
	idle time.Duration
	// onBytes is called after every step with the direction and the bytes
	// it moved, so counters move while a long migration runs.
	onBytes func(direction string, n int64)

	progress atomic.Int64
}

// pump copies a->b ("to-target") and b->a ("from-target") until both
// directions end, an error or the idle timeout ends both, or ctx is
// cancelled. It closes neither connection; the caller does. It returns the
// bytes moved each way.
func (s *stream) pump(ctx context.Context, a, b net.Conn) (up, down int64) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	abort := func() { _ = a.Close(); _ = b.Close() }
	stop := context.AfterFunc(ctx, abort)
	defer stop()

	idle := s.idle
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); up = s.copy("to-target", b, a, abort) }()
	go func() { defer wg.Done(); down = s.copy("from-target", a, b, abort) }()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	tick := time.NewTicker(max(idle/4, 10*time.Millisecond))
	defer tick.Stop()
	last, lastMove := s.progress.Load(), time.Now()
	for {
		select {
		case <-done:
			return up, down
		case now := <-tick.C:
			if p := s.progress.Load(); p != last {
				last, lastMove = p, now
			} else if now.Sub(lastMove) >= idle {
				idleTimeouts.Inc()
				s.log.Info("stream idle; closing it", "idleTimeout", idle.String())
				abort()
				<-done
				return up, down
			}
		}
	}
}

// copy moves src to dst until src's EOF, then half-closes dst so the peer
// sees the end of this direction while the other one keeps flowing. An
// error (reset, abort) closes both sockets through abort, so the opposite
// direction cannot block forever on a peer that is gone.
func (s *stream) copy(direction string, dst, src net.Conn, abort func()) int64 {
	_, spliced := src.(*net.TCPConn)
	if _, ok := dst.(*net.TCPConn); !ok {
		spliced = false
	}
	var buf []byte
	// On a TLS hop, gather the records of one step into one write(2), and
	// decrypt every record already received before writing on.
	recordsIn, recordsOut := recordsOf(src), recordsOf(dst)
	if !spliced {
		p := bufPool.Get().(*[]byte)
		defer bufPool.Put(p)
		buf = *p
	}
	var total int64
	for {
		var n int64
		var err error
		if spliced {
			n, err = io.CopyN(dst, src, chunk)
		} else {
			n, err = copyBuffered(dst, src, buf, recordsIn, recordsOut)
		}
		if n > 0 {
			total += n
			s.progress.Add(1)
			if s.onBytes != nil {
				s.onBytes(direction, n)
			}
		}
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) {
			closeWrite(s.log, direction, dst)
			return total
		}
		if !errors.Is(err, net.ErrClosed) {
			s.log.V(1).Info("relay direction failed", "direction", direction, "error", err.Error())
		}
		abort()
		return total
	}
}

// copyBuffered is one step of a copy through buf, used when a side is TLS:
// one Read (several when src is a TLS hop whose next records have already
// arrived), then one Write of all of it, gathered into one write(2) when
// dst is a TLS hop. It returns io.EOF at the end of src. Calling Read and
// Write directly keeps io.Copy's ReaderFrom/WriterTo detours (which pick
// their own 32 KiB buffers) out of the way.
func copyBuffered(dst io.Writer, src io.Reader, buf []byte, in, out *recordConn) (int64, error) {
	n, err := src.Read(buf)
	// A record already buffered decrypts without waiting for the network.
	// Both ends are kvnet, which sends no post-handshake messages (no
	// tickets, no key updates), so every buffered record is data.
	for err == nil && in != nil && len(buf)-n >= maxRecordPlaintext && in.recordBuffered() {
		var m int
		m, err = src.Read(buf[n:])
		n += m
	}
	if n > 0 {
		if out != nil {
			out.hold()
		}
		_, werr := dst.Write(buf[:n])
		if out != nil {
			if ferr := out.flush(); werr == nil {
				werr = ferr
			}
		}
		if werr != nil {
			return int64(n), werr
		}
	}
	if err != nil {
		return int64(n), err
	}
	return int64(n), nil
}

// maxRecordPlaintext is the most plaintext one TLS record carries.
const maxRecordPlaintext = 16 << 10

// closeWriter is what *net.TCPConn and *tls.Conn offer for half-close.
type closeWriter interface{ CloseWrite() error }

func closeWrite(log logr.Logger, direction string, c net.Conn) {
	if cw, ok := c.(closeWriter); ok {
		if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
			log.V(1).Info("half-closing", "direction", direction, "error", err.Error())
		}
		return
	}
	_ = c.Close()
}
