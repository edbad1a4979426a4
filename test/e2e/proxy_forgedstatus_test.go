package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/test/framework"
)

// decentralizedGate is the feature gate virt-api requires before it admits
// a VMIM with spec.receive or spec.sendTo.
const decentralizedGate = "DecentralizedLiveMigration"

// Issue 27, item 2, through the real virt-api v1.9.0: the VMI CRD has no
// status subresource, so a tenant (a user with KubeVirt's edit rights in
// its namespace) writes a VMI's status with the VMI. What virt-api does
// with it, measured here:
//
//   - on CREATE it keeps the status the tenant sent, a forged
//     migrationState.targetState (node, nodeAddress, directMigrationNodePorts)
//     included; it only resets the phase (Running sent, Pending stored) and
//     adds its own fields;
//   - on UPDATE it puts back the stored status: the request succeeds, the
//     rest of it (here a label) is stored, the status change is dropped.
//
// So a receiving VMI created with a forged target endpoint reaches the
// target proxy (virt-controller, taking the receiving VMIM, keeps the
// forged address and ports), which must not trust it: it dials only the
// address kvnet allocated to the virt-handler on the node the status
// names. The tenant's listener at the forged address sees no connection,
// and the stream is refused as target-not-a-virt-handler, counted and
// logged.
func TestTenantVMIStatusThroughVirtAPI(t *testing.T) {
	ctx := context.Background()
	updateKubeVirt(t, func(s *kubevirtv1.KubeVirtSpec) {
		s.Configuration.DeveloperConfiguration.FeatureGates = append(s.Configuration.DeveloperConfiguration.FeatureGates, decentralizedGate)
	})
	t.Cleanup(func() {
		updateKubeVirt(t, func(s *kubevirtv1.KubeVirtSpec) {
			dc := s.Configuration.DeveloperConfiguration
			dc.FeatureGates = slices.DeleteFunc(dc.FeatureGates, func(g string) bool { return g == decentralizedGate })
		})
	})
	ns := env.NewNamespace(t, nil)
	tenant := tenantClient(t, ns)

	// The tenant's listener, where the forged status points the target.
	forged, err := net.Listen("tcp", "127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = forged.Close() })
	dialled := make(chan struct{}, 1)
	go func() {
		for {
			c, err := forged.Accept()
			if err != nil {
				return
			}
			select {
			case dialled <- struct{}{}:
			default:
			}
			_ = c.Close()
		}
	}()
	port := forged.Addr().(*net.TCPAddr).Port
	// kvnet's allocation for node-b's virt-handler, the one address the
	// target dials for that node (written as kvnet would; no kvnet
	// migration pool runs in this tier).
	handler := &migration.Allocation{Pool: migration.PoolInCluster, Address: netip.MustParseAddr("127.0.0.1"), PrefixLength: 24,
		State: migration.StateBound, Node: "node-b", PodNamespace: framework.KubeVirtNamespace, PodName: "virt-handler-node-b", PodUID: "uid-node-b"}
	cm := handler.ToConfigMap(framework.KvnetNamespace)
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), cm) })

	// (1) CREATE: the tenant's receiving VMI announces a target endpoint
	// of its choice.
	var vmi kubevirtv1.VirtualMachineInstance
	if err := yaml.UnmarshalStrict([]byte(vmiYAML("vm1")), &vmi); err != nil {
		t.Fatal(err)
	}
	vmi.Namespace = ns
	forgedTarget := kubevirtv1.VirtualMachineInstanceMigrationTargetState{
		VirtualMachineInstanceCommonMigrationState: kubevirtv1.VirtualMachineInstanceCommonMigrationState{Node: "node-b"},
		NodeAddress: ptr.To("127.0.0.3"), DirectMigrationNodePorts: map[string]int{strconv.Itoa(port): 49152},
	}
	vmi.Status = kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running,
		MigrationState: &kubevirtv1.VirtualMachineInstanceMigrationState{TargetState: forgedTarget.DeepCopy()}}
	if err := tenant.Create(ctx, &vmi); err != nil {
		t.Fatalf("the tenant's VMI with a status: %v", err)
	}
	// vmi is what the API server stored, after virt-api's mutation.
	if vmi.Status.Phase != kubevirtv1.Pending {
		t.Errorf("stored phase %q, want virt-api's reset to Pending", vmi.Status.Phase)
	}
	if ms := vmi.Status.MigrationState; ms == nil || ms.TargetState == nil || !equalTarget(*ms.TargetState, forgedTarget) {
		t.Fatalf("stored migrationState %+v, want the tenant's targetState kept as sent (virt-api v1.9.0 keeps a created VMI's status)", ms)
	}

	// The receiving VMIM, and a target proxy that trusts cluster-a.
	var vmim *kubevirtv1.VirtualMachineInstanceMigration
	framework.Eventually(t, "virt-api to admit a receiving VMIM (feature gate "+decentralizedGate+")", waitTimeout, func() error {
		vmim = &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1-in"},
			Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1",
				Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: "mig-forged-" + ns}}}
		return tenant.Create(ctx, vmim)
	})
	pa, pb := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-b")
	hopLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := app.NewProxyManager(env.Config, app.ProxyOptions{
		AdvertiseAddress: "127.0.0.1", HopListener: hopLn, Cert: pb.Cert,
		Peers:       []*proxy.Peer{{Name: "cluster-a", CAs: pa.Pool}},
		MetricsAddr: "0", ProbeAddr: "0", Namespace: framework.KvnetNamespace, CreateObjects: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	framework.RunManager(t, mgr)
	// virt-controller takes the receiving VMIM (WaitingForSync) and
	// rewrites the VMI's targetState as KubeVirt's own account: measured,
	// it adds the migrationUID and drops the node, but keeps the tenant's
	// nodeAddress and ports. Whether the forged node stays or not, it is no
	// node where kvnet gave a virt-handler 127.0.0.3.
	framework.Eventually(t, "the proxy's cache has the live receiving VMIM and the forged endpoint", framework.CacheTimeout, func() error {
		var m kubevirtv1.VirtualMachineInstanceMigration
		if err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(vmim), &m); err != nil {
			return err
		}
		if m.IsFinal() {
			t.Fatalf("the receiving VMIM ended (%s) before a stream was presented", m.Status.Phase)
		}
		var cur kubevirtv1.VirtualMachineInstance
		if err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(&vmi), &cur); err != nil {
			return err
		}
		ms := cur.Status.MigrationState
		if ms == nil || ms.TargetState == nil || ptr.Deref(ms.TargetState.NodeAddress, "") != "127.0.0.3" ||
			fmt.Sprint(ms.TargetState.DirectMigrationNodePorts) != fmt.Sprint(forgedTarget.DirectMigrationNodePorts) {
			return fmt.Errorf("cached migrationState %+v", ms)
		}
		return nil
	})

	before := refusedTotal(t, hop.RefusedTargetNotHandler)
	logged := env.Logs.Count("refused a stream", "reason", hop.RefusedTargetNotHandler.String(), "peer", "cluster-a")
	target := &proxy.Peer{Name: "cluster-b", Addresses: []string{hopLn.Addr().String()}, CAs: pb.Pool}
	conn, err := (&proxy.Dialer{Cert: pa.Cert, Mode: hop.ModeTLS}).Dial(ctx, target, hop.SameVM(vmim.Spec.Receive.MigrationID, vmim.Namespace, vmim.Spec.VMIName), uint16(port))
	if err == nil {
		_ = conn.Close()
	}
	var re *hop.RefusedError
	if !errors.As(err, &re) || re.Reason != hop.RefusedTargetNotHandler {
		t.Fatalf("a stream for the forged target: got %v, want the refusal %s", err, hop.RefusedTargetNotHandler)
	}
	// The target resolves, and refuses, before it dials anything.
	select {
	case <-dialled:
		t.Fatal("the target proxy dialled the address the tenant's VMI status named")
	default:
	}
	if d := refusedTotal(t, hop.RefusedTargetNotHandler) - before; d != 1 {
		t.Errorf("kvnet_proxy_refused_total{side=target,reason=%s} rose by %v, want 1", hop.RefusedTargetNotHandler, d)
	}
	if d := env.Logs.Count("refused a stream", "reason", hop.RefusedTargetNotHandler.String(), "peer", "cluster-a") - logged; d != 1 {
		t.Errorf("%d log lines \"refused a stream\" reason=%s, want 1", d, hop.RefusedTargetNotHandler)
	}

	// (2) UPDATE: the tenant moves the announced endpoint, the node and
	// the phase, and adds a label. The API server's answer to that very
	// request (what admission let through and etcd stored) has the label
	// and the status as it was: virt-api's mutator put the old status back.
	var updated kubevirtv1.VirtualMachineInstance
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := tenant.Get(ctx, client.ObjectKeyFromObject(&vmi), &updated); err != nil {
			return err
		}
		if updated.Labels == nil {
			updated.Labels = map[string]string{}
		}
		updated.Labels["tenant-edit"] = "1"
		updated.Status.Phase = kubevirtv1.Running
		updated.Status.NodeName = "node-c"
		updated.Status.MigrationState.TargetState.Node = "node-c"
		updated.Status.MigrationState.TargetState.NodeAddress = ptr.To("127.0.0.4")
		return tenant.Update(ctx, &updated)
	}); err != nil {
		t.Fatalf("the tenant's update of its VMI: %v", err)
	}
	if updated.Labels["tenant-edit"] != "1" {
		t.Errorf("the tenant's label is not stored (%v): the update did not go through", updated.Labels)
	}
	if st := updated.Status; st.Phase == kubevirtv1.Running || st.NodeName == "node-c" {
		t.Errorf("stored phase %q, nodeName %q after the tenant's update; want virt-api to keep the stored ones", st.Phase, st.NodeName)
	}
	if ms := updated.Status.MigrationState; ms == nil || ms.TargetState == nil || ms.TargetState.Node == "node-c" || ptr.Deref(ms.TargetState.NodeAddress, "") != "127.0.0.3" {
		t.Errorf("stored targetState %+v after the tenant's update, want the one stored before it (nodeAddress 127.0.0.3)", ms.TargetState)
	}
}

// equalTarget compares the endpoint fields a target announces.
func equalTarget(a, b kubevirtv1.VirtualMachineInstanceMigrationTargetState) bool {
	return a.Node == b.Node && ptr.Deref(a.NodeAddress, "") == ptr.Deref(b.NodeAddress, "") &&
		fmt.Sprint(a.DirectMigrationNodePorts) == fmt.Sprint(b.DirectMigrationNodePorts)
}

// refusedTotal is the target side's kvnet_proxy_refused_total for r.
func refusedTotal(t *testing.T, r hop.RefusalCode) float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvnet_proxy_refused_total" {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if (l.GetName() == "side" && l.GetValue() != "target") || (l.GetName() == "reason" && l.GetValue() != r.String()) {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("kvnet_proxy_refused_total{side=target,reason=%s} is not exported", r)
	return 0
}

// vmiYAML is a VMI as a tenant writes it (the spec of vmYAML's template).
func vmiYAML(name string) string {
	return `
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: ` + name + `
spec:
  domain:
    memory: {guest: 1Gi}
    devices:
      disks: [{name: containerdisk, disk: {bus: virtio}}]
      interfaces:
        - {name: default, masquerade: {}}
  networks:
    - {name: default, pod: {}}
  volumes:
    - {name: containerdisk, containerDisk: {image: quay.io/containerdisks/fedora:latest}}
`
}

// tenantClient acts as a tenant of ns: a user bound there to the verbs
// KubeVirt's kubevirt.io:edit grants on VMs, VMIs and VMIMs (the
// aggregated ClusterRole needs kube-controller-manager, which does not run
// here).
func tenantClient(t *testing.T, ns string) client.Client {
	t.Helper()
	ctx := context.Background()
	user := "tenant-" + ns
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kubevirt-edit"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"kubevirt.io"},
			Resources: []string{"virtualmachines", "virtualmachineinstances", "virtualmachineinstancemigrations"},
			Verbs:     []string{"get", "list", "watch", "create", "update", "patch", "delete"}}}}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant-kubevirt-edit"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	for _, o := range []client.Object{role, rb} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: app.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	// RBAC answers at once; the first call shows the binding works.
	if err := c.List(ctx, &kubevirtv1.VirtualMachineInstanceList{}, client.InNamespace(ns)); err != nil {
		t.Fatalf("the tenant lists its VMIs: %v", err)
	}
	return c
}
