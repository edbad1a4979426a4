package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// listen opens a loopback listener on a free port.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// startRelay serves a relay to target on a fresh loopback listener and
// returns its address and a stop func that waits for Serve to return.
func startRelay(t *testing.T, r *Relay) (string, func() error) {
	t.Helper()
	ln := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				err = errors.New("Serve did not return within 30s of the cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return ln.Addr().String(), stop
}

// hashServer reads everything a connection sends, then answers with the
// sha256 of it followed by reply, and half-closes.
func hashServer(t *testing.T, ln net.Listener, reply func() []byte) {
	t.Helper()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				h := sha256.New()
				if _, err := io.Copy(h, c); err != nil {
					return
				}
				_, _ = c.Write(h.Sum(nil))
				_, _ = c.Write(reply())
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRelayConcurrentStreams pushes several MB through several concurrent
// connections at once, in both directions at the same time, and checks
// every byte by sha256.
func TestRelayConcurrentStreams(t *testing.T) {
	target := listen(t)
	// Echo: the target streams back what it reads while it is still
	// reading, so both directions carry data simultaneously.
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := io.Copy(c, c); err == nil {
					_ = c.(*net.TCPConn).CloseWrite()
				}
			}()
		}
	}()
	addr, stop := startRelay(t, &Relay{Target: target.Addr().String()})

	const conns, size = 6, 3 << 20
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- echoRoundTrip(addr, size+i*4096)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func echoRoundTrip(addr string, size int) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		return err
	}
	n, sum, err := sendAndHash(c, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("echo: %w", err)
	}
	if want := sha256.Sum256(data); n != int64(size) || sum != want {
		return fmt.Errorf("echo of %d bytes came back as %d bytes with sha256 %x, want %x", size, n, sum, want)
	}
	return nil
}

// TestRelayHalfClose: the client closes its write side first and must still
// receive everything the server sends after seeing that EOF.
func TestRelayHalfClose(t *testing.T) {
	target := listen(t)
	tail := randomBytes(t, 2<<20)
	hashServer(t, target, func() []byte { return tail })
	addr, _ := startRelay(t, &Relay{Target: target.Addr().String()})

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sent := randomBytes(t, 1<<20)
	if _, err := c.Write(sent); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading after half-close: %v", err)
	}
	wantSum := sha256.Sum256(sent)
	if len(got) != 32+len(tail) {
		t.Fatalf("got %d bytes back, want %d (32-byte digest + %d-byte tail)", len(got), 32+len(tail), len(tail))
	}
	if !bytes.Equal(got[:32], wantSum[:]) {
		t.Errorf("server saw sha256 %x, client sent %x", got[:32], wantSum)
	}
	if !bytes.Equal(got[32:], tail) {
		t.Errorf("the tail sent after the half-close differs")
	}
}

// TestRelayTargetDown: an unreachable target closes the client connection
// and counts a dial error.
func TestRelayTargetDown(t *testing.T) {
	dead := listen(t)
	deadAddr := dead.Addr().String()
	_ = dead.Close() // nothing listens there any more
	dialFailed := make(chan error, 1)
	addr, _ := startRelay(t, &Relay{Target: deadAddr, DialTimeout: 5 * time.Second, OnDialError: func(err error) { dialFailed <- err }})
	before := testutil.ToFloat64(dialErrors)

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("want the relay to close the connection (EOF), got n=%d err=%v", n, err)
	}
	select {
	case err := <-dialFailed:
		if err == nil {
			t.Fatal("OnDialError called with nil")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("OnDialError was not called")
	}
	if after := testutil.ToFloat64(dialErrors); after < before+1 {
		t.Errorf("kvnet_proxy_dial_errors_total went from %v to %v, want +1", before, after)
	}
}

// TestRelayCancel: cancelling the context closes the listener and aborts
// connections in flight, and Serve returns nil.
func TestRelayCancel(t *testing.T) {
	target := listen(t)
	held := make(chan net.Conn, 1)
	go func() {
		c, err := target.Accept()
		if err == nil {
			held <- c // never answers, never closes: only the cancel can end it
		}
	}()
	addr, stop := startRelay(t, &Relay{Target: target.Addr().String()})

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var tc net.Conn
	select {
	case tc = <-held:
		defer tc.Close()
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never dialed the target")
	}
	if err := stop(); err != nil {
		t.Fatalf("Serve after cancel: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("the relayed connection survived the cancel")
	}
	if c2, err := net.Dial("tcp", addr); err == nil {
		c2.Close()
		t.Error("the listener still accepts after the cancel")
	}
}
