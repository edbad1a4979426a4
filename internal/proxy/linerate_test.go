package proxy

import (
	"crypto/aes"
	"crypto/cipher"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// path is one way across between the two virt-handler stand-ins: kvnet's
// two proxies in a hop mode, or the relays they are compared with, one at
// each end where kvnet's proxies run.
type path struct {
	name string
	// start runs the two ends (source end first) for streams streams to
	// the sink at sinkAddr and returns them with the addresses the
	// sender dials.
	start func(t testing.TB, tp *topology, sinkAddr string, streams int) (ends []*child, addrs []string)
}

func kvnetPath(mode hop.Mode, certDir string) path {
	return path{name: "kvnet " + mode.String(), start: func(t testing.TB, tp *topology, sinkAddr string, streams int) ([]*child, []string) {
		host, port, _ := net.SplitHostPort(sinkAddr)
		tgt := startRole(t, "kvnet-target", tp.ns[bProxy], roleSpec{Role: "kvnet-target", Listen: tp.addr[bProxy],
			Target: host, TargetPort: port, Migrations: streams, CertDir: certDir})
		src := startRole(t, "kvnet-source", tp.ns[aProxy], roleSpec{Role: "kvnet-source", Listen: tp.addr[aProxy],
			TargetPort: port, Migrations: streams, CertDir: certDir, Mode: mode, Peer: tgt.ready.Addrs[0]})
		return []*child{src, tgt}, src.ready.Addrs
	}}
}

var goRelayPath = path{name: "go splice relay", start: func(t testing.TB, tp *topology, sinkAddr string, _ int) ([]*child, []string) {
	b := startRole(t, "go-relay-b", tp.ns[bProxy], roleSpec{Role: "go-relay", Listen: tp.addr[bProxy], Target: sinkAddr})
	a := startRole(t, "go-relay-a", tp.ns[aProxy], roleSpec{Role: "go-relay", Listen: tp.addr[aProxy], Target: b.ready.Addrs[0]})
	return []*child{a, b}, a.ready.Addrs
}}

// haproxyPath is HAProxy in TCP mode with splice, one thread per end: the
// relay the issue measured at about 30 Gbit/s per core.
func haproxyPath(bin, dir string) path {
	return path{name: "haproxy splice", start: func(t testing.TB, tp *topology, sinkAddr string, _ int) ([]*child, []string) {
		b := startHAProxy(t, bin, filepath.Join(dir, "b.cfg"), tp.ns[bProxy], tp.addr[bProxy], sinkAddr)
		a := startHAProxy(t, bin, filepath.Join(dir, "a.cfg"), tp.ns[aProxy], tp.addr[aProxy], b.ready.Addrs[0])
		return []*child{a, b}, a.ready.Addrs
	}}
}

func startHAProxy(t testing.TB, bin, cfgPath, ns, host, target string) *child {
	t.Helper()
	port := freePortOn(t, ns, host)
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	cfg := fmt.Sprintf(`global
  nbthread 1
  maxconn 1000
defaults
  mode tcp
  option splice-auto
  timeout connect 10s
  timeout client 5m
  timeout server 5m
frontend migration
  bind %s
  default_backend peer
backend peer
  server peer %s
`, addr, target)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	argv := []string{bin, "-db", "-q", "-f", cfgPath}
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = &prefixWriter{prefix: "haproxy: ", w: os.Stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := &child{name: "haproxy", cmd: cmd, ready: roleReady{Addrs: []string{addr}}}
	// Ready when its frontend accepts, checked from its own namespace.
	probe := roleSpec{Role: "dial", Addrs: []string{addr}}
	for i := 0; ; i++ {
		if r := dialFrom(t, ns, probe); r == "" {
			return c
		} else if i == 200 {
			t.Fatalf("haproxy on %s never accepted: %s", addr, r)
		}
		time.Sleep(10 * time.Millisecond) // polling a port HAProxy has no other way to announce
	}
}

// freePortOn returns a port free on host in namespace ns: in a namespace
// of the test's own every port is free; on a shared loopback the kernel
// picks one.
func freePortOn(t testing.TB, ns, host string) int {
	if ns != "" {
		return 19444
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// writeProxyCerts issues the two clusters' proxy certificates into dir
// for the kvnet roles (loadProxyCert reads them).
func writeProxyCerts(t testing.TB, dir string) {
	t.Helper()
	for _, name := range []string{"cluster-a", "cluster-b"} {
		p := certstest.New(t, name)
		for file, data := range map[string][]byte{name + ".crt": p.CertPEM, name + ".key": p.KeyPEM, name + "-ca.crt": p.CA.CertPEM} {
			if err := os.WriteFile(filepath.Join(dir, file), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// measurement is one run of one path.
type measurement struct {
	gbps     float64
	cpu      []float64 // cores each end used on average during the run
	jain     float64
	peakRSS  []int64
	wall     time.Duration
	streams  int
	pathName string
}

func runPath(t testing.TB, tp *topology, p path, sinkAddr string, streams int, perStream int64) measurement {
	ends, addrs := p.start(t, tp, sinkAddr, streams)
	defer func() {
		for _, e := range ends {
			_ = e.cmd.Process.Kill()
		}
	}()
	before := make([]time.Duration, len(ends))
	for i, e := range ends {
		before[i] = e.cpu()
	}
	t0 := time.Now()
	snd := startRole(t, "send", tp.ns[aHandler], roleSpec{Role: "send", Addrs: addrs, Streams: streams, Bytes: perStream})
	res, err := snd.result()
	wall := time.Since(t0)
	if err != nil {
		t.Fatalf("%s over %s: %v", p.name, tp.name, err)
	}
	m := measurement{streams: streams, pathName: p.name, wall: wall}
	// The sender's own durations exclude its process start.
	slowest := slices.Max(res.Durations)
	m.gbps = float64(res.Bytes) * 8 / slowest.Seconds() / 1e9
	for i, e := range ends {
		m.cpu = append(m.cpu, (e.cpu()-before[i]).Seconds()/slowest.Seconds())
		m.peakRSS = append(m.peakRSS, e.peakRSS())
	}
	m.jain = jain(res.Durations, perStream)
	return m
}

// aesGCMSealGbps is Go's single-core AES-GCM seal rate on 16 KiB records
// (TLS 1.3's largest, what the hop sends): the ceiling of one core doing
// tls mode's encryption and nothing else. It is bytes per second of the
// sealing thread's own CPU time, so a busy machine slows the measurement
// but does not change the rate.
func aesGCMSealGbps() float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	block, _ := aes.NewCipher(make([]byte, 16))
	aead, _ := cipher.NewGCM(block)
	rec := make([]byte, 16<<10)
	out := make([]byte, 0, len(rec)+aead.Overhead())
	nonce := make([]byte, aead.NonceSize())
	var n int64
	c0 := threadCPU()
	for threadCPU()-c0 < 300*time.Millisecond {
		for range 64 {
			out = aead.Seal(out[:0], nonce, rec, nil)
			n += int64(len(rec))
		}
	}
	return float64(n) * 8 / (threadCPU() - c0).Seconds() / 1e9
}

func threadCPU() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_THREAD, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// directPath is no relay at all: the sender dials the sink. It exists
// only where the two stand-ins share a network (loopback), as the
// ceiling of the machine itself.
var directPath = path{name: "direct", start: func(_ testing.TB, _ *topology, sinkAddr string, _ int) ([]*child, []string) {
	return nil, []string{sinkAddr}
}}

// BenchmarkLineRate is `make bench-proxy`: every path across, side by
// side in one run, on loopback and over the veth topology, with one
// stream and with five concurrent migrations. Each round runs every
// path once, in turn, so a load that comes and goes on the machine hits
// all of them alike; the table gives each row's median over the rounds
// (b.N rounds). Per proxy it reports the CPU used (cores, averaged over
// the run, user + system), Gbit/s per proxy core (the busier end's), and
// peak RSS; per run, Jain's fairness index over the streams.
//
//	go test -run '^$' -bench BenchmarkLineRate -benchtime 3x ./proxy/
//
// KVNET_LINERATE_MIB sets the bytes carried per run (default 1024).
func BenchmarkLineRate(b *testing.B) {
	dir := b.TempDir()
	writeProxyCerts(b, dir)
	paths := []path{goRelayPath, kvnetPath(hop.ModeAuthenticated, dir), kvnetPath(hop.ModeTLS, dir)}
	if bin, err := exec.LookPath("haproxy"); err == nil {
		paths = append(paths, haproxyPath(bin, dir))
	} else {
		fmt.Println("haproxy: not installed, its rows are left out (apt-get install haproxy)")
	}
	total := int64(1024) << 20
	if v, err := strconv.ParseInt(os.Getenv("KVNET_LINERATE_MIB"), 10, 64); err == nil && v > 0 {
		total = v << 20
	}
	topos := []*topology{loopbackTopology(b), vethTopology(b)}
	sinks := map[*topology]string{}
	for _, tp := range topos {
		s := startRole(b, "sink", tp.ns[bHandler], roleSpec{Role: "sink", Listen: tp.addr[bHandler]})
		sinks[tp] = s.ready.Addrs[0]
	}
	type key struct {
		topo    string
		streams int
		path    string
	}
	runs := map[key][]measurement{}
	var order []key
	for b.Loop() {
		for _, tp := range topos {
			for _, streams := range []int{1, 5} {
				ps := paths
				if tp.name == "loopback" {
					ps = append([]path{directPath}, paths...)
				}
				for _, p := range ps {
					k := key{tp.name, streams, p.name}
					if runs[k] == nil {
						order = append(order, k)
					}
					runs[k] = append(runs[k], runPath(b, tp, p, sinks[tp], streams, total/int64(streams)))
				}
			}
		}
	}
	b.StopTimer()
	seal := aesGCMSealGbps()
	med := func(k key) measurement {
		ms := slices.Clone(runs[k])
		slices.SortFunc(ms, func(x, y measurement) int { return int((x.gbps - y.gbps) * 1e6) })
		return ms[len(ms)/2]
	}
	fmt.Printf("\nLine rate, %d MiB per run, median of %d rounds; Go AES-128-GCM seal on one core: %.1f Gbit/s\n", total>>20, b.N, seal)
	w := newTable(os.Stdout, "network", "streams", "path", "Gbit/s", "x go relay", "CPU src", "CPU dst", "Gbit/s per proxy core", "x seal/core", "jain", "peak RSS src/dst MiB")
	for _, k := range order {
		m := med(k)
		base := med(key{k.topo, k.streams, goRelayPath.name})
		row := []string{k.topo, strconv.Itoa(k.streams), k.path, f1(m.gbps), f2(m.gbps / base.gbps)}
		if len(m.cpu) == 2 {
			perCore := m.gbps / max(m.cpu[0], m.cpu[1])
			row = append(row, f2(m.cpu[0]), f2(m.cpu[1]), f1(perCore), f2(perCore/seal), f2(m.jain),
				fmt.Sprintf("%.0f/%.0f", float64(m.peakRSS[0])/(1<<20), float64(m.peakRSS[1])/(1<<20)))
		} else {
			row = append(row, "-", "-", "-", "-", f2(m.jain), "-")
		}
		w.row(row...)
		if k.path != goRelayPath.name && k.path != directPath.name {
			unit := strings.NewReplacer(" ", "-").Replace(fmt.Sprintf("%s/%s/s%d", k.path, k.topo, k.streams))
			b.ReportMetric(m.gbps/base.gbps, "x-go-relay:"+unit)
		}
	}
	w.flush()
}

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// TestVethTopologyCarriesMigrationThroughProxies builds the two clusters'
// migration networks and the cross-cluster network out of namespaces and
// veths, shows that the source virt-handler stand-in has no route to the
// target cluster, and that its migration streams still arrive intact
// (SHA-256 checked at the far end) through kvnet's two proxies, in both
// hop modes.
func TestVethTopologyCarriesMigrationThroughProxies(t *testing.T) {
	tp := vethTopology(t)
	for _, unreachable := range []string{bHandler, bProxy} {
		addr := net.JoinHostPort(tp.addr[unreachable], "9")
		if e := dialFrom(t, tp.ns[aHandler], roleSpec{Addrs: []string{addr}}); !strings.Contains(e, "network is unreachable") {
			t.Fatalf("the source virt-handler stand-in reached %s (%s): want no route, got %q", unreachable, addr, e)
		}
	}
	dir := t.TempDir()
	writeProxyCerts(t, dir)
	sink := startRole(t, "sink", tp.ns[bHandler], roleSpec{Role: "sink", Listen: tp.addr[bHandler], Hash: true})
	for _, mode := range []hop.Mode{hop.ModeTLS, hop.ModeAuthenticated} {
		t.Run(mode.String(), func(t *testing.T) {
			ends, addrs := kvnetPath(mode, dir).start(t, tp, sink.ready.Addrs[0], 3)
			defer func() {
				for _, e := range ends {
					_ = e.cmd.Process.Kill()
				}
			}()
			snd := startRole(t, "send", tp.ns[aHandler], roleSpec{Role: "send", Addrs: addrs, Streams: 3, Bytes: 16 << 20, Hash: true})
			res, err := snd.result()
			if err != nil {
				t.Fatal(err)
			}
			if res.Bytes != 3*16<<20 || len(res.Digests) != 3 {
				t.Fatalf("carried %d bytes in %d streams, want %d in 3", res.Bytes, len(res.Digests), 3*16<<20)
			}
			for i, d := range res.Digests {
				if len(d) != 64 {
					t.Fatalf("stream %d: no digest from the sink: %q", i, d)
				}
			}
		})
	}
}
