package test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/test/framework"
)

// Leases across two API servers, both proxies: cluster A (the suite's)
// keeps the claims of four VMs that moved away and were deleted in A. Three
// moved to cluster B, whose proxy answers A's lease checks: while B's VM
// exists and a claim of it holds IPs, its lease stays; once B deletes one
// VM, and removes another's claim, A releases those two leases within a
// check, and only those. The fourth moved to cluster C, whose proxy does
// not answer: its lease stays, however many checks fail, until the
// namespace's admin releases it by hand (a tenant may not).
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
	names := []string{"kept", "gone", "emptied", "unasked"}
	claims := map[string]string{}
	for _, n := range names {
		vm := piVmWithNetworks(ns, n, [2]string{"blue", "blue"})
		piCreateVM(t, vm)
		c := piWaitClaim(t, ns, persistentips.ClaimName(n, "blue"), "VirtualMachine", n, vm.UID, "blue-"+ns, "blue")
		claims[n] = c.Name
		t.Cleanup(func() { dropClaimFinalizer(c) })
	}
	// Where three of them run now: cluster B, same namespace and names,
	// each with the claim the identity exchange filled.
	mustCreate(t, b.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	inB := map[string]*ipamv1alpha1.IPAMClaim{}
	for i, n := range []string{"kept", "gone", "emptied"} {
		vm := piVmWithNetworks(ns, n, [2]string{"blue", "blue"})
		mustCreate(t, b.Client, vm)
		c := &ipamv1alpha1.IPAMClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: persistentips.ClaimName(n, "blue"), OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: n, UID: vm.UID, Controller: ptr.To(true),
			}}},
			Spec: ipamv1alpha1.IPAMClaimSpec{Network: "blue-" + ns, Interface: persistentips.PodInterfaceName("blue")},
		}
		mustCreate(t, b.Client, c)
		c.Status.IPs = []string{fmt.Sprintf("10.100.0.%d/24", 10+i)}
		if err := b.Client.Status().Update(ctx, c); err != nil {
			t.Fatal(err)
		}
		inB[n] = c
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
	for n, host := range map[string]string{"kept": "192.0.2.2", "gone": "192.0.2.2", "emptied": "192.0.2.2", "unasked": "192.0.2.3"} {
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

	// B holds all three: checks answer held, and nothing is released.
	piEventually(t, "cluster B answers two rounds of lease checks held", func() error {
		if d := metricValue(t, "kvnet_proxy_lease_checks_total", map[string]string{"peer": "cluster-b", "outcome": "held"}) - held; d < 6 {
			return fmt.Errorf("%v held answers so far", d)
		}
		return nil
	})
	for _, n := range names {
		if c, err := piGetClaim(ns, claims[n]); err != nil || !controllerutil.ContainsFinalizer(c, persistentips.Finalizer) {
			t.Fatalf("%s's claim while the peer holds it or cannot be asked: %v, %+v; want it kept", n, err, c)
		}
	}

	// B deletes one VM, and another's claim: A releases those two leases,
	// and only those.
	if err := b.Client.Delete(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gone"}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Client.Delete(ctx, inB["emptied"]); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"gone", "emptied"} {
		piEventually(t, "the lease of "+n+" released", func() error {
			c, err := piGetClaim(ns, claims[n])
			if err == nil && controllerutil.ContainsFinalizer(c, persistentips.Finalizer) {
				return fmt.Errorf("finalizers %v, annotations %v", c.Finalizers, c.Annotations)
			}
			return nil
		})
	}
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

	// The peer that is down will not answer: the namespace's admin releases
	// its lease by hand; a tenant may not.
	c, err := piGetClaim(ns, claims["unasked"])
	if err != nil {
		t.Fatal(err)
	}
	tenant := userClient(t, ns, "tenant", rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"})
	if err := annotateClaim(tenant, c, "cluster-c is gone"); !apierrors.IsForbidden(err) {
		t.Errorf("a tenant releasing a lease: %v, want forbidden", err)
	}
	releaser := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-lease-release"}, Rules: []rbacv1.PolicyRule{persistentips.LeaseReleaseRule}}
	mustCreate(t, env.Client, releaser)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), releaser) })
	admin := userClient(t, ns, "admin", rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: releaser.Name})
	if err := annotateClaim(admin, c, "cluster-c is gone"); err != nil {
		t.Fatalf("the namespace's admin releasing a lease: %v", err)
	}
	piEventually(t, "the lease the admin released let go", func() error {
		c, err := piGetClaim(ns, claims["unasked"])
		if err == nil && controllerutil.ContainsFinalizer(c, persistentips.Finalizer) {
			return fmt.Errorf("finalizers %v", c.Finalizers)
		}
		return nil
	})
}
