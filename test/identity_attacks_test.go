package test

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/internal/proxy/store"
	"github.com/kvnet/kvnet/test/framework"
)

// sourceCluster is the source side of the identity attacks: its own API
// server with a `kvnet proxy` that offers identities to the target.
type sourceCluster struct {
	*framework.Cluster
	network string
}

// vm creates a running VM's VMI in ns of the source cluster, with the
// interface MAC the guest reports, and its claim on the blue network as
// kvnet's controller created it and OVN-Kubernetes filled it with ip.
func (s *sourceCluster) vm(t *testing.T, ns, name, ip, mac string) {
	t.Helper()
	ctx := context.Background()
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       *piVmWithNetworks(ns, name, [2]string{"blue", "blue"}).Spec.Template.Spec.DeepCopy(),
	}
	mustCreate(t, s.Client, vmi)
	vmi.Status = kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running, Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{
		{Name: "default", MAC: "02:6b:76:00:00:01"}, {Name: "blue", MAC: mac, IP: strings.Split(ip, "/")[0]},
	}}
	if err := s.Client.Update(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	claim := persistentips.NewClaim(persistentips.OwnerOf(vmi), "blue", s.network)
	mustCreate(t, s.Client, claim)
	claim.Status.IPs = []string{ip}
	if err := s.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
}

// editor is a user with what KubeVirt's kubevirt.io:edit grants on its
// core kinds, in ns of cluster c only (a RoleBinding), acting by
// impersonation.
func editor(t *testing.T, cfg *rest.Config, c client.Client, ns string) client.Client {
	t.Helper()
	name := "kubevirt-editor-" + ns
	mustCreate(t, c, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kubevirt-edit"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"kubevirt.io"},
			Resources: []string{"virtualmachines", "virtualmachineinstances", "virtualmachineinstancemigrations"},
			Verbs:     []string{"get", "delete", "create", "update", "patch", "list", "watch"}}},
	})
	mustCreate(t, c, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kubevirt-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "kubevirt-edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}},
	})
	cfg = rest.CopyConfig(cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: name, Groups: []string{"system:authenticated"}}
	out, err := client.New(cfg, client.Options{Scheme: app.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startSourceProxy runs the source cluster's `kvnet proxy` on cfg, with
// certificate cert, offering identities to the target it; n picks its
// loopback address (127.0.0.n).
func startSourceProxy(t *testing.T, cfg *rest.Config, it *identityTarget, cert tls.Certificate, n int) {
	t.Helper()
	mgr, err := app.NewProxyManager(cfg, app.ProxyOptions{
		AdvertiseAddress: loopbackAddr(t, n), Cert: cert, Peers: []*proxy.Peer{it.hop}, SendIdentities: true,
		MetricsAddr: "0", ProbeAddr: "0", Namespace: framework.KvnetNamespace, CreateObjects: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	startProxy(t, mgr)
}

// waitRefusedAtTarget waits until the target has counted reason more
// than before times.
func waitRefusedAtTarget(t *testing.T, what string, reason hop.RefusalCode, before float64) {
	t.Helper()
	proxyEventually(t, what, func() error {
		if d := refusedCount(t, "target", reason) - before; d < 1 {
			return fmt.Errorf("kvnet_proxy_refused_total{side=target,reason=%s} rose by %v", reason, d)
		}
		return nil
	})
}

// heldClaim creates, in ns of the target cluster, a claim on network
// that holds ip, as another VM's claim would (no owner or finalizer).
func heldClaim(t *testing.T, ns, network, ip string) {
	t.Helper()
	c := persistentips.NewClaim(persistentips.Owner{Kind: "VirtualMachine", Namespace: ns, Name: "app", UID: "uid-app"}, "blue", network)
	c.OwnerReferences, c.Finalizers = nil, nil
	mustCreate(t, env.Client, c)
	c.Status.IPs = []string{ip}
	if err := env.Client.Status().Update(context.Background(), c); err != nil {
		t.Fatal(err)
	}
}

// send creates, as user c, the sending VMIM of VM ns/name in the source
// cluster for migration ID id, with annotations.
func send(t *testing.T, c client.Client, ns, name, id string, annotations map[string]string) {
	t.Helper()
	m := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-out", Annotations: annotations},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: name,
			SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: id, ConnectURL: "127.0.0.1:9185"}},
	}
	if err := c.Create(context.Background(), m); err != nil {
		t.Fatalf("the sending VMIM %s/%s: %v", ns, m.Name, err)
	}
}

// tenantReceive is what a tenant with kubevirt.io:edit in ns of the
// target cluster creates to receive a migration: a WaitAsReceiver VM (its
// VMI started as virt-controller does) and a receiving VMIM with
// migration ID id and annotations.
func tenantReceive(t *testing.T, c client.Client, ns, name, id string, annotations map[string]string) (*kubevirtv1.VirtualMachineInstance, *kubevirtv1.VirtualMachineInstanceMigration) {
	t.Helper()
	ctx := context.Background()
	vm := piVmWithNetworks(ns, name, [2]string{"blue", "blue"})
	vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyWaitAsReceiver)
	if err := c.Create(ctx, vm); err != nil {
		t.Fatalf("the tenant's VM: %v", err)
	}
	vmi := piStartVMI(t, vm)
	vmim := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-in", Annotations: annotations},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: name,
			Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: id}},
	}
	if err := c.Create(ctx, vmim); err != nil {
		t.Fatalf("the tenant's receiving VMIM: %v", err)
	}
	return vmi, vmim
}

// identityEvents are the NetworkIdentity* events in ns.
func identityEvents(t *testing.T, ns string) []string {
	t.Helper()
	var evs eventsv1.EventList
	if err := env.Client.List(context.Background(), &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if strings.HasPrefix(e.Reason, "NetworkIdentity") {
			out = append(out, e.Regarding.Name+": "+e.Reason+": "+e.Note)
		}
	}
	return out
}

// admitTargetPod creates the target pod of vmim as virt-controller does,
// again after each denial that says the claims hold no IPs yet (the one
// denial a pod waiting for its identity gets); any other error fails.
func admitTargetPod(t *testing.T, vmi *kubevirtv1.VirtualMachineInstance, vmim *kubevirtv1.VirtualMachineInstanceMigration) *corev1.Pod {
	t.Helper()
	env.WaitCached(t, &kubevirtv1.VirtualMachineInstance{}, client.ObjectKeyFromObject(vmi))
	var pod *corev1.Pod
	proxyEventually(t, "the target pod of "+vmim.Name+" is admitted", func() error {
		pod = targetPod(vmi, vmim)
		err := env.Client.Create(context.Background(), pod)
		if err != nil && !(apierrors.IsForbidden(err) && strings.Contains(err.Error(), "hold no IPs yet")) {
			t.Fatalf("the target pod: %v, want admitted or denied until its claims hold IPs", err)
		}
		return err
	})
	return pod
}

// The attacks of issue 43 through both proxies on two API servers, each
// attacker a tenant with kubevirt.io:edit in its own namespace only; the
// victim keeps VM ns/vm1 (and ns/vm2) across the move.
//
//  2. In the source cluster, a tenant sends its own VM with the victim's
//     migration ID, once naming the victim's VM as its receiver
//     (kvnet.io/migration-target) and once not. The target refuses the
//     first as wrong-namespace-or-vm (the victim approved no such
//     sender) and does not find the second (unknown-migration, as for
//     any migration not yet received): counted on both sides and logged,
//     no binding made, the victim's claim and events untouched.
//  1. In the target cluster, a tenant receives with the victim's
//     migration ID before the victim does, approving the victim's VM as
//     its sender (kvnet.io/migration-source). The victim's source names
//     the victim's namespace, so the tenant's VMIM is never looked at:
//     its claim and namespace stay as they were.
//
// Then both victims' migrations go through, each VM keeping its own IPs
// and MAC.
func TestIdentityAttacksAcrossClusters(t *testing.T) {
	ctx := context.Background()
	it := startIdentityTarget(t)
	victim := it.ns
	c, err := framework.StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	src := &sourceCluster{Cluster: c, network: it.network}
	tenantA := "tenant-" + victim // the attacker's namespace in the source cluster
	for _, ns := range []string{victim, tenantA} {
		mustCreate(t, src.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	src.vm(t, victim, "vm1", "10.100.0.9/24", "02:6b:76:01:00:09")
	src.vm(t, victim, "vm2", "10.100.0.10/24", "02:6b:76:01:00:10")
	src.vm(t, tenantA, "evil", "10.100.0.66/24", "02:6b:76:01:00:66")
	src.vm(t, tenantA, "sly", "10.100.0.67/24", "02:6b:76:01:00:67")
	owner, attackerA := editor(t, src.Config, src.Client, victim), editor(t, src.Config, src.Client, tenantA)
	startSourceProxy(t, src.Config, it, it.fromA.Cert, 7)
	offered := func(outcome string) float64 {
		return metricValue(t, "kvnet_proxy_identities_offered_total", map[string]string{"outcome": outcome})
	}
	bound := func(id string) bool {
		var cm corev1.ConfigMap
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: framework.KvnetNamespace, Name: store.DefaultBindingsName}, &cm)
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		_, ok := cm.Data[store.BindingKey(id)]
		return ok
	}

	// Attack 2: the victim is waiting to receive vm1.
	vmi1, vmim1 := it.receive(t, "vm1")
	id1 := vmim1.Spec.Receive.MigrationID
	env.WaitCached(t, &kubevirtv1.VirtualMachineInstanceMigration{}, client.ObjectKeyFromObject(vmim1))
	claim1, _ := piGetClaim(victim, "vm1.blue")
	wrongVM, notFound := refusedCount(t, "target", hop.RefusedWrongVM), refusedCount(t, "target", hop.RefusedUnknownMigration)
	wrongVMLogs := env.Logs.Count("refused a stream", "reason", hop.RefusedWrongVM.String(), "peer", "cluster-a")
	offeredWrongVM := offered(hop.RefusedWrongVM.String())
	send(t, attackerA, tenantA, "evil", id1, map[string]string{proxy.AnnotationMigrationTarget: victim + "/vm1"})
	send(t, attackerA, tenantA, "sly", id1, nil)
	proxyEventually(t, "the tenant's identity naming the victim's VM refused and counted at both ends", func() error {
		if d := refusedCount(t, "target", hop.RefusedWrongVM) - wrongVM; d < 1 {
			return fmt.Errorf("kvnet_proxy_refused_total{side=target,reason=%s} rose by %v", hop.RefusedWrongVM, d)
		}
		if d := offered(hop.RefusedWrongVM.String()) - offeredWrongVM; d < 1 {
			return fmt.Errorf("kvnet_proxy_identities_offered_total{outcome=%s} rose by %v", hop.RefusedWrongVM, d)
		}
		if d := env.Logs.Count("refused a stream", "reason", hop.RefusedWrongVM.String(), "peer", "cluster-a") - wrongVMLogs; d < 1 {
			return fmt.Errorf("%d log lines", d)
		}
		return nil
	})
	waitRefusedAtTarget(t, "the tenant's identity naming its own VM not found", hop.RefusedUnknownMigration, notFound)
	if after, _ := piGetClaim(victim, "vm1.blue"); after.ResourceVersion != claim1.ResourceVersion || len(after.Status.IPs) != 0 {
		t.Fatalf("the victim's claim changed under attack 2: status.ips %v, annotations %v", after.Status.IPs, after.Annotations)
	}
	if bound(id1) {
		t.Fatalf("a refused identity bound migration %s", id1)
	}
	if evs := identityEvents(t, victim); len(evs) != 0 {
		t.Fatalf("events in the victim's namespace after attack 2: %q", evs)
	}

	// Attack 1: a tenant of the target cluster receives vm2's migration
	// ID before the victim does, approving the victim's VM as its sender.
	tenantB := env.NewNamespace(t, nil)
	piPersistentNAD(t, tenantB, "blue", it.network)
	attackerB := editor(t, env.Config, env.Client, tenantB)
	id2 := victim + "-vm2" // it.receive's ID for vm2: guessable on purpose
	tvmi, tvmim := tenantReceive(t, attackerB, tenantB, "vm2", id2,
		map[string]string{proxy.AnnotationMigrationSource: proxy.Approval("cluster-a", hop.VMRef{Namespace: victim, Name: "vm2"})})
	tclaim := piWaitClaim(t, tenantB, "vm2.blue", "VirtualMachine", "vm2", tvmi.OwnerReferences[0].UID, it.network, "blue")
	env.WaitCached(t, &kubevirtv1.VirtualMachineInstanceMigration{}, client.ObjectKeyFromObject(tvmim))
	notFound = refusedCount(t, "target", hop.RefusedUnknownMigration)
	send(t, owner, victim, "vm2", id2, nil)
	waitRefusedAtTarget(t, "the victim's identity for vm2 not found while only the tenant's VMIM holds its ID", hop.RefusedUnknownMigration, notFound)
	if after, _ := piGetClaim(tenantB, "vm2.blue"); after.ResourceVersion != tclaim.ResourceVersion || len(after.Status.IPs) != 0 {
		t.Fatalf("the tenant's claim took something: status.ips %v, annotations %v", after.Status.IPs, after.Annotations)
	}
	if evs := identityEvents(t, tenantB); len(evs) != 0 {
		t.Fatalf("events in the tenant's namespace: %q", evs)
	}

	// The victims' migrations, started after: each VM keeps its own IP
	// and MAC, and the tenant's claim and pod get nothing.
	send(t, owner, victim, "vm1", id1, nil)
	vmi2, vmim2 := it.receive(t, "vm2")
	for _, c := range []struct {
		vmi   *kubevirtv1.VirtualMachineInstance
		vmim  *kubevirtv1.VirtualMachineInstanceMigration
		claim string
		ips   []string
		mac   string
	}{
		{vmi1, vmim1, "vm1.blue", []string{"10.100.0.9/24"}, "02:6b:76:01:00:09"},
		{vmi2, vmim2, "vm2.blue", []string{"10.100.0.10/24"}, "02:6b:76:01:00:10"},
	} {
		pod := admitTargetPod(t, c.vmi, c.vmim)
		elems := piSelection(t, piStoredPod(t, pod))
		got, err := piGetClaim(victim, c.claim)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Status.IPs, c.ips) || len(elems) != 1 || elems[0]["ipam-claim-reference"] != c.claim || elems[0]["mac"] != c.mac {
			t.Fatalf("%s: claim status.ips %v and target pod elements %v, want %v and MAC %s", c.claim, got.Status.IPs, elems, c.ips, c.mac)
		}
	}
	if after, _ := piGetClaim(tenantB, "vm2.blue"); after.ResourceVersion != tclaim.ResourceVersion || len(after.Status.IPs) != 0 {
		t.Fatalf("the tenant's claim took something once the victim received: status.ips %v", after.Status.IPs)
	}
	err = env.Client.Create(ctx, targetPod(tvmi, tvmim))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "hold no IPs yet") {
		t.Fatalf("the tenant's target pod: %v, want denied while its claim holds no IPs", err)
	}
}
