package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
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
// moved, beside it, has its claim released as before. A tenant cannot
// release the lease; the namespace's admin can, with one annotation.
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
	// The controller counts after the API server has its write, so the
	// metrics are waited for, not read once.
	piEventually(t, "the lease counted", func() error {
		if d := metricValue(t, "kvnet_persistentips_leases_held", map[string]string{"peer": "cluster-b"}) - held; d != 1 {
			return fmt.Errorf("kvnet_persistentips_leases_held{peer=cluster-b} rose by %v, want 1", d)
		}
		return nil
	})
	if age := metricValue(t, "kvnet_persistentips_oldest_lease_age_seconds", map[string]string{"peer": "cluster-b"}); age <= 0 || age > 3600 {
		t.Errorf("kvnet_persistentips_oldest_lease_age_seconds{peer=cluster-b} = %v, want the lease's age", age)
	}

	// The release: a tenant (the namespace's edit role) may not set
	// kvnet.io/lease-release; the namespace's admin (the chart's
	// lease-release rule, which it aggregates into admin) may, and kvnet
	// then lets the claim go.
	released := metricValue(t, "kvnet_persistentips_claims_released_total", map[string]string{"reason": persistentips.ReasonLeaseReleased})
	tenant := userClient(t, ns, "tenant", rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"})
	if err := annotateClaim(tenant, c, "the VM is gone from cluster-b"); !apierrors.IsForbidden(err) {
		t.Errorf("a tenant setting %s: %v, want forbidden", persistentips.LeaseReleaseAnnotation, err)
	}
	releaser := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-lease-release"}, Rules: []rbacv1.PolicyRule{persistentips.LeaseReleaseRule}}
	if err := env.Client.Create(ctx, releaser); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, releaser) })
	admin := userClient(t, ns, "admin", rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: releaser.Name})
	if err := annotateClaim(admin, c, "the VM is gone from cluster-b"); err != nil {
		t.Fatalf("the namespace's admin setting %s: %v", persistentips.LeaseReleaseAnnotation, err)
	}
	piEventually(t, "the released lease's claim let go", func() error {
		cur, err := piGetClaim(ns, movedClaim.Name)
		if err == nil && controllerutil.ContainsFinalizer(cur, persistentips.Finalizer) {
			return fmt.Errorf("finalizers %v", cur.Finalizers)
		}
		return nil
	})
	piEventually(t, "the release counted", func() error {
		if d := metricValue(t, "kvnet_persistentips_claims_released_total", map[string]string{"reason": persistentips.ReasonLeaseReleased}) - released; d != 1 {
			return fmt.Errorf("kvnet_persistentips_claims_released_total{reason=%s} rose by %v, want 1", persistentips.ReasonLeaseReleased, d)
		}
		if d := metricValue(t, "kvnet_persistentips_leases_held", map[string]string{"peer": "cluster-b"}) - held; d != 0 {
			return fmt.Errorf("kvnet_persistentips_leases_held{peer=cluster-b} is %v above where it started, want 0 once released", d)
		}
		return nil
	})
}

// userClient is a client acting as user <name>@<ns>, bound in ns to role.
func userClient(t *testing.T, ns, name string, role rbacv1.RoleRef) client.Client {
	t.Helper()
	user := name + "@" + ns
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:    role,
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if err := env.Client.Create(context.Background(), rb); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: app.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// annotateClaim sets kvnet.io/lease-release on claim as c's user would
// with kubectl annotate.
func annotateClaim(c client.Client, claim *ipamv1alpha1.IPAMClaim, why string) error {
	patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, persistentips.LeaseReleaseAnnotation, why))
	return c.Patch(context.Background(), claim.DeepCopy(), client.RawPatch(types.MergePatchType, patch))
}

// dropClaimFinalizer lets a lease go at the end of a test that failed
// before releasing it.
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
