package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// flakyListener fails its first Accepts with EMFILE, as a process out of
// file descriptors does.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	return l.Listener.Accept()
}

// TestRelayAcceptErrorsBackOff: accept errors do not end the relay (issue
// 11: "a relay accept error ends the relay for good"); they are counted and
// the relay serves again once they clear.
func TestRelayAcceptErrorsBackOff(t *testing.T) {
	target := listen(t)
	hashServer(t, target, func() []byte { return nil })
	fl := &flakyListener{Listener: listen(t)}
	fl.fails.Store(5)
	before := testutil.ToFloat64(acceptErrors)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Relay{Target: target.Addr().String()}).Serve(ctx, fl) }()
	defer func() { cancel(); <-done }()

	if err := echoHash(fl.Addr().String()); err != nil {
		t.Fatalf("after accept errors: %v", err)
	}
	if after := testutil.ToFloat64(acceptErrors); after < before+5 {
		t.Errorf("kvnet_proxy_accept_errors_total %v -> %v, want +5", before, after)
	}
}

// TestRelayReopensDeadListener: a listener closed underneath the relay
// (not by its context) is reopened on the same address, so the published
// port keeps working.
func TestRelayReopensDeadListener(t *testing.T) {
	target := listen(t)
	hashServer(t, target, func() []byte { return nil })
	ln := listen(t)
	addr := ln.Addr().String()
	before := testutil.ToFloat64(listenerReopens)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Relay{Target: target.Addr().String()}).Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	if err := echoHash(addr); err != nil {
		t.Fatal(err)
	}
	_ = ln.Close()
	deadline := time.Now().Add(30 * time.Second)
	for testutil.ToFloat64(listenerReopens) < before+1 {
		if time.Now().After(deadline) {
			t.Fatal("the listener was not reopened")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := echoHash(addr); err != nil {
		t.Fatalf("after the reopen: %v", err)
	}
}

func echoHash(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		return err
	}
	_ = c.(*net.TCPConn).CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	b := make([]byte, 32)
	if _, err := io.ReadFull(c, b); err != nil {
		return errors.Join(errors.New("no digest back"), err)
	}
	return nil
}

// TestLimiter: the cap counts migrations, not streams; a migration over it
// waits, gets a freed slot, or is refused after the wait.
func TestLimiter(t *testing.T) {
	l := &Limiter{Max: 2, PerNamespace: 2, Wait: 200 * time.Millisecond}
	ctx := context.Background()
	for _, id := range []string{"a", "a", "b"} {
		if err := l.Acquire(ctx, "ns", id); err != nil {
			t.Fatalf("acquire %s: %v", id, err)
		}
	}
	if err := l.Acquire(ctx, "ns", "c"); !errors.Is(err, errOverCap) {
		t.Fatalf("third migration: got %v, want over the cap", err)
	}
	if err := l.Acquire(ctx, "ns", "b"); err != nil {
		t.Fatalf("another stream of a migration holding a slot must not wait: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- (&Limiter{}).Acquire(ctx, "ns", "x") }()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	l.Wait = 30 * time.Second
	go func() { got <- l.Acquire(ctx, "ns", "c") }()
	l.Release("b")
	l.Release("b") // b's last stream ends: c gets its slot
	if err := <-got; err != nil {
		t.Fatalf("waiting migration: %v", err)
	}
}
