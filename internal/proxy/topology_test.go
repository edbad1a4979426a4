package proxy

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// topology places the four parties of a cross-cluster migration on
// networks. The veth topology is the one the proxy exists for, made of
// network namespaces the test creates and removes:
//
//	a-handler --(cluster A migration net)-- a-proxy --(cross-cluster)-- b-proxy --(cluster B migration net)-- b-handler
//	198.18.1.1                   198.18.1.2  198.18.0.1         198.18.0.2  198.18.2.2                   198.18.2.1
//
// No namespace forwards packets (a new namespace starts with forwarding
// off) and none has a default route, so the source virt-handler stand-in
// has no route to the target cluster: its stream can only cross through
// the two proxies. The addresses are from 198.18.0.0/15, the range set
// aside for benchmarking network devices (RFC 2544); they exist only
// inside these namespaces.
//
// The loopback topology puts every party in the test's own namespace on
// its own 127.0.0.x address: no isolation, but no veth cost either.
type topology struct {
	name string
	// ns of each party ("" = the test's own namespace) and its address.
	ns   map[string]string
	addr map[string]string
}

const (
	aHandler = "a-handler"
	aProxy   = "a-proxy"
	bProxy   = "b-proxy"
	bHandler = "b-handler"
)

// aProxyCross and bProxyIn are the proxies' second addresses: the source
// proxy's cross-cluster address (it dials from there) and the target
// proxy's address on cluster B's migration network.
var vethAddrs = map[string]string{
	aHandler: "198.18.1.1", aProxy: "198.18.1.2", bProxy: "198.18.0.2", bHandler: "198.18.2.1",
}

func loopbackTopology(t testing.TB) *topology {
	return &topology{name: "loopback", ns: map[string]string{},
		addr: map[string]string{aHandler: loopback(t, 11), aProxy: loopback(t, 12), bProxy: loopback(t, 13), bHandler: loopback(t, 14)}}
}

// vethTopology builds the namespaces and links, and removes them when the
// test ends. Without CAP_NET_ADMIN (or without iproute2's ip) it fails
// the test and says so: a topology test that cannot build its topology
// has not shown anything.
func vethTopology(t testing.TB) *topology {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("the veth topology needs iproute2's ip (apt-get install iproute2): %v", err)
	}
	id := fmt.Sprintf("kvnet-%d-", os.Getpid())
	tp := &topology{name: "veth", ns: map[string]string{}, addr: vethAddrs}
	for _, p := range []string{aHandler, aProxy, bProxy, bHandler} {
		ns := id + p
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("creating network namespace %s (needs CAP_NET_ADMIN; run as root): %v: %s", ns, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		tp.ns[p] = ns
		ipn(t, ns, "link", "set", "lo", "up")
	}
	// Each link: two ends, each in its namespace with its address.
	links := []struct{ a, aAddr, b, bAddr string }{
		{aHandler, "198.18.1.1/24", aProxy, "198.18.1.2/24"},
		{aProxy, "198.18.0.1/24", bProxy, "198.18.0.2/24"},
		{bProxy, "198.18.2.2/24", bHandler, "198.18.2.1/24"},
	}
	for i, l := range links {
		ea, eb := fmt.Sprintf("kvn%d-%da", os.Getpid()%100000, i), fmt.Sprintf("kvn%d-%db", os.Getpid()%100000, i)
		if out, err := exec.Command("ip", "link", "add", ea, "type", "veth", "peer", "name", eb).CombinedOutput(); err != nil {
			t.Fatalf("creating veth pair %s/%s: %v: %s", ea, eb, err, out)
		}
		for _, end := range []struct{ dev, party, cidr string }{{ea, l.a, l.aAddr}, {eb, l.b, l.bAddr}} {
			ns := tp.ns[end.party]
			if out, err := exec.Command("ip", "link", "set", end.dev, "netns", ns).CombinedOutput(); err != nil {
				t.Fatalf("moving %s into %s: %v: %s", end.dev, ns, err, out)
			}
			ipn(t, ns, "addr", "add", end.cidr, "dev", end.dev)
			ipn(t, ns, "link", "set", end.dev, "up")
		}
	}
	return tp
}

func ipn(t testing.TB, ns string, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s %s: %v: %s", ns, strings.Join(args, " "), err, out)
	}
}
