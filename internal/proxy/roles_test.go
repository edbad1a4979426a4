package proxy

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// The line-rate benchmark and the veth topology test run every party of a
// migration in its own process: the two virt-handler stand-ins (sender and
// sink), both proxies, and the relays they are compared with. Separate
// processes are what lets the benchmark report each proxy's own CPU (from
// /proc/<pid>/stat) and peak RSS, and what lets each party live in its own
// network namespace. The processes are this test binary run again with
// roleEnv set to a JSON roleSpec; TestMain sends them to runRole.

// roleEnv carries a child's roleSpec.
const roleEnv = "KVNET_PROXY_TEST_ROLE"

func TestMain(m *testing.M) {
	if spec := os.Getenv(roleEnv); spec != "" {
		if err := runRole(spec); err != nil {
			fmt.Fprintln(os.Stderr, "role failed:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// roleSpec is what one child process is told to be.
type roleSpec struct {
	// Role is sink, send, go-relay, kvnet-source or kvnet-target.
	Role string
	// Listen is the host the child listens on (port chosen by the kernel).
	Listen string
	// Target is where a relay dials (host:port); for kvnet-target, the host
	// of the endpoint every migration announces, with TargetPort.
	Target     string
	TargetPort string
	// Addrs are where send dials, one per stream (round robin).
	Addrs []string
	// Streams and Bytes: send opens Streams connections of Bytes each.
	Streams int
	Bytes   int64
	// Hash makes send write a deterministic pseudo-random stream and the
	// sink answer each stream with the SHA-256 of what it received, which
	// send checks: integrity, not speed.
	Hash bool
	// Mode, Migrations, CertDir and Peer configure the kvnet proxy roles:
	// Migrations migrations mig-1..mig-N, each with its own source
	// listener, through the peer's hop address Peer.
	Mode       hop.Mode
	Migrations int
	CertDir    string
	Peer       string
	// HandshakeTimeout, when set, is kvnet-target's (else the default);
	// Metrics makes kvnet-target also serve its metrics over HTTP on
	// Listen, announced as its second address.
	HandshakeTimeout time.Duration
	Metrics          bool
}

// roleReady is the one JSON line a listening child prints when it serves.
type roleReady struct {
	Addrs []string
}

// sendResult is what send prints when every stream has been carried.
type sendResult struct {
	Durations []time.Duration
	Bytes     int64
	Digests   []string // per stream, when Hash: the sink's and ours agreed
}

func runRole(raw string) error {
	var s roleSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return fmt.Errorf("decoding %s: %w", roleEnv, err)
	}
	switch s.Role {
	case "sink":
		return serveRole(s, func(ln net.Listener) error { return sinkLoop(ln, s.Hash) })
	case "send":
		return sendRole(s)
	case "go-relay":
		return serveRole(s, func(ln net.Listener) error { return goRelayLoop(ln, s.Target) })
	case "kvnet-target":
		return kvnetTargetRole(s)
	case "kvnet-source":
		return kvnetSourceRole(s)
	case "dial":
		return dialRole(s)
	}
	return fmt.Errorf("unknown role %q", s.Role)
}

func announce(lns ...net.Listener) {
	var r roleReady
	for _, ln := range lns {
		r.Addrs = append(r.Addrs, ln.Addr().String())
	}
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

func serveRole(s roleSpec, serve func(net.Listener) error) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(s.Listen, "0"))
	if err != nil {
		return err
	}
	announce(ln)
	return serve(ln)
}

// sinkLoop is the target virt-handler stand-in: it reads each stream to
// its end with a large buffer, and with hash answers with its digest.
func sinkLoop(ln net.Listener, hash bool) error {
	return acceptEach(ln, func(c net.Conn) {
		buf := make([]byte, 1<<20)
		h := sha256.New()
		for {
			n, err := c.Read(buf)
			if hash {
				h.Write(buf[:n])
			}
			if err != nil {
				break
			}
		}
		if hash {
			_, _ = c.Write(h.Sum(nil))
		}
	})
}

// acceptEach handles each connection ln accepts in its own goroutine,
// closing it when handle returns, until Accept fails.
func acceptEach(ln net.Listener, handle func(net.Conn)) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}

// goRelayLoop is the plain Go relay kvnet is measured against: io.Copy
// both ways between two TCP connections, which the runtime turns into
// splice(2), and nothing else.
func goRelayLoop(ln net.Listener, target string) error {
	return acceptEach(ln, func(c net.Conn) {
		d, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer d.Close()
		done := make(chan struct{})
		go func() {
			_, _ = io.Copy(c, d)
			_ = c.(*net.TCPConn).CloseWrite()
			close(done)
		}()
		_, _ = io.Copy(d, c)
		_ = d.(*net.TCPConn).CloseWrite()
		<-done
	})
}

// sendRole is the source virt-handler stand-in.
func sendRole(s roleSpec) error {
	res := sendResult{Durations: make([]time.Duration, s.Streams), Digests: make([]string, s.Streams)}
	var wg sync.WaitGroup
	errs := make([]error, s.Streams)
	for i := range s.Streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res.Durations[i], res.Digests[i], errs[i] = sendOne(s.Addrs[i%len(s.Addrs)], s.Bytes, s.Hash, uint64(i))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	res.Bytes = s.Bytes * int64(s.Streams)
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	return nil
}

func sendOne(addr string, n int64, hash bool, seed uint64) (time.Duration, string, error) {
	t0 := time.Now()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	var src io.Reader
	h := sha256.New()
	if hash {
		src = io.TeeReader(streamBytes(seed, n), h)
	} else {
		src = io.LimitReader(zeros{}, n)
	}
	buf := make([]byte, 1<<20)
	if _, err := io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{src}, buf); err != nil {
		return 0, "", fmt.Errorf("sending to %s: %w", addr, err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return 0, "", err
	}
	// The far end closes once it has read everything: the stream's time
	// is the time until the last byte arrived, not until it was queued.
	got, err := io.ReadAll(c)
	if err != nil {
		return 0, "", fmt.Errorf("waiting for the end of the stream: %w", err)
	}
	d := time.Since(t0)
	if !hash {
		return d, "", nil
	}
	want := h.Sum(nil)
	if string(got) != string(want) {
		return 0, "", fmt.Errorf("stream %d: the sink received other bytes than were sent (digest %x, want %x)", seed, got, want)
	}
	return d, fmt.Sprintf("%x", want), nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// proxyCerts is what the kvnet roles read from CertDir: each cluster's
// leaf and key, and the other cluster's CA.
func loadProxyCert(dir, name string) (tls.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(dir+"/"+name+".crt", dir+"/"+name+".key")
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	peer := map[string]string{"cluster-a": "cluster-b", "cluster-b": "cluster-a"}[name]
	ca, err := os.ReadFile(dir + "/" + peer + "-ca.crt")
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return tls.Certificate{}, nil, fmt.Errorf("no certificate in %s-ca.crt", peer)
	}
	return cert, pool, nil
}

func migrationIDs(n int) []string {
	ids := make([]string, max(n, 1))
	for i := range ids {
		ids[i] = "mig-" + strconv.Itoa(i+1)
	}
	return ids
}

// kvnetTargetRole is the target cluster's proxy: kvnet's TargetServer,
// with a resolver that announces every migration at Target:TargetPort as
// the target cluster's VMIMs would.
func kvnetTargetRole(s roleSpec) error {
	cert, pool, err := loadProxyCert(s.CertDir, "cluster-b")
	if err != nil {
		return err
	}
	eps := map[string]Endpoint{}
	for _, id := range migrationIDs(s.Migrations) {
		eps[id] = Endpoint{Address: s.Target, Ports: map[string]int{s.TargetPort: 0}}
	}
	srv := &TargetServer{
		Cert: cert, Peers: []*Peer{{Name: "cluster-a", CAs: pool}},
		Resolver: &staticResolver{eps: eps}, Limiter: &Limiter{},
		HandshakeTimeout: s.HandshakeTimeout,
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(s.Listen, "0"))
	if err != nil {
		return err
	}
	if !s.Metrics {
		announce(ln)
		return srv.Serve(context.Background(), ln)
	}
	reg := prometheus.NewRegistry()
	if err := RegisterMetrics(reg); err != nil {
		return err
	}
	// The Go runtime's own figures say where the RSS went.
	reg.MustRegister(collectors.NewGoCollector())
	mln, err := net.Listen("tcp", net.JoinHostPort(s.Listen, "0"))
	if err != nil {
		return err
	}
	go func() { _ = http.Serve(mln, promhttp.HandlerFor(reg, promhttp.HandlerOpts{})) }()
	announce(ln, mln)
	return srv.Serve(context.Background(), ln)
}

// kvnetSourceRole is the source cluster's proxy: one kvnet Relay per
// migration, each on its own listener as the controller opens them, with
// the hop to the peer's TargetServer.
func kvnetSourceRole(s roleSpec) error {
	cert, pool, err := loadProxyCert(s.CertDir, "cluster-a")
	if err != nil {
		return err
	}
	port, err := strconv.ParseUint(s.TargetPort, 10, 16)
	if err != nil {
		return err
	}
	peer := &Peer{Name: "cluster-b", Addresses: []string{s.Peer}, CAs: pool}
	d := &Dialer{Cert: cert, Mode: s.Mode}
	lim := &Limiter{}
	var lns []net.Listener
	var wg sync.WaitGroup
	for _, id := range migrationIDs(s.Migrations) {
		ln, err := net.Listen("tcp", net.JoinHostPort(s.Listen, "0"))
		if err != nil {
			return err
		}
		lns = append(lns, ln)
		r := &Relay{MigrationID: id, Limiter: lim,
			Upstream: func(ctx context.Context) (net.Conn, error) { return d.Dial(ctx, peer, testRoute(id), uint16(port)) }}
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Serve(context.Background(), ln) }()
	}
	announce(lns...)
	wg.Wait()
	return nil
}

// child is one running role process.
type child struct {
	name  string
	cmd   *exec.Cmd
	out   *bufio.Reader
	ready roleReady
}

// startRole starts spec as a child process, in network namespace ns when
// ns is set, and for listening roles waits for its roleReady line.
func startRole(t testing.TB, name, ns string, spec roleSpec) *child {
	t.Helper()
	raw, _ := json.Marshal(spec)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{self, "-test.run=^$"}
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), roleEnv+"="+string(raw))
	cmd.Stderr = &prefixWriter{prefix: name + ": ", w: os.Stderr}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	c := &child{name: name, cmd: cmd, out: bufio.NewReader(stdout)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if spec.Role != "send" && spec.Role != "dial" {
		line, err := c.out.ReadString('\n')
		if err != nil {
			t.Fatalf("%s did not start: %v", name, err)
		}
		if err := json.Unmarshal([]byte(line), &c.ready); err != nil {
			t.Fatalf("%s: %q: %v", name, line, err)
		}
	}
	return c
}

// result waits for a send child and decodes what it printed.
func (c *child) result() (sendResult, error) {
	var r sendResult
	line, rerr := c.out.ReadString('\n')
	werr := c.cmd.Wait()
	if werr != nil {
		return r, fmt.Errorf("%s: %w", c.name, werr)
	}
	if rerr != nil {
		return r, fmt.Errorf("%s printed no result: %w", c.name, rerr)
	}
	return r, json.Unmarshal([]byte(line), &r)
}

// cpu is the CPU time the child has used so far (user + system, its
// children included), from /proc/<pid>/stat.
func (c *child) cpu() time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(c.cmd.Process.Pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name; utime is field 14.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	var ticks int64
	for _, i := range []int{11, 12, 13, 14} { // utime stime cutime cstime
		v, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// peakRSS is the child's high-water resident set (VmHWM), in bytes.
func (c *child) peakRSS() int64 { return c.status("VmHWM:") }

// rss is the child's resident set now (VmRSS), in bytes.
func (c *child) rss() int64 { return c.status("VmRSS:") }

// status is a kB field of /proc/<pid>/status, in bytes.
func (c *child) status(field string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(c.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

type prefixWriter struct {
	prefix string
	w      io.Writer
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if l != "" {
			_, _ = io.WriteString(p.w, p.prefix+l)
		}
	}
	return len(b), nil
}

// dialResult is what the dial role prints: the error of one TCP connect
// attempt, "" when it connected.
type dialResult struct{ Error string }

func dialRole(s roleSpec) error {
	var r dialResult
	c, err := net.DialTimeout("tcp", s.Addrs[0], time.Second)
	if err != nil {
		r.Error = err.Error()
	} else {
		_ = c.Close()
	}
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
	return nil
}

// dialFrom tries one connect to spec.Addrs[0] from namespace ns and
// returns its error text ("" when it connected).
func dialFrom(t testing.TB, ns string, spec roleSpec) string {
	t.Helper()
	spec.Role = "dial"
	c := startRole(t, "dial", ns, spec)
	line, err := c.out.ReadString('\n')
	_ = c.cmd.Wait()
	if err != nil {
		t.Fatalf("the dial probe printed nothing: %v", err)
	}
	var r dialResult
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatal(err)
	}
	return r.Error
}
