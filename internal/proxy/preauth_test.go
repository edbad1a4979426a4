package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvnet/kvnet/certs"
	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// hopServer runs a TargetServer on loopback and reports its refusals.
func hopServer(t *testing.T, ts *TargetServer) (addr string, refusals chan hop.RefusalCode) {
	t.Helper()
	refusals = make(chan hop.RefusalCode, 64)
	ts.Log = logr.Discard()
	ts.OnRefused = func(_ string, r hop.RefusalCode) { refusals <- r }
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = ts.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String(), refusals
}

func nextRefusal(t *testing.T, ch chan hop.RefusalCode) hop.RefusalCode {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no refusal")
		return 0
	}
}

// The attack of issue 27, item 4: two peers whose certificates come from
// one organisation CA. A leaf of that CA is the peer its SAN names, not
// the first peer whose CA verifies it: cluster-c's leaf is never taken for
// cluster-a, and a leaf of some other workload of the same CA is refused.
func TestPeerKnownByNameNotByCA(t *testing.T) {
	self := certstest.New(t, "cluster-b")
	org, err := certs.NewCA("org-ca", time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(org.Cert)
	a := &Peer{Name: "cluster-a", CAs: pool}
	c := &Peer{Name: "cluster-c", CAs: pool}
	ts := &TargetServer{Cert: self.Cert, Peers: []*Peer{a, c}, Resolver: &staticResolver{}}
	leaf := func(name string) []*x509.Certificate {
		kp, err := certs.NewPeer(org, []string{name}, nil, time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		x, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return []*x509.Certificate{x}
	}
	if p := ts.peerOf(leaf("cluster-a")); p != a {
		t.Errorf("cluster-a's leaf is %v, want cluster-a", p)
	}
	if p := ts.peerOf(leaf("cluster-c")); p != c {
		t.Errorf("cluster-c's leaf is %v, want cluster-c (not the first peer whose CA verifies it)", p)
	}
	if p := ts.peerOf(leaf("some-other-workload")); p != nil {
		t.Errorf("another workload's leaf of the organisation CA was taken for peer %s", p.Name)
	}

	// Over a real connection the look-alike's handshake is refused.
	addr, refusals := hopServer(t, ts)
	kp, err := certs.NewPeer(org, []string{"some-other-workload"}, nil, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: self.Pool, ServerName: "cluster-b"})
	if err == nil {
		// TLS 1.3 reports a refused client certificate on the first read.
		_, err = conn.Read(make([]byte, 1))
		_ = conn.Close()
	}
	if err == nil {
		t.Fatal("the look-alike's connection was accepted")
	}
	if r := nextRefusal(t, refusals); r != hop.RefusedUntrustedPeer {
		t.Fatalf("refusal %s, want %s", r, hop.RefusedUntrustedPeer)
	}
}

// The attack of issue 27, item 3: raw connections that open and never
// finish a handshake. At MaxPendingHandshakes a new connection closes the
// oldest pending one, counted and logged, instead of being refused itself:
// a peer's handshake beside the stalled ones succeeds, the oldest stalled
// connection is closed, and the others still wait, each costing its small
// pre-handshake buffer only.
func TestPendingHandshakesAreCapped(t *testing.T) {
	self := certstest.New(t, "cluster-b")
	peer := certstest.New(t, "cluster-a")
	const limit = 8
	ts := &TargetServer{Cert: self.Cert, Peers: []*Peer{{Name: "cluster-a", CAs: peer.Pool}}, Resolver: &staticResolver{},
		MaxPendingHandshakes: limit, HandshakeTimeout: time.Minute}
	addr, refusals := hopServer(t, ts)
	var stalled []net.Conn
	t.Cleanup(func() {
		for _, c := range stalled {
			_ = c.Close()
		}
	})
	for range limit {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		// One byte of a ClientHello: the server is now reading.
		if _, err := c.Write([]byte{0x16}); err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, c)
		// In order, so that the first is the oldest: wait for each.
		waitPending(t, ts, len(stalled))
	}
	if got := testutil.ToFloat64(pendingHandshakes); got != limit {
		t.Errorf("kvnet_proxy_pending_handshakes is %v, want %d", got, limit)
	}

	conn, err := tls.Dial("tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{peer.Cert},
		RootCAs: self.Pool, ServerName: "cluster-b"})
	if err != nil {
		t.Fatalf("a peer's handshake beside %d stalled ones: %v", limit, err)
	}
	defer conn.Close()
	if r := nextRefusal(t, refusals); r != hop.RefusedTooManyHandshakes {
		t.Fatalf("refusal %s, want %s", r, hop.RefusedTooManyHandshakes)
	}
	_ = stalled[0].SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := stalled[0].Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the oldest stalled connection: read %v, want it closed", err)
	}
	// The peer's handshake ends (the server has checked its certificate)
	// and leaves the other stalled ones pending.
	waitPending(t, ts, limit-1)
	if got := testutil.ToFloat64(pendingHandshakes); got != limit-1 {
		t.Errorf("kvnet_proxy_pending_handshakes is %v, want %d", got, limit-1)
	}
	select {
	case r := <-refusals:
		t.Errorf("a second refusal, %s: only the oldest stalled connection is closed", r)
	default:
	}
}

// waitPending waits until ts has n handshakes pending: a connection counts
// once its handler runs, and stops counting once its handshake returns.
func waitPending(t *testing.T, ts *TargetServer, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for ts.pending.len() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d handshakes pending, want %d", ts.pending.len(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Before the handshake has authenticated its peer, a hop connection reads
// into a buffer of handshakeRecvBuf, not the relay's 256 KiB; afterwards
// it gets the full buffer.
func TestRecordBufferSmallUntilAuthenticated(t *testing.T) {
	srv, cli := tcpPair(t)
	_, rc := underTLS(srv)
	if rc == nil {
		t.Fatal("no recordConn over a TCP connection")
	}
	hello := make([]byte, 100<<10) // a long record, as a hostile client would send
	hello[0], hello[3], hello[4] = 0x16, 0xff, 0xff
	go func() { _, _ = cli.Write(hello) }()
	buf := make([]byte, 64<<10)
	if _, err := rc.Read(buf); err != nil {
		t.Fatal(err)
	}
	if c := cap(rc.rbuf); c > handshakeRecvBuf {
		t.Fatalf("an unauthenticated connection holds a %d-byte buffer, want at most %d", c, handshakeRecvBuf)
	}
	rc.authenticated()
	for cap(rc.rbuf) < recvBuf {
		if _, err := rc.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
}

func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	return server, client
}
