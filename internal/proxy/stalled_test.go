package proxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// The attack of issue 27, item 3, as a neighbour on the cross-cluster
// network would run it against a target proxy with the real defaults:
// 1000 connections, each from its own loopback address (so the per-source
// rate limit is not what stops them), each sending a whole ClientHello
// and never answering the server's flight, so the proxy holds the TLS
// state of a handshake half done (its key share and signature computed,
// the client's certificate awaited). The pending-handshake cap holds 256
// of them and closes the oldest as each further one arrives (744
// too-many-handshakes). Beside them a migration stream of 256 MiB goes
// source relay -> hop -> target, in tls mode (the default, and the mode
// with user-space buffers), and must arrive byte-exact: its handshake
// displaces one stalled handshake and succeeds, and the other 255 are
// still pending after it. The target proxy's peak RSS must stay under
// 64 MiB (not checked under the race detector, whose own memory would be
// most of it). The same stream through a second target process with no
// attack gives the baseline the attack's cost is read against; the log
// gives both, and the Go runtime's account of where the memory is.
//
// The target is a child process (the test binary in the kvnet-target
// role, roles_test.go), so its RSS is its own, with GOGC and GOMEMLIMIT
// unset. Its one change from the defaults is a handshake timeout longer
// than the test: the stalled handshakes stay pending for the whole
// stream, however slow the machine, which is the attacker's best case
// (one that waits out the 10 s default only has to reconnect).
func TestStalledHandshakesBesideAMigration(t *testing.T) {
	const (
		attackers = 1000
		size      = 256 << 20
		rssLimit  = 64 << 20
	)
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	dir := t.TempDir()
	writeProxyCerts(t, dir)
	hello := clientHello(t)
	sources := attackerAddrs(t, attackers)

	t0 := time.Now()
	base := migrateThroughChild(t, "baseline", dir, nil, size)
	attacked := migrateThroughChild(t, "attacked", dir, func(tgt *child) {
		stallHandshakes(t, tgt.ready.Addrs[0], hello, sources)
		// Every connection has reached its handler once those held and
		// those closed add up to all of them.
		m := waitMetrics(t, tgt.ready.Addrs[1], func(m metricValues) bool {
			return m.pending()+m.refused("too-many-handshakes") == attackers
		})
		if got := m.refused("handshake-rate"); got != 0 {
			t.Fatalf("%v connections refused handshake-rate: the per-source limit, not the pending cap, stopped the attack", got)
		}
		if got := m.pending(); got != DefaultMaxPendingHandshakes {
			t.Fatalf("%v stalled handshakes pending, want the cap, %d", got, DefaultMaxPendingHandshakes)
		}
		t.Logf("attack: %d stalled handshakes from %d addresses: %v held, %v refused too-many-handshakes; target RSS now %.1f MiB (%s)",
			attackers, len(sources), m.pending(), m.refused("too-many-handshakes"), mib(tgt.rss()), m.goMemory())
	}, size)

	// The stream's own handshake took one place, and left it once it was
	// authenticated: every other place is still an attacker's, so the
	// stream passed while they were held.
	m := waitMetrics(t, attacked.tgt.ready.Addrs[1], func(m metricValues) bool {
		return m.refused("too-many-handshakes") == attackers-DefaultMaxPendingHandshakes+1
	})
	if got := m.pending(); got != DefaultMaxPendingHandshakes-1 {
		t.Errorf("after the stream %v stalled handshakes pending, want %d (the cap less the one the stream displaced)", got, DefaultMaxPendingHandshakes-1)
	}
	t.Logf("after the stream, alone: %s; beside the attack: %s", scrapeMetrics(t, base.tgt.ready.Addrs[1]).goMemory(), m.goMemory())
	// RssFile is the binary's pages, the same in both; RssAnon is what
	// the process allocated.
	t.Logf("resident now, anonymous/file-backed: alone %.1f/%.1f MiB, beside the attack %.1f/%.1f MiB",
		mib(base.tgt.status("RssAnon:")), mib(base.tgt.status("RssFile:")),
		mib(attacked.tgt.status("RssAnon:")), mib(attacked.tgt.status("RssFile:")))
	t.Logf("target peak RSS (VmHWM), %d MiB stream in tls mode: %.1f MiB alone, %.1f MiB beside %d stalled handshakes (x%.2f, +%.1f MiB); test ran %s",
		size>>20, mib(base.peak), mib(attacked.peak), attackers, float64(attacked.peak)/float64(base.peak),
		mib(attacked.peak-base.peak), time.Since(t0).Round(100*time.Millisecond))
	if raceEnabled {
		t.Log("the race detector's memory is in these figures: the RSS bound is not checked")
		return
	}
	if attacked.peak >= rssLimit {
		t.Errorf("the target proxy's peak RSS beside the stalled handshakes is %.1f MiB, want under %d MiB", mib(attacked.peak), rssLimit>>20)
	}
}

// childRun is what migrateThroughChild leaves: the target, still
// running, and its peak RSS (VmHWM) once the stream had ended.
type childRun struct {
	tgt  *child
	peak int64
}

// migrateThroughChild starts a target proxy and a source relay as child
// processes, runs attack (if any) against the target, then carries size
// bytes to a target virt-handler stand-in (and 1 MiB back) through them,
// SHA-256 checked at both ends. The source is gone when it returns; the
// target runs until the test ends.
func migrateThroughChild(t *testing.T, name, certDir string, attack func(tgt *child), size int64) childRun {
	t.Helper()
	sink := listenOn(t, "127.0.0.1")
	port := portOf(sink.Addr())
	tgt := startRole(t, name+"-target", "", roleSpec{Role: "kvnet-target", Listen: loopback(t, 3),
		Target: "127.0.0.1", TargetPort: port, Migrations: 1, CertDir: certDir,
		HandshakeTimeout: 10 * time.Minute, Metrics: true})
	src := startRole(t, name+"-source", "", roleSpec{Role: "kvnet-source", Listen: loopback(t, 2),
		TargetPort: port, Migrations: 1, CertDir: certDir, Mode: hop.ModeTLS, Peer: tgt.ready.Addrs[0]})
	defer func() { _ = src.cmd.Process.Kill() }()
	if attack != nil {
		attack(tgt)
	}

	const back = 1 << 20
	res := hashPeer(t, sink, back, 6)
	c, err := net.Dial("tcp", src.ready.Addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n, sum, err := sendAndHash(c, streamBytes(5, size))
	if err != nil {
		t.Fatalf("%s: through both proxies: %v", name, err)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("%s: target virt-handler: %v", name, r.err)
	}
	if want := sumOf(streamBytes(5, size)); r.n != size || r.sum != want {
		t.Fatalf("%s: the target virt-handler received %d bytes sha256 %x, want %d bytes %x", name, r.n, r.sum, size, want)
	}
	if want := sumOf(streamBytes(6, back)); n != back || sum != want {
		t.Fatalf("%s: the source received %d bytes sha256 %x back, want %d bytes %x", name, n, sum, back, want)
	}
	return childRun{tgt: tgt, peak: tgt.peakRSS()}
}

// clientHello is the first record of a real TLS 1.3 client handshake,
// Go's (with its hybrid post-quantum key share), as an attacker replays
// it: the server cannot tell a replayed hello from a fresh one before the
// client's next flight, which never comes.
func clientHello(t *testing.T) []byte {
	t.Helper()
	cli, srv := net.Pipe()
	defer srv.Close()
	go func() {
		_ = tls.Client(cli, &tls.Config{MinVersion: tls.VersionTLS13, ServerName: "cluster-b"}).Handshake()
		_ = cli.Close()
	}()
	rec := make([]byte, tlsRecordHeader)
	if _, err := io.ReadFull(srv, rec); err != nil {
		t.Fatal(err)
	}
	rec = append(rec, make([]byte, recordLen(rec))...)
	if _, err := io.ReadFull(srv, rec[tlsRecordHeader:]); err != nil {
		t.Fatal(err)
	}
	if rec[0] != 0x16 || rec[tlsRecordHeader] != 0x01 {
		t.Fatalf("the first record is not a ClientHello: % x", rec[:tlsRecordHeader+1])
	}
	return rec
}

// attackerAddrs are n loopback addresses outside 127.0.0.0/24 (where the
// proxies and the sink live), one per attacking connection; Linux routes
// all of 127.0.0.0/8 to lo.
func attackerAddrs(t *testing.T, n int) []net.IP {
	t.Helper()
	ips := make([]net.IP, n)
	for i := range ips {
		ips[i] = net.IPv4(127, 1, byte(i/250), byte(i%250+1))
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ips[n-1].String(), "0"))
	if err != nil {
		t.Fatalf("the attackers need the addresses of 127.0.0.0/8 (Linux): %v", err)
	}
	_ = ln.Close()
	return ips
}

// stallHandshakes opens one connection to addr from each source, sends
// hello on it and never reads or writes again; they close when the test
// ends.
func stallHandshakes(t *testing.T, addr string, hello []byte, sources []net.IP) {
	t.Helper()
	for _, ip := range sources {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("attacker %s: %v", ip, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if _, err := c.Write(hello); err != nil {
			t.Fatalf("attacker %s: %v", ip, err)
		}
	}
}

// metricValues are the samples of one scrape, by series as the text
// format writes them (name{labels sorted by name}).
type metricValues map[string]float64

func (m metricValues) pending() float64 { return m["kvnet_proxy_pending_handshakes"] }

func (m metricValues) refused(reason string) float64 {
	return m[`kvnet_proxy_refused_total{reason="`+reason+`",side="target"}`]
}

// goMemory is the Go runtime's account of the memory it holds.
func (m metricValues) goMemory() string {
	return fmt.Sprintf("Go heap in use %.1f MiB, stacks %.1f MiB, from the OS %.1f MiB, %v goroutines",
		m["go_memstats_heap_inuse_bytes"]/(1<<20), m["go_memstats_stack_inuse_bytes"]/(1<<20), m["go_memstats_sys_bytes"]/(1<<20), m["go_goroutines"])
}

func scrapeMetrics(t *testing.T, addr string) metricValues {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m := metricValues{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		i := strings.LastIndexByte(l, ' ')
		if strings.HasPrefix(l, "#") || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
			m[l[:i]] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// waitMetrics scrapes addr until cond holds.
func waitMetrics(t *testing.T, addr string, cond func(metricValues) bool) metricValues {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m := scrapeMetrics(t, addr)
		if cond(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("the target never reached the state waited for: %v pending, %v refused too-many-handshakes, %v handshake-rate",
				m.pending(), m.refused("too-many-handshakes"), m.refused("handshake-rate"))
		}
		time.Sleep(10 * time.Millisecond) // between scrapes of a condition the child has no other way to announce
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
