package test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/test/framework"
)

// Leases across two API servers, both proxies: cluster A (the suite's)
// keeps the claims of three VMs that moved away and were deleted in A. Two
// moved to cluster B, whose proxy answers A's lease checks: while B holds a
// VM, its lease stays; once B deletes one, A releases that lease within a
// check, and only that one. The third moved to cluster C, whose proxy does
// not answer: its lease stays, however many checks fail.
func TestLeasesReleasedByThePeer(t *testing.T) {
	ctx := context.Background()
	b, err := framework.StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	pa, pb, pc := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-b"), certstest.New(t, "cluster-c")
	hopLn, err := net.Listen("tcp", net.JoinHostPort(loopbackAddr(t, 8), "0"))
	if err != nil {
		t.Fatal(err)
	}
	mgrB, err := app.NewProxyManager(b.Config, app.ProxyOptions{
		AdvertiseAddress: loopbackAddr(t, 9), HopListener: hopLn, Cert: pb.Cert, ReceiveIdentities: true,
		Peers:       []*proxy.Peer{{Name: "cluster-a", CAs: pa.Pool}},
		MetricsAddr: "0", ProbeAddr: "0", Namespace: framework.KvnetNamespace, CreateObjects: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	startProxy(t, mgrB)

	// The three VMs in A, with their claims.
	ns := env.NewNamespace(t, nil)
	piPersistentNAD(t, ns, "blue", "blue-"+ns)
	names := []string{"kept", "gone", "unasked"}
	claims := map[string]string{}
	for _, n := range names {
		vm := piVmWithNetworks(ns, n, [2]string{"blue", "blue"})
		piCreateVM(t, vm)
		c := piWaitClaim(t, ns, persistentips.ClaimName(n, "blue"), "VirtualMachine", n, vm.UID, "blue-"+ns, "blue")
		claims[n] = c.Name
		t.Cleanup(func() { dropClaimFinalizer(c) })
	}
	// Where two of them run now: cluster B, same namespace and names.
	mustCreate(t, b.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	for _, n := range []string{"kept", "gone"} {
		mustCreate(t, b.Client, piVmWithNetworks(ns, n, [2]string{"blue", "blue"}))
	}

	// A's proxy: B answers, C's address does not.
	held := metricValue(t, "kvnet_proxy_lease_checks_total", map[string]string{"peer": "cluster-b", "outcome": "held"})
	unanswered := metricValue(t, "kvnet_proxy_lease_checks_total", map[string]string{"peer": "cluster-c", "outcome": "error"})
	mgrA, err := app.NewProxyManager(env.Config, app.ProxyOptions{
		AdvertiseAddress: loopbackAddr(t, 10), Cert: pa.Cert, SendIdentities: true, LeaseCheckInterval: 300 * time.Millisecond,
		Peers: []*proxy.Peer{
			{Name: "cluster-b", Addresses: []string{hopLn.Addr().String()}, CAs: pb.Pool, ConnectHosts: []string{"192.0.2.2"}},
			{Name: "cluster-c", Addresses: []string{"127.0.0.1:1"}, CAs: pc.Pool, ConnectHosts: []string{"192.0.2.3"}},
		},
		MetricsAddr: "0", ProbeAddr: "0", Namespace: framework.KvnetNamespace, CreateObjects: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	startProxy(t, mgrA)

	// The moves, as KubeVirt records them in A, then the VMs deleted in A.
	for n, host := range map[string]string{"kept": "192.0.2.2", "gone": "192.0.2.2", "unasked": "192.0.2.3"} {
		vmim := &kubevirtv1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n + "-out"},
			Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: n,
				SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: "move-" + n + "-" + ns, ConnectURL: host + ":9185"}},
		}
		mustCreate(t, env.Client, vmim)
		vmim.Status.Phase = kubevirtv1.MigrationSucceeded
		if err := env.Client.Status().Update(ctx, vmim); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names {
		piEventually(t, n+"'s claim a lease", func() error {
			c, err := piGetClaim(ns, claims[n])
			if err != nil {
				return err
			}
			if l, ok := persistentips.LeaseOf(c); !ok || l.Target != ns+"/"+n {
				return fmt.Errorf("annotations %v", c.Annotations)
			}
			return nil
		})
		vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n}}
		if err := env.Client.Delete(ctx, vm); err != nil {
			t.Fatal(err)
		}
		piDropFinalizer(vm)
	}

	// B holds both: checks answer held, and nothing is released.
	piEventually(t, "cluster B answers two lease checks held", func() error {
		if d := metricValue(t, "kvnet_proxy_lease_checks_total", map[string]string{"peer": "cluster-b", "outcome": "held"}) - held; d < 4 {
			return fmt.Errorf("%v held answers so far", d)
		}
		return nil
	})
	for _, n := range names {
		if c, err := piGetClaim(ns, claims[n]); err != nil || !controllerutil.ContainsFinalizer(c, persistentips.Finalizer) {
			t.Fatalf("%s's claim while the peer holds it or cannot be asked: %v, %+v; want it kept", n, err, c)
		}
	}

	// B deletes one: A releases that lease, and only that one.
	if err := b.Client.Delete(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gone"}}); err != nil {
		t.Fatal(err)
	}
	piEventually(t, "the lease of the VM cluster B deleted released", func() error {
		c, err := piGetClaim(ns, claims["gone"])
		if err == nil && controllerutil.ContainsFinalizer(c, persistentips.Finalizer) {
			return fmt.Errorf("finalizers %v, annotations %v", c.Finalizers, c.Annotations)
		}
		return nil
	})
	after := metricValue(t, "kvnet_proxy_lease_checks_total", map[string]string{"peer": "cluster-b", "outcome": "held"})
	piEventually(t, "cluster B asked about the VM it keeps again", func() error {
		if d := metricValue(t, "kvnet_proxy_lease_checks_total", map[string]string{"peer": "cluster-b", "outcome": "held"}) - after; d < 1 {
			return fmt.Errorf("no held answer since")
		}
		return nil
	})
	if d := metricValue(t, "kvnet_proxy_lease_checks_total", map[string]string{"peer": "cluster-c", "outcome": "error"}) - unanswered; d < 2 {
		t.Errorf("cluster C's lease asked %v times without an answer, want at least 2", d)
	}
	for _, n := range []string{"kept", "unasked"} {
		if c, err := piGetClaim(ns, claims[n]); err != nil || !controllerutil.ContainsFinalizer(c, persistentips.Finalizer) {
			t.Errorf("%s's claim: %v, %+v; want it kept (its VM is still in B, or its peer is down)", n, err, c)
		}
	}
}
