package test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/kvnet/kvnet/certs"
	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/caexchange"
	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/test/framework"
)

// caSyncTimeout is the promise: a rotation reaches the other
// cluster within a minute (the proxies here offer every second).
const caSyncTimeout = time.Minute

// kubevirtCA is a CA shaped like virt-operator's (CN kubevirt.io).
func kubevirtCA(t *testing.T) *x509.Certificate {
	t.Helper()
	ca, err := certs.NewCA("kubevirt.io", time.Now().Add(-time.Minute), 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca.Cert
}

// putCAConfigMap creates or replaces a ConfigMap holding bundle under
// ca-bundle, as virt-operator writes kubevirt-ca and kubevirt-external-ca.
func putCAConfigMap(t *testing.T, c client.Client, ns, name, bundle string) {
	t.Helper()
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{caexchange.CABundleKey: bundle}}
	err := c.Create(ctx, cm)
	if apierrors.IsAlreadyExists(err) {
		var cur corev1.ConfigMap
		if err = c.Get(ctx, client.ObjectKeyFromObject(cm), &cur); err == nil {
			cur.Data = cm.Data
			err = c.Update(ctx, &cur)
		}
	}
	if err != nil {
		t.Fatalf("writing %s/%s: %v", ns, name, err)
	}
}

// externalCA is a cluster's kubevirt-external-ca: its bundle's
// fingerprints and text, and kvnet's slots.
func externalCA(c client.Client, ns string) (map[string]bool, string, caexchange.Slots, error) {
	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: caexchange.ExternalCAName}, &cm); err != nil {
		return nil, "", nil, err
	}
	data := cm.Data[caexchange.CABundleKey]
	got := map[string]bool{}
	if data != "" {
		cs, err := caexchange.ParseCABundle([]byte(strings.ReplaceAll(data, operatorComment, "")), time.Now())
		if err != nil {
			return nil, "", nil, err
		}
		for _, c := range cs {
			got[caexchange.Fingerprint(c)] = true
		}
	}
	return got, data, caexchange.DecodeSlots(cm.Annotations[caexchange.AnnotationExternalCAPeers]), nil
}

const operatorComment = "# copied by hand from cluster X\n"

// holds checks that a kubevirt-external-ca holds want and none of absent.
func holds(got map[string]bool, want, absent []*x509.Certificate) error {
	for _, c := range want {
		if !got[caexchange.Fingerprint(c)] {
			return fmt.Errorf("%s missing (has %d certificates)", caexchange.Fingerprint(c)[:12], len(got))
		}
	}
	for _, c := range absent {
		if got[caexchange.Fingerprint(c)] {
			return fmt.Errorf("%s still there", caexchange.Fingerprint(c)[:12])
		}
	}
	return nil
}

// TestProxyKubeVirtCASync: two real control planes, each with its `kvnet
// proxy`, keep their KubeVirt CAs in step over the hop. Each cluster's CA
// reaches the other's kubevirt-external-ca next to an operator's entry,
// which survives; a rotation replaces the old CA within a minute; a peer
// that is not configured writes nothing, a configured one writes only its
// own slot, and a bundle that is not PEM CA certificates is refused and
// counted. The test writes kubevirt-ca and creates kubevirt-external-ca in
// virt-operator's place (no virt-operator runs here): it reconciles
// neither, which is the harder case for kvnet's merge, since nothing empties
// the bundles kvnet writes.
func TestProxyKubeVirtCASync(t *testing.T) {
	hopAddrA, hopAddrB := loopbackAddr(t, 6), loopbackAddr(t, 7)
	b, err := framework.StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	const kvNS = "kubevirt-casync"
	for _, c := range []client.Client{env.Client, b.Client} {
		mustCreate(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvNS}})
	}
	kvA1, kvB1, kvB2, kvOp := kubevirtCA(t), kubevirtCA(t), kubevirtCA(t), kubevirtCA(t)
	operatorEntry := operatorComment + string(caexchange.EncodeCerts([]*x509.Certificate{kvOp}))
	putCAConfigMap(t, env.Client, kvNS, caexchange.KubeVirtCAName, string(caexchange.EncodeCerts([]*x509.Certificate{kvA1})))
	putCAConfigMap(t, env.Client, kvNS, caexchange.ExternalCAName, operatorEntry)
	putCAConfigMap(t, b.Client, kvNS, caexchange.KubeVirtCAName, string(caexchange.EncodeCerts([]*x509.Certificate{kvB1})))
	putCAConfigMap(t, b.Client, kvNS, caexchange.ExternalCAName, "") // as virt-operator creates it

	pa, pb, pc, px := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-b"), certstest.New(t, "cluster-c"), certstest.New(t, "intruder")
	hopA, err := net.Listen("tcp", net.JoinHostPort(hopAddrA, "0"))
	if err != nil {
		t.Fatal(err)
	}
	hopB, err := net.Listen("tcp", net.JoinHostPort(hopAddrB, "0"))
	if err != nil {
		t.Fatal(err)
	}
	peerA := &proxy.Peer{Name: "cluster-a", Addresses: []string{hopA.Addr().String()}, CAs: pa.Pool}
	peerB := &proxy.Peer{Name: "cluster-b", Addresses: []string{hopB.Addr().String()}, CAs: pb.Pool}
	peerC := &proxy.Peer{Name: "cluster-c", CAs: pc.Pool} // configured on B, never dialed
	start := func(restCfg *rest.Config, peers []*proxy.Peer, hop net.Listener, cert *certstest.PKI) {
		mgr, err := app.NewProxyManager(restCfg, app.ProxyOptions{
			AdvertiseAddress: "127.0.0.1", HopListener: hop, Cert: cert.Cert, Peers: peers,
			CASync: true, KubeVirtNamespace: kvNS, CASyncInterval: time.Second,
			MetricsAddr: "0", ProbeAddr: "0", Namespace: framework.KvnetNamespace, CreateObjects: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		startProxy(t, mgr)
	}
	start(env.Config, []*proxy.Peer{peerB}, hopA, pa)
	start(b.Config, []*proxy.Peer{peerA, peerC}, hopB, pb)

	// 1. Each cluster's CA reaches the other; the operator's entry stays,
	// byte for byte, and is not claimed as kvnet's.
	framework.Eventually(t, "cluster B's KubeVirt CA in cluster A's kubevirt-external-ca", caSyncTimeout, func() error {
		got, data, slots, err := externalCA(env.Client, kvNS)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(data, operatorEntry) {
			return fmt.Errorf("the operator's entry was changed:\n%s", data)
		}
		if len(slots["cluster-b"]) != 1 || slots["cluster-b"][0] != caexchange.Fingerprint(kvB1) {
			return fmt.Errorf("slots %v, want cluster-b: [kvB1]", slots)
		}
		return holds(got, []*x509.Certificate{kvOp, kvB1}, []*x509.Certificate{kvA1})
	})
	framework.Eventually(t, "cluster A's KubeVirt CA in cluster B's kubevirt-external-ca", caSyncTimeout, func() error {
		got, _, _, err := externalCA(b.Client, kvNS)
		if err != nil {
			return err
		}
		return holds(got, []*x509.Certificate{kvA1}, []*x509.Certificate{kvB1})
	})

	// 2. Rotation on B, as virt-operator does it: the new CA first with the
	// old one kept for the overlap, then the old one dropped.
	putCAConfigMap(t, b.Client, kvNS, caexchange.KubeVirtCAName, string(caexchange.EncodeCerts([]*x509.Certificate{kvB2, kvB1, kvA1})))
	framework.Eventually(t, "during B's overlap, A trusts both of B's CAs", caSyncTimeout, func() error {
		got, _, _, err := externalCA(env.Client, kvNS)
		if err != nil {
			return err
		}
		// kvA1, merged into B's kubevirt-ca, is not echoed back to A.
		return holds(got, []*x509.Certificate{kvOp, kvB2, kvB1}, []*x509.Certificate{kvA1})
	})
	putCAConfigMap(t, b.Client, kvNS, caexchange.KubeVirtCAName, string(caexchange.EncodeCerts([]*x509.Certificate{kvB2, kvA1})))
	framework.Eventually(t, "after B's overlap, A has B's new CA and not the old one", caSyncTimeout, func() error {
		got, data, _, err := externalCA(env.Client, kvNS)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(data, operatorEntry) {
			return fmt.Errorf("the operator's entry was changed:\n%s", data)
		}
		return holds(got, []*x509.Certificate{kvOp, kvB2}, []*x509.Certificate{kvB1, kvA1})
	})

	// 3. Offers B's hop listener must refuse, and what each may write.
	ctx := context.Background()
	kvX := kubevirtCA(t)
	offer := func(cert *certstest.PKI, bundle []byte) error {
		return (&proxy.Dialer{Cert: cert.Cert}).OfferCAs(ctx, peerB, bundle)
	}
	_, before, _, err := externalCA(b.Client, kvNS)
	if err != nil {
		t.Fatal(err)
	}
	kvIntruder := kubevirtCA(t)
	untrusted := metricValue(t, "kvnet_proxy_refused_total", map[string]string{"side": "target", "reason": hop.RefusedUntrustedPeer.String()})
	if err := offer(px, caexchange.EncodeCerts([]*x509.Certificate{kvIntruder})); err == nil {
		t.Error("a peer that is not configured had its CA bundle accepted")
	}
	framework.Eventually(t, "the unconfigured peer's refusal is counted", caSyncTimeout, func() error {
		if v := metricValue(t, "kvnet_proxy_refused_total", map[string]string{"side": "target", "reason": hop.RefusedUntrustedPeer.String()}); v < untrusted+1 {
			return fmt.Errorf("untrusted-peer refusals %v -> %v", untrusted, v)
		}
		return nil
	})
	badLabels := map[string]string{"peer": "cluster-c", "direction": "received", "reason": hop.RefusedBadCABundle.String()}
	for what, bundle := range map[string][]byte{
		"not PEM":            []byte("hello"),
		"a leaf certificate": caexchange.EncodeCerts([]*x509.Certificate{pc.Cert.Leaf}),
	} {
		before := metricValue(t, "kvnet_proxy_ca_exchange_failures_total", badLabels)
		err := offer(pc, bundle)
		var ref *hop.RefusedError
		if !errors.As(err, &ref) || ref.Reason != hop.RefusedBadCABundle {
			t.Errorf("%s: got %v, want the refusal %s", what, err, hop.RefusedBadCABundle)
		}
		if after := metricValue(t, "kvnet_proxy_ca_exchange_failures_total", badLabels); after != before+1 {
			t.Errorf("%s: kvnet_proxy_ca_exchange_failures_total%v %v -> %v, want +1", what, badLabels, before, after)
		}
	}
	if _, after, _, err := externalCA(b.Client, kvNS); err != nil || after != before {
		t.Fatalf("refused offers changed cluster B's kubevirt-external-ca (%v):\n%s\n->\n%s", err, before, after)
	}
	// A configured peer writes its own slot, and only that: cluster A's
	// entry stays beside it, and A's next offers leave C's alone.
	if err := offer(pc, caexchange.EncodeCerts([]*x509.Certificate{kvX})); err != nil {
		t.Fatalf("cluster C's offer: %v", err)
	}
	got, _, slots, err := externalCA(b.Client, kvNS)
	if err != nil {
		t.Fatal(err)
	}
	if err := holds(got, []*x509.Certificate{kvA1, kvX}, []*x509.Certificate{kvIntruder}); err != nil {
		t.Fatalf("after cluster C's offer: %v", err)
	}
	if len(slots["cluster-c"]) != 1 || slots["cluster-c"][0] != caexchange.Fingerprint(kvX) || len(slots["cluster-a"]) != 1 {
		t.Fatalf("slots %v, want cluster-a: [kvA1], cluster-c: [kvX]", slots)
	}
	sent := map[string]string{"peer": "cluster-a", "direction": "received"}
	n := metricValue(t, "kvnet_proxy_ca_exchanges_total", sent)
	framework.Eventually(t, "cluster A offers again", caSyncTimeout, func() error {
		if v := metricValue(t, "kvnet_proxy_ca_exchanges_total", sent); v < n+2 {
			return fmt.Errorf("exchanges %v -> %v", n, v)
		}
		return nil
	})
	if got, _, _, err = externalCA(b.Client, kvNS); err != nil {
		t.Fatal(err)
	}
	if err := holds(got, []*x509.Certificate{kvA1, kvX}, []*x509.Certificate{kvB1, kvB2}); err != nil {
		t.Errorf("after cluster A's later offers: %v", err)
	}
	if v := metricValue(t, "kvnet_proxy_ca_exchange_last_success_timestamp_seconds", map[string]string{"peer": "cluster-b", "direction": "sent"}); v <= 0 {
		t.Errorf("no last success time for the offers to cluster-b: %v", v)
	}
}

// metricValue reads a counter or gauge with the given labels from the
// registry every proxy of the test process exports to; 0 if absent.
func metricValue(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelsAre(m, labels) {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}
