package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// staticResolver answers for the migrations it holds.
type staticResolver struct {
	mu  sync.Mutex
	eps map[string]Endpoint
}

func (r *staticResolver) Resolve(_ context.Context, _ string, rt hop.Route) (Endpoint, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ep, ok := r.eps[rt.MigrationID]
	return ep, ok, nil
}

func (r *staticResolver) Receiver(_ context.Context, _ string, rt hop.Route) (types.NamespacedName, types.UID, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ep, ok := r.eps[rt.MigrationID]
	return ep.Migration, ep.UID, ok, nil
}

// loopback returns 127.0.0.<n> when the kernel lets us bind it (Linux
// routes all of 127/8 to lo), else 127.0.0.1, so that each role of a test
// has its own address where possible.
func loopback(t testing.TB, n int) string {
	a := "127.0.0." + strconv.Itoa(n)
	ln, err := net.Listen("tcp", a+":0")
	if err != nil {
		return "127.0.0.1"
	}
	_ = ln.Close()
	return a
}

func listenOn(t testing.TB, host string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

func portOf(a net.Addr) string { return strconv.Itoa(a.(*net.TCPAddr).Port) }

// chain is the two-proxy path of one migration on loopback: client ->
// source listener (Relay) -> hop (mutual TLS) -> TargetServer -> target.
type chain struct {
	sourceAddr string // where the "source virt-handler" dials
	target     *TargetServer
	hopAddr    string
	refusals   chan hop.RefusalCode
	stop       func()
}

type chainOpts struct {
	mode        hop.Mode
	targetPorts []string // announced ports; the first is what the relay asks for
	targetHost  string
	limiter     *Limiter
	idle        time.Duration
}

func startChain(t testing.TB, src, dst *certstest.PKI, o chainOpts) *chain {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	ports := map[string]int{}
	for i, p := range o.targetPorts {
		ports[p] = []int{0, 49152, 49153}[i%3]
	}
	ch := &chain{refusals: make(chan hop.RefusalCode, 64)}
	ch.target = &TargetServer{
		Cert:     dst.Cert,
		Peers:    []*Peer{{Name: "cluster-a", CAs: src.Pool}},
		Resolver: &staticResolver{eps: map[string]Endpoint{"mig-1": {Address: o.targetHost, Ports: ports}}},
		Limiter:  o.limiter, IdleTimeout: o.idle,
		OnRefused: func(_ string, r hop.RefusalCode) { ch.refusals <- r },
		// The chain measures the data path: its benchmarks open far more
		// streams a second from one source than a peer would.
		HandshakeRate: 1e9, HandshakeBurst: 1 << 20,
	}
	hopLn := listenOn(t, loopback(t, 3))
	ch.hopAddr = hopLn.Addr().String()
	wg.Add(1)
	go func() { defer wg.Done(); _ = ch.target.Serve(ctx, hopLn) }()

	peer := &Peer{Name: "cluster-b", Addresses: []string{ch.hopAddr}, CAs: dst.Pool}
	d := &Dialer{Cert: src.Cert, Mode: o.mode}
	port, _ := strconv.Atoi(o.targetPorts[0])
	r := &Relay{
		MigrationID: "mig-1", IdleTimeout: o.idle, MaxConns: 1 << 20, // see HandshakeRate above
		Upstream: func(ctx context.Context) (net.Conn, error) {
			return d.Dial(ctx, peer, testRoute("mig-1"), uint16(port))
		},
		OnRefused: func(r hop.RefusalCode) { ch.refusals <- r },
	}
	ln := listenOn(t, loopback(t, 2))
	ch.sourceAddr = ln.Addr().String()
	wg.Add(1)
	go func() { defer wg.Done(); _ = r.Serve(ctx, ln) }()
	var once sync.Once
	ch.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(ch.stop)
	return ch
}

// sendAndHash writes all of send to c and half-closes it, while reading
// what comes back until EOF: the byte count and sha256 of what came back.
func sendAndHash(c net.Conn, send io.Reader) (int64, [32]byte, error) {
	werr := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, send)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	h := sha256.New()
	n, err := io.Copy(h, c)
	if err != nil {
		return n, [32]byte{}, fmt.Errorf("reading: %w", err)
	}
	if err := <-werr; err != nil {
		return n, [32]byte{}, fmt.Errorf("writing: %w", err)
	}
	return n, [32]byte(h.Sum(nil)), nil
}

// streamBytes is a deterministic pseudo-random byte source: a 1 GiB run
// never holds 1 GiB in memory, and both ends can hash what they saw.
func streamBytes(seed uint64, n int64) io.Reader {
	return io.LimitReader(&chachaReader{r: rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})}, n)
}

type chachaReader struct{ r *rand.ChaCha8 }

func (c *chachaReader) Read(p []byte) (int, error) { return c.r.Read(p) }

func sumOf(r io.Reader) [32]byte {
	h := sha256.New()
	_, _ = io.Copy(h, r)
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// hashPeer is the fake target virt-handler: it sends its own stream while
// it hashes what it receives, and reports the digest and byte count.
type hashResult struct {
	sum [32]byte
	n   int64
	err error
}

func hashPeer(t testing.TB, ln net.Listener, send int64, seed uint64) chan hashResult {
	out := make(chan hashResult, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			out <- hashResult{err: err}
			return
		}
		defer c.Close()
		werr := make(chan error, 1)
		go func() {
			_, err := io.Copy(c, streamBytes(seed, send))
			if err == nil {
				err = c.(*net.TCPConn).CloseWrite()
			}
			werr <- err
		}()
		h := sha256.New()
		n, err := io.Copy(h, c)
		if err == nil {
			err = <-werr
		}
		var s [32]byte
		copy(s[:], h.Sum(nil))
		out <- hashResult{sum: s, n: n, err: err}
	}()
	return out
}

// bigSize is the byte count of the full-size runs: 1 GiB each direction,
// or KVNET_PROXY_TEST_BYTES.
func bigSize(t testing.TB) int64 {
	if v := os.Getenv("KVNET_PROXY_TEST_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			t.Fatalf("KVNET_PROXY_TEST_BYTES=%q: want a positive byte count", v)
		}
		return n
	}
	return 1 << 30
}

// TestChainByteExact sends 1 GiB each way at once through both proxies, in
// each hop mode, and compares SHA-256 digests at both ends.
func TestChainByteExact(t *testing.T) {
	size := bigSize(t)
	for _, mode := range []hop.Mode{hop.ModeAuthenticated, hop.ModeTLS} {
		t.Run(mode.String(), func(t *testing.T) {
			a, b := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-b")
			tln := listenOn(t, "127.0.0.1")
			ch := startChain(t, a, b, chainOpts{mode: mode, targetHost: "127.0.0.1", targetPorts: []string{portOf(tln.Addr())}})
			res := hashPeer(t, tln, size, 2)

			c, err := net.Dial("tcp", ch.sourceAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			n, sum, err := sendAndHash(c, streamBytes(1, size))
			if err != nil {
				t.Fatalf("through both proxies: %v", err)
			}
			r := <-res
			if r.err != nil {
				t.Fatalf("target: %v", r.err)
			}
			if want := sumOf(streamBytes(1, size)); r.n != size || r.sum != want {
				t.Errorf("to target: %d bytes sha256 %x, want %d bytes %x", r.n, r.sum, size, want)
			}
			if want := sumOf(streamBytes(2, size)); n != size || sum != want {
				t.Errorf("from target: %d bytes sha256 %x, want %d bytes %x", n, sum, size, want)
			}
		})
	}
}

// TestChainHalfClose: the client ends its direction first and still gets
// everything the target sends after seeing that EOF, in both modes.
func TestChainHalfClose(t *testing.T) {
	for _, mode := range []hop.Mode{hop.ModeAuthenticated, hop.ModeTLS} {
		t.Run(mode.String(), func(t *testing.T) {
			a, b := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-b")
			tln := listenOn(t, "127.0.0.1")
			ch := startChain(t, a, b, chainOpts{mode: mode, targetHost: "127.0.0.1", targetPorts: []string{portOf(tln.Addr())}})
			tail := bytes.Repeat([]byte("after-eof "), 100000)
			go func() {
				c, err := tln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				h := sumOf(c) // until the client's EOF
				_, _ = c.Write(h[:])
				_, _ = c.Write(tail)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
			c, err := net.Dial("tcp", ch.sourceAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			sent := bytes.Repeat([]byte("before-eof "), 200000)
			if _, err := c.Write(sent); err != nil {
				t.Fatal(err)
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
			got, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("reading after the half-close: %v", err)
			}
			want := sha256.Sum256(sent)
			if len(got) != 32+len(tail) || !bytes.Equal(got[:32], want[:]) || !bytes.Equal(got[32:], tail) {
				t.Fatalf("after the half-close got %d bytes (digest ok: %v), want the 32-byte digest and the %d-byte tail",
					len(got), len(got) >= 32 && bytes.Equal(got[:32], want[:]), len(tail))
			}
		})
	}
}

// TestChainPeerResetNoLeak: the target resets mid-stream; the client sees
// its connection end, and once the proxies stop no goroutine is left.
func TestChainPeerResetNoLeak(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, mode := range []hop.Mode{hop.ModeAuthenticated, hop.ModeTLS} {
		t.Run(mode.String(), func(t *testing.T) {
			a, b := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-b")
			tln := listenOn(t, "127.0.0.1")
			ch := startChain(t, a, b, chainOpts{mode: mode, targetHost: "127.0.0.1", targetPorts: []string{portOf(tln.Addr())}})
			reset := make(chan struct{})
			go func() {
				c, err := tln.Accept()
				if err != nil {
					return
				}
				_, _ = io.CopyN(io.Discard, c, 4<<20)
				_ = c.(*net.TCPConn).SetLinger(0) // close with RST
				_ = c.Close()
				close(reset)
			}()
			c, err := net.Dial("tcp", ch.sourceAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			werr := make(chan error, 1)
			go func() { _, err := io.Copy(c, streamBytes(3, 1<<40)); werr <- err }()
			<-reset
			select {
			case err := <-werr:
				if err == nil {
					t.Fatal("the endless write ended without an error after the target reset")
				}
			case <-time.After(60 * time.Second):
				t.Fatal("the client connection survived the target's reset")
			}
			_ = c.Close()
			ch.stop()
		})
	}
}

// TestChainSlowReader: a target that reads slowly gets every byte, and the
// fast writer is held back by TCP flow control instead of the proxies
// buffering without bound.
func TestChainSlowReader(t *testing.T) {
	for _, mode := range []hop.Mode{hop.ModeAuthenticated, hop.ModeTLS} {
		t.Run(mode.String(), func(t *testing.T) {
			a, b := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-b")
			tln := listenOn(t, "127.0.0.1")
			ch := startChain(t, a, b, chainOpts{mode: mode, targetHost: "127.0.0.1", targetPorts: []string{portOf(tln.Addr())}})
			const size = 16 << 20
			res := make(chan hashResult, 1)
			go func() {
				c, err := tln.Accept()
				if err != nil {
					res <- hashResult{err: err}
					return
				}
				defer c.Close()
				h := sha256.New()
				var n int64
				buf := make([]byte, 64<<10)
				for {
					k, err := c.Read(buf)
					h.Write(buf[:k])
					n += int64(k)
					if err != nil {
						break
					}
					time.Sleep(2 * time.Millisecond) // the slow reader itself, not a wait for a condition
				}
				var s [32]byte
				copy(s[:], h.Sum(nil))
				res <- hashResult{sum: s, n: n}
			}()
			c, err := net.Dial("tcp", ch.sourceAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.Copy(c, streamBytes(4, size)); err != nil {
				t.Fatal(err)
			}
			_ = c.(*net.TCPConn).CloseWrite()
			r := <-res
			if want := sumOf(streamBytes(4, size)); r.err != nil || r.n != size || r.sum != want {
				t.Fatalf("slow reader got %d bytes sha256 %x (err %v), want %d bytes %x", r.n, r.sum, r.err, size, want)
			}
		})
	}
}

// TestChainTargetRefused: the target virt-handler is not listening; the
// target proxy refuses with target-unreachable, the source proxy closes
// the client connection, and both count it.
func TestChainTargetRefused(t *testing.T) {
	for _, mode := range []hop.Mode{hop.ModeAuthenticated, hop.ModeTLS} {
		t.Run(mode.String(), func(t *testing.T) {
			a, b := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-b")
			dead := listenOn(t, "127.0.0.1")
			port := portOf(dead.Addr())
			_ = dead.Close()
			ch := startChain(t, a, b, chainOpts{mode: mode, targetHost: "127.0.0.1", targetPorts: []string{port}})
			before := testutil.ToFloat64(refused.WithLabelValues("target", hop.RefusedTargetUnreachable.String()))
			c, err := net.Dial("tcp", ch.sourceAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
			if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
				t.Fatalf("want the source proxy to close the client (EOF), got n=%d err=%v", n, err)
			}
			select {
			case r := <-ch.refusals:
				if r != hop.RefusedTargetUnreachable {
					t.Fatalf("refusal %s, want %s", r, hop.RefusedTargetUnreachable)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no refusal recorded")
			}
			if after := testutil.ToFloat64(refused.WithLabelValues("target", hop.RefusedTargetUnreachable.String())); after != before+1 {
				t.Errorf("kvnet_proxy_refused_total{side=target,reason=target-unreachable} went %v -> %v, want +1", before, after)
			}
		})
	}
}
