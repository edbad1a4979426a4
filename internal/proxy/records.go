package proxy

import (
	"crypto/tls"
	"errors"
	"net"
	"sync"
)

// recordConn is the TCP connection under the hop's TLS layer. crypto/tls
// writes every record (16 KiB at most) with its own write(2) and reads
// records one at a time, so in tls mode a proxy made two system calls per
// 16 KiB on the hop side and, on the target side, one write(2) per record
// towards virt-handler. System calls, not AES-GCM, were most of tls
// mode's CPU (see docs/migration-proxy.md, "Line rate"). recordConn lets
// the relay batch them:
//
//   - writes made between hold and flush are gathered and sent with one
//     write(2), so encrypting 256 KiB costs one system call, not sixteen;
//   - reads fill a buffer with as much as the socket has (up to recvBuf),
//     and buffered tells whether a whole record is already there, so the
//     relay can decrypt several records before it writes them on.
//
// Nothing else changes: outside hold, writes go straight through, and
// records are never reordered, merged or split (TLS sees the same byte
// stream).
type recordConn struct {
	*net.TCPConn

	rmu     sync.Mutex
	rbuf    []byte // received, not yet read by TLS: rbuf[roff:]
	roff    int
	recLeft int // bytes of the record TLS is reading that Read has not handed out
	// rsize is the buffer fill reads into: handshakeRecvBuf until the
	// handshake has succeeded (authenticated), then recvBuf.
	rsize int

	wmu     sync.Mutex
	holding bool
	wbuf    []byte
}

const (
	// recvBuf is the most one read(2) takes from the hop: as much as a
	// relay step moves in tls mode.
	recvBuf = tlsBuffer
	// handshakeRecvBuf is what a connection holds for its received bytes
	// before its peer is authenticated. An unauthenticated client must not
	// cost the relay step's 256 KiB (1000 stalled handshakes held 256 MiB
	// when it did); the handshake's messages fit a few reads of this.
	handshakeRecvBuf = 2 << 10
	// tlsRecordHeader is a TLS record's header: type, version, length.
	tlsRecordHeader = 5
)

// underTLS returns what the hop's TLS layer runs on: a recordConn over a
// TCP connection, else (a test's pipe) the connection itself, with nil.
func underTLS(raw net.Conn) (net.Conn, *recordConn) {
	if tc, ok := raw.(*net.TCPConn); ok {
		rc := &recordConn{TCPConn: tc}
		return rc, rc
	}
	return raw, nil
}

// recordsOf returns the recordConn under a hop's TLS connection, or nil
// for any other connection.
func recordsOf(c net.Conn) *recordConn {
	if tc, ok := c.(*tls.Conn); ok {
		rc, _ := tc.NetConn().(*recordConn)
		return rc
	}
	return nil
}

// Read hands TLS buffered bytes, never past the end of the record it is
// reading, so that the records after it stay here where recordBuffered
// sees them (crypto/tls would otherwise pull them into its own buffer).
// It reads from the socket only when it has nothing, or only part of a
// record header, to hand out.
func (c *recordConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		b := c.rbuf[c.roff:]
		if len(b) == 0 || (c.recLeft == 0 && len(b) < tlsRecordHeader) {
			if err := c.fill(); err != nil {
				return 0, err
			}
			continue
		}
		if c.recLeft == 0 {
			c.recLeft = tlsRecordHeader + recordLen(b)
		}
		n := copy(p, b[:min(len(b), c.recLeft)])
		c.roff += n
		c.recLeft -= n
		return n, nil
	}
}

// authenticated lets the buffer grow to recvBuf: call it once the TLS
// handshake has succeeded, so only an authenticated peer gets the big
// buffer (on the next read; what is buffered now is kept).
func (c *recordConn) authenticated() {
	c.rmu.Lock()
	c.rsize = recvBuf
	c.rmu.Unlock()
}

// fill moves what is left to the front of the buffer and reads once more
// behind it.
func (c *recordConn) fill() error {
	size := c.rsize
	if size == 0 {
		size = handshakeRecvBuf
	}
	if cap(c.rbuf) < size {
		nb := make([]byte, len(c.rbuf)-c.roff, size)
		copy(nb, c.rbuf[c.roff:])
		c.rbuf, c.roff = nb, 0
	}
	k := copy(c.rbuf[:cap(c.rbuf)], c.rbuf[c.roff:])
	n, err := c.TCPConn.Read(c.rbuf[k:cap(c.rbuf)])
	c.rbuf, c.roff = c.rbuf[:k+n], 0
	if n > 0 {
		return nil
	}
	return err
}

// recordBuffered reports whether a whole TLS record is buffered, so that
// TLS can return its plaintext without waiting for the network.
func (c *recordConn) recordBuffered() bool {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	b := c.rbuf[c.roff:]
	if c.recLeft != 0 || len(b) < tlsRecordHeader {
		return false
	}
	return len(b) >= tlsRecordHeader+recordLen(b)
}

// recordLen is the length a record header gives to what follows it.
func recordLen(hdr []byte) int { return int(hdr[3])<<8 | int(hdr[4]) }

// unread is how many received bytes TLS has not read: a stream that turns
// to plain bytes after the TLS preamble (authenticated mode) must find
// none, or they would be lost to the splice.
func (c *recordConn) unread() int {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	return len(c.rbuf) - c.roff
}

// Write sends p, or gathers it while holding.
func (c *recordConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.holding {
		return c.TCPConn.Write(p)
	}
	c.wbuf = append(c.wbuf, p...)
	return len(p), nil
}

// hold starts gathering writes; flush sends them with one write(2) and
// stops gathering.
func (c *recordConn) hold() {
	c.wmu.Lock()
	c.holding = true
	c.wmu.Unlock()
}

func (c *recordConn) flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.holding = false
	if len(c.wbuf) == 0 {
		return nil
	}
	_, err := c.TCPConn.Write(c.wbuf)
	c.wbuf = c.wbuf[:0]
	return err
}

// errUnreadAfterPreamble: the peer sent bytes after its preamble before
// the verdict, which the protocol forbids.
var errUnreadAfterPreamble = errors.New("bytes arrived after the preamble before the verdict")
