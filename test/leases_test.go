package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/test/framework"
)

// leaseKept is the claim controller's log line when it keeps a moved VM's
// claim as a lease.
const leaseKept = "the VM is gone but moved to another cluster: keeping its claim as a lease"

// A VM whose sending VMIM succeeded runs in the peer cluster now, with the
// same IPs: the source proxy makes its claims leases of that peer, and
// when the source VM is deleted the claim controller keeps them (kvnet's
// finalizer stays: the IPs stay held) and counts them in
// kvnet_persistentips_leases_held{peer}. A VM deleted without having
// moved, beside it, has its claim released as before.
func TestMovedVMKeepsItsClaimsAsLeases(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, nil)
	piPersistentNAD(t, ns, "blue", "blue-"+ns)
	moved, stayed := piVmWithNetworks(ns, "moved", [2]string{"blue", "blue"}), piVmWithNetworks(ns, "stayed", [2]string{"blue", "blue"})
	piCreateVM(t, moved)
	piCreateVM(t, stayed)
	movedClaim := piWaitClaim(t, ns, persistentips.ClaimName("moved", "blue"), "VirtualMachine", "moved", moved.UID, "blue-"+ns, "blue")
	stayedClaim := piWaitClaim(t, ns, persistentips.ClaimName("stayed", "blue"), "VirtualMachine", "stayed", stayed.UID, "blue-"+ns, "blue")
	t.Cleanup(func() { dropClaimFinalizer(movedClaim) })

	peerB := certstest.New(t, "cluster-b")
	mgr, err := app.NewProxyManager(env.Config, app.ProxyOptions{
		AdvertiseAddress: loopbackAddr(t, 7), Cert: certstest.New(t, "cluster-a").Cert, SendIdentities: true,
		Peers:       []*proxy.Peer{{Name: "cluster-b", Addresses: []string{"127.0.0.1:1"}, CAs: peerB.Pool}},
		MetricsAddr: "0", ProbeAddr: "0", Namespace: framework.KvnetNamespace, CreateObjects: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	startProxy(t, mgr)
	held := metricValue(t, "kvnet_persistentips_leases_held", map[string]string{"peer": "cluster-b"})

	// The move, as KubeVirt records it in the source cluster: the sending
	// VMIM, Succeeded.
	migID := "move-" + ns
	vmim := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "moved-out"},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "moved",
			SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: migID, ConnectURL: "127.0.0.1:9185"}},
	}
	if err := env.Client.Create(ctx, vmim); err != nil {
		t.Fatal(err)
	}
	vmim.Status.Phase = kubevirtv1.MigrationSucceeded
	if err := env.Client.Status().Update(ctx, vmim); err != nil {
		t.Fatal(err)
	}
	piEventually(t, "the moved VM's claim is a lease of cluster-b", func() error {
		c, err := piGetClaim(ns, movedClaim.Name)
		if err != nil {
			return err
		}
		if l, ok := persistentips.LeaseOf(c); !ok || l.Peer != "cluster-b" || l.MigrationID != migID || time.Since(l.Since) > time.Hour {
			return fmt.Errorf("annotations %v", c.Annotations)
		}
		return nil
	})
	if c, _ := piGetClaim(ns, stayedClaim.Name); c != nil {
		if _, ok := persistentips.LeaseOf(c); ok {
			t.Errorf("the VM that did not move has a lease: %v", c.Annotations)
		}
	}

	// Both VMs deleted (virt-controller's finalizer dropped, as it does).
	for _, vm := range []*kubevirtv1.VirtualMachine{moved, stayed} {
		if err := env.Client.Delete(ctx, vm); err != nil {
			t.Fatal(err)
		}
		piDropFinalizer(vm)
	}
	piEventually(t, "the stayed VM's claim released", func() error {
		c, err := piGetClaim(ns, stayedClaim.Name)
		if err == nil && controllerutil.ContainsFinalizer(c, persistentips.Finalizer) {
			return fmt.Errorf("finalizers %v", c.Finalizers)
		}
		return nil
	})
	piEventually(t, "the moved VM's claim kept as a lease", func() error {
		if env.Logs.Count(leaseKept, "claim", movedClaim.Name) == 0 {
			return fmt.Errorf("no %q for %s yet", leaseKept, movedClaim.Name)
		}
		return nil
	})
	c, err := piGetClaim(ns, movedClaim.Name)
	if err != nil || !controllerutil.ContainsFinalizer(c, persistentips.Finalizer) {
		t.Fatalf("the moved VM's claim after the VM was deleted: %v, %+v; want it kept with kvnet's finalizer", err, c)
	}
	if d := metricValue(t, "kvnet_persistentips_leases_held", map[string]string{"peer": "cluster-b"}) - held; d != 1 {
		t.Errorf("kvnet_persistentips_leases_held{peer=cluster-b} rose by %v, want 1", d)
	}
	if age := metricValue(t, "kvnet_persistentips_oldest_lease_age_seconds", map[string]string{"peer": "cluster-b"}); age <= 0 || age > 3600 {
		t.Errorf("kvnet_persistentips_oldest_lease_age_seconds{peer=cluster-b} = %v, want the lease's age", age)
	}
}

// dropClaimFinalizer lets a lease go at the end of a test (releasing
// leases is not built yet).
func dropClaimFinalizer(c *ipamv1alpha1.IPAMClaim) {
	ctx := context.Background()
	var cur ipamv1alpha1.IPAMClaim
	if env.Client.Get(ctx, client.ObjectKeyFromObject(c), &cur) != nil {
		return
	}
	base := cur.DeepCopy()
	if controllerutil.RemoveFinalizer(&cur, persistentips.Finalizer) {
		_ = env.Client.Patch(ctx, &cur, client.MergeFrom(base))
	}
}
