package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// One tenant starting many migrations at once takes its share of the cap
// and no more: another namespace's migration still finds a slot at once,
// and the greedy namespace's next one is refused namespace-over-share.
func TestLimiterGivesEachNamespaceAShare(t *testing.T) {
	l := &Limiter{Max: 4, Wait: 50 * time.Millisecond}
	ctx := context.Background()
	for _, id := range []string{"g1", "g2"} {
		if err := l.Acquire(ctx, "greedy", id); err != nil {
			t.Fatalf("greedy %s within its share: %v", id, err)
		}
	}
	err := l.Acquire(ctx, "greedy", "g3")
	if !errors.Is(err, errNamespaceOverCap) || overCapRefusal(err) != hop.RefusedNamespaceShare {
		t.Fatalf("greedy's third migration of a cap of 4: got %v, want its share (2) refused", err)
	}
	if err := l.Acquire(ctx, "greedy", "g1"); err != nil {
		t.Fatalf("a further stream of a migration holding its slot must pass: %v", err)
	}
	for _, id := range []string{"o1", "o2"} {
		if err := l.Acquire(ctx, "other", id); err != nil {
			t.Fatalf("another namespace beside the greedy one: %s: %v", id, err)
		}
	}
	if err := l.Acquire(ctx, "third", "t1"); !errors.Is(err, errOverCap) || overCapRefusal(err) != hop.RefusedOverCap {
		t.Fatalf("a fifth migration of a cap of 4: got %v, want over-cap", err)
	}
	if l.Waiting() != 0 {
		t.Fatalf("%d streams still counted as waiting after their waits ended", l.Waiting())
	}
	// A freed slot of greedy's share is greedy's to take again.
	l.Release("g2")
	if err := l.Acquire(ctx, "greedy", "g3"); err != nil {
		t.Fatalf("greedy within its share again: %v", err)
	}
}

// A stream queued behind the cap on the target side outlives the
// handshake timeout: it is accepted, and carries its bytes, once the slot
// frees. Before, the connection's handshake deadline (10 s) ran out in the
// 30 s queue and the stream failed anyway.
func TestQueuedStreamOutlivesTheHandshakeTimeout(t *testing.T) {
	a, b := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-b")
	echo := echoServer(t)
	const handshake = 200 * time.Millisecond
	lim := &Limiter{Max: 1, Wait: time.Minute}
	port := portOf(echo.Addr())
	ts := &TargetServer{
		Cert: b.Cert, Peers: []*Peer{{Name: "cluster-a", CAs: a.Pool}}, Limiter: lim, HandshakeTimeout: handshake,
		Resolver: &staticResolver{eps: map[string]Endpoint{"mig-2": {Address: "127.0.0.1", Ports: map[string]int{port: 0}}}},
	}
	addr, refusals := hopServer(t, ts)
	// Another migration holds the only slot.
	if err := lim.Acquire(context.Background(), "ns", "mig-1"); err != nil {
		t.Fatal(err)
	}
	d := &Dialer{Cert: a.Cert, Mode: hop.ModeTLS, Timeout: handshake, VerdictWait: VerdictWait(lim.Wait, 0)}
	peer := &Peer{Name: "cluster-b", Addresses: []string{addr}, CAs: b.Pool}
	p, _ := net.LookupPort("tcp", port)
	got := make(chan net.Conn, 1)
	errs := make(chan error, 1)
	go func() {
		c, err := d.Dial(context.Background(), peer, testRoute("mig-2"), uint16(p))
		if err != nil {
			errs <- err
			return
		}
		got <- c
	}()
	for lim.Waiting() == 0 {
		select {
		case err := <-errs:
			t.Fatalf("the stream failed before it queued: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	// What is tested is the passage of time: the stream stays queued for
	// several handshake timeouts before the slot frees.
	time.Sleep(5 * handshake)
	lim.Release("mig-1")
	var c net.Conn
	select {
	case c = <-got:
	case err := <-errs:
		t.Fatalf("the queued stream was given up: %v", err)
	case r := <-refusals:
		t.Fatalf("the queued stream was refused: %s", r)
	case <-time.After(time.Minute):
		t.Fatal("no verdict a minute after the slot freed")
	}
	defer c.Close()
	if err := echoBack(c, []byte("after the queue")); err != nil {
		t.Fatalf("the accepted stream: %v", err)
	}
}

// echoServer is a listener that sends every connection's bytes back.
func echoServer(t *testing.T) net.Listener {
	ln := listenOn(t, "127.0.0.1")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln
}

func echoBack(c net.Conn, msg []byte) error {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	back := make([]byte, len(msg))
	if _, err := io.ReadFull(c, back); err != nil {
		return err
	}
	if string(back) != string(msg) {
		return errors.New("echo returned other bytes")
	}
	return nil
}

// One relay listener holds at most MaxConns clients: the next is closed at
// once, counted too-many-connections, and the ones within the cap still
// carry their bytes.
func TestRelayConnectionsAreCapped(t *testing.T) {
	echo := echoServer(t)
	refusals := make(chan hop.RefusalCode, 8)
	r := &Relay{Target: echo.Addr().String(), MaxConns: 2, OnRefused: func(x hop.RefusalCode) { refusals <- x }}
	ln := listenOn(t, "127.0.0.1")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	before := testutil.ToFloat64(refused.WithLabelValues("source", hop.RefusedTooManyConnections.String()))
	var held []net.Conn
	for i := range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := echoBack(c, []byte{byte(i)}); err != nil {
			t.Fatalf("client %d within the cap: %v", i, err)
		}
		held = append(held, c)
	}
	extra, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := extra.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("the client over the cap: want it closed (EOF), got n=%d err=%v", n, err)
	}
	if got := <-refusals; got != hop.RefusedTooManyConnections {
		t.Fatalf("refusal %s, want %s", got, hop.RefusedTooManyConnections)
	}
	if after := testutil.ToFloat64(refused.WithLabelValues("source", hop.RefusedTooManyConnections.String())); after != before+1 {
		t.Errorf("kvnet_proxy_refused_total{side=source,reason=too-many-connections} went %v -> %v, want +1", before, after)
	}
	for i, c := range held {
		if err := echoBack(c, []byte("still relayed")); err != nil {
			t.Fatalf("client %d after the refusal: %v", i, err)
		}
	}
	// A slot freed is a slot again.
	_ = held[0].Close()
	for {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		err = echoBack(c, []byte("again"))
		_ = c.Close()
		if err == nil {
			break
		}
		<-refusals // the relay had not seen the close yet
	}
}
