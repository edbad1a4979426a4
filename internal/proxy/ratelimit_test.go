package proxy

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvnet/kvnet/certs"
	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/internal/proxy/caexchange"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// The attack of issue 27, item 3, by rate: one source opening connections
// as fast as it can. Past its burst each new one is closed before any
// handshake work and counted handshake-rate, while a peer proxy on
// another address still authenticates.
func TestHandshakesAreRateLimitedPerSource(t *testing.T) {
	self := certstest.New(t, "cluster-b")
	peerPKI := certstest.New(t, "cluster-a")
	const burst = 4
	ts := &TargetServer{Cert: self.Cert, Peers: []*Peer{{Name: "cluster-a", CAs: peerPKI.Pool}}, Resolver: &staticResolver{},
		HandshakeRate: 0.001, HandshakeBurst: burst, HandshakeTimeout: 3 * time.Second}
	addr, refusals := hopServer(t, ts)
	flooder := "127.0.0.7" // Linux routes all of 127/8 to lo
	before := testutil.ToFloat64(refused.WithLabelValues("target", hop.RefusedHandshakeRate.String()))
	dialFrom := func(host string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(host)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	for range burst {
		c := dialFrom(flooder)
		_, _ = c.Write([]byte{0x16}) // a handshake begun, never finished
	}
	over := dialFrom(flooder)
	_ = over.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := over.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a connection over the source's burst: read %v, want EOF (closed)", err)
	}
	if r := nextRefusal(t, refusals); r != hop.RefusedHandshakeRate {
		t.Fatalf("refusal %s, want %s", r, hop.RefusedHandshakeRate)
	}
	if after := testutil.ToFloat64(refused.WithLabelValues("target", hop.RefusedHandshakeRate.String())); after != before+1 {
		t.Errorf("kvnet_proxy_refused_total{side=target,reason=handshake-rate} went %v -> %v, want +1", before, after)
	}
	// The peer proxy, on another source, is not held back by the flood:
	// its handshake passes and its stream meets the migration check.
	d := &Dialer{Cert: peerPKI.Cert, Mode: hop.ModeTLS, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
	_, err := d.Dial(context.Background(), &Peer{Name: "cluster-b", Addresses: []string{addr}, CAs: self.Pool}, testRoute("mig-x"), 49152)
	var ref *hop.RefusedError
	if !errors.As(err, &ref) || ref.Reason != hop.RefusedUnknownMigration {
		t.Fatalf("the peer beside the flood: got %v, want its stream judged (unknown-migration)", err)
	}
}

// recordingCAs is the hop's CAReceiver for tests: it keeps what it got.
type recordingCAs struct {
	mu     sync.Mutex
	offers int
}

func (r *recordingCAs) ReceiveCAs(context.Context, string, []*x509.Certificate) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.offers++
	return nil
}

// A peer offering CAs in a loop (each offer may rewrite
// kubevirt-external-ca, which virt-operator rolls out to every KubeVirt
// component) gets its burst stored and the rest refused ca-offer-rate.
func TestCAOffersAreRateLimitedPerPeer(t *testing.T) {
	self := certstest.New(t, "cluster-b")
	peerPKI := certstest.New(t, "cluster-a")
	store := &recordingCAs{}
	const burst = 3
	ts := &TargetServer{Cert: self.Cert, Peers: []*Peer{{Name: "cluster-a", CAs: peerPKI.Pool}}, Resolver: &staticResolver{},
		CAs: store, CAOfferEvery: time.Hour, CAOfferBurst: burst}
	addr, refusals := hopServer(t, ts)
	d := &Dialer{Cert: peerPKI.Cert, Mode: hop.ModeTLS}
	peer := &Peer{Name: "cluster-b", Addresses: []string{addr}, CAs: self.Pool}
	ca, err := certs.NewCA("cluster-a-kubevirt", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bundle := caexchange.EncodeCerts([]*x509.Certificate{ca.Cert})
	for i := range burst {
		if err := d.OfferCAs(context.Background(), peer, bundle); err != nil {
			t.Fatalf("offer %d within the burst: %v", i, err)
		}
	}
	err = d.OfferCAs(context.Background(), peer, bundle)
	var ref *hop.RefusedError
	if !errors.As(err, &ref) || ref.Reason != hop.RefusedCAOfferRate {
		t.Fatalf("the offer over the burst: got %v, want refused %s", err, hop.RefusedCAOfferRate)
	}
	if r := nextRefusal(t, refusals); r != hop.RefusedCAOfferRate {
		t.Fatalf("refusal %s, want %s", r, hop.RefusedCAOfferRate)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.offers != burst {
		t.Fatalf("%d offers reached the CA store, want %d", store.offers, burst)
	}
}

// The limiter forgets a key whose bucket is full again when it needs the
// room, and refuses a new key only while every tracked one is draining.
func TestKeyedLimiterStaysBounded(t *testing.T) {
	k := newKeyedLimiter(1, 2)
	now := time.Now()
	for i := range maxRateKeys {
		if !k.allow(string(rune(i+0x100)), now) {
			t.Fatalf("key %d refused while there was room", i)
		}
	}
	if k.allow("new", now) {
		t.Fatal("a new key was tracked beyond maxRateKeys while every bucket drains")
	}
	later := now.Add(10 * time.Second) // every bucket full again
	if !k.allow("new", later) {
		t.Fatal("a new key refused although every tracked bucket is full again")
	}
	if len(k.m) != 1 {
		t.Fatalf("%d keys tracked after the sweep, want 1", len(k.m))
	}
}
