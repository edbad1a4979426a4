package chart

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/internal/proxy/store"
	"github.com/kvnet/kvnet/test/framework"
)

// The target side of `kvnet proxy`, authenticated as the chart's proxy
// ServiceAccount (impersonation, on an API server that enforces RBAC),
// wins its lease, binds a migration to the peer that presents it in the
// bindings ConfigMap and removes the binding when the migration ends: the
// chart grants every verb that takes, on that one object by name.
func TestChartRBACIsEnoughForProxyBindings(t *testing.T) {
	for name, c := range map[string]chartCase{
		"sidecar": {release: "pxrbac", namespace: "pxrbac-system", values: `
migrationProxy: {enabled: true, sidecar: {namespace: pxrbac-kubevirt}}
config:
  migration:
    inCluster: {nad: pxrbac-kubevirt/migration, pool: {cidr: 10.10.0.0/24}}
    crossCluster: {nad: pxrbac-kubevirt/crosscluster, addresses: [10.20.0.10/24]}
`},
		"deployment": {release: "pxdep", namespace: "pxdep-system", values: "migrationProxy: {enabled: true, sidecar: {enabled: false}, allowedSources: [10.200.0.0/24]}\n"},
	} {
		t.Run(name, func(t *testing.T) { proxyBindsAsChartServiceAccount(t, c) })
	}
}

func proxyBindsAsChartServiceAccount(t *testing.T, c chartCase) {
	ctx := context.Background()
	objs := render(t, c)
	install(t, c, objs)
	// No kvnet webhook runs here: its configurations would refuse the VMIs.
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		for _, o := range find(objs, kind) {
			if err := cl.Delete(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Whoever the chart binds the proxy's Role to (the proxy Deployment's
	// ServiceAccount, or the synchronization controller's in sidecar
	// mode); the Role, the Lease and the --leader-election-id share a name.
	var sa rbacv1.Subject
	var lease string
	for _, o := range find(objs, "RoleBinding") {
		var rb rbacv1.RoleBinding
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &rb); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(rb.RoleRef.Name, "-migration-proxy") {
			sa, lease = rb.Subjects[0], rb.RoleRef.Name
		}
	}
	if sa.Name == "" {
		t.Fatal("no migration proxy RoleBinding rendered")
	}
	cfg := rest.CopyConfig(testEnv.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + sa.Namespace + ":" + sa.Name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"}}

	// The target virt-handler's port, and a receiving migration announcing it.
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = echo.Close() })
	go func() {
		for {
			conn, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer conn.Close(); _, _ = io.Copy(io.Discard, conn) }()
		}
	}()
	port := echo.Addr().(*net.TCPAddr).Port
	ns := c.release + "-vms"
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1"},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{}}}
	vmim := &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1-in"},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1",
			Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: "mig-rbac-" + c.release}}}
	for _, o := range []client.Object{vmi, vmim} {
		if err := cl.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	vmi.Status = kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Scheduled, MigrationState: &kubevirtv1.VirtualMachineInstanceMigrationState{
		MigrationUID: vmim.UID,
		TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{
			VirtualMachineInstanceCommonMigrationState: kubevirtv1.VirtualMachineInstanceCommonMigrationState{Node: "node-b"},
			NodeAddress: ptr.To("127.0.0.1"), DirectMigrationNodePorts: map[string]int{strconv.Itoa(port): 49152},
		},
	}}
	if err := cl.Update(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	// The allocation kvnet writes for node-b's virt-handler, in kvnet's
	// namespace and as kvnet's ServiceAccount (the chart's pools policy
	// refuses anyone else): the proxy reads it with the chart's RBAC.
	var dep appsv1.Deployment
	decodeKind(t, objs, "Deployment", &dep)
	kvnetSA := dep.Spec.Template.Spec.ServiceAccountName
	kcfg := rest.CopyConfig(testEnv.Config)
	kcfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + c.namespace + ":" + kvnetSA,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + c.namespace, "system:authenticated"}}
	asKvnet, err := client.New(kcfg, client.Options{Scheme: cl.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	handler := &migration.Allocation{Pool: migration.PoolInCluster, Address: netip.MustParseAddr("127.0.0.1"), PrefixLength: 24,
		State: migration.StateBound, Node: "node-b", PodNamespace: "kubevirt", PodName: "virt-handler-b", PodUID: "uid-b"}
	if err := asKvnet.Create(ctx, handler.ToConfigMap(c.namespace)); err != nil {
		t.Fatal(err)
	}

	pa, pb := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-b")
	hopLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := app.NewProxyManager(cfg, app.ProxyOptions{
		AdvertiseAddress: "127.0.0.1", HopListener: hopLn, Cert: pb.Cert,
		Peers:       []*proxy.Peer{{Name: "cluster-a", CAs: pa.Pool}},
		MetricsAddr: "0", ProbeAddr: "0", Namespace: c.namespace,
		LeaderElect: true, LeaderElectionID: lease,
	})
	if err != nil {
		t.Fatal(err)
	}
	framework.RunManager(t, mgr)
	select {
	case <-mgr.Elected():
	case <-time.After(2 * time.Minute):
		t.Fatal("the proxy never took its lease as the chart's ServiceAccount")
	}

	peer := &proxy.Peer{Name: "cluster-b", Addresses: []string{hopLn.Addr().String()}, CAs: pb.Pool}
	framework.Eventually(t, "cluster-a's stream accepted", time.Minute, func() error {
		conn, err := (&proxy.Dialer{Cert: pa.Cert, Mode: hop.ModeTLS}).Dial(ctx, peer, hop.SameVM("mig-rbac-"+c.release, ns, "vm1"), uint16(port))
		if err != nil {
			var re *hop.RefusedError
			if errors.As(err, &re) && re.Reason == hop.RefusedLookup {
				t.Fatalf("refused %s: the binding could not be read or written as the chart's ServiceAccount", re.Reason)
			}
			return err // unknown-migration until the proxy's cache has the VMIM
		}
		return conn.Close()
	})
	key := client.ObjectKey{Namespace: c.namespace, Name: store.DefaultBindingsName}
	var cm corev1.ConfigMap
	if err := cl.Get(ctx, key, &cm); err != nil {
		t.Fatalf("the bindings ConfigMap after an accepted stream: %v", err)
	}
	var b store.Binding
	if err := json.Unmarshal([]byte(cm.Data["mig-rbac-"+c.release]), &b); err != nil || b.Peer != "cluster-a" {
		t.Fatalf("binding of mig-rbac-%s: %q (%v), want peer cluster-a", c.release, cm.Data["mig-rbac-"+c.release], err)
	}

	vmim.Status.Phase = kubevirtv1.MigrationSucceeded
	if err := cl.Status().Update(ctx, vmim); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "the ended migration's binding removed by the proxy", time.Minute, func() error {
		if err := cl.Get(ctx, key, &cm); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if _, ok := cm.Data["mig-rbac-"+c.release]; ok {
			return fmt.Errorf("still bound: %v", cm.Data)
		}
		return nil
	})
}

// The attack of issue 27, item 7, closed by RBAC: in sidecar mode the
// proxy's Role belongs to KubeVirt's synchronization controller, and kvnet
// trusts a ConfigMap of its namespace labelled kvnet.io/migration-pool as
// an address allocation. Acting as that ServiceAccount (impersonation, on
// an API server that enforces RBAC), creating any ConfigMap there (a forged
// allocation, a look-alike of the proxy's, or the proxy's own mappings
// after someone deleted them) or any Lease is forbidden by RBAC itself,
// before the pools policy is even asked; it writes only the objects the
// chart created. Events it may still create: kvnet reads none.
func TestChartSyncControllerCreatesNothingInKvnetNamespace(t *testing.T) {
	ctx := t.Context()
	c := chartCase{release: "nocreate", namespace: "nocreate-system", values: strings.ReplaceAll(sidecarValues, "kv-sidecar", "nocreate-kv")}
	objs := render(t, c)
	install(t, c, objs)
	cfg := rest.CopyConfig(testEnv.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:nocreate-kv:kubevirt-synchronization-controller",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:nocreate-kv", "system:authenticated"}}
	sync, err := client.New(cfg, client.Options{Scheme: cl.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	// RBAC's refusal, not the pools policy's: the request never reaches
	// admission.
	refusedByRBAC := func(err error, resource string) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), `cannot create resource "`+resource+`"`)
	}

	forged := &migration.Allocation{Pool: migration.PoolInCluster, Address: netip.MustParseAddr("10.10.0.9"), PrefixLength: 24,
		State: migration.StateIdle, Node: "node-1"}
	mappings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: store.DefaultMappingsName}}
	if err := cl.Delete(ctx, mappings); err != nil {
		t.Fatal(err)
	}
	for what, cm := range map[string]*corev1.ConfigMap{
		"a forged idle allocation": forged.ToConfigMap(c.namespace),
		"an unlabelled ConfigMap":  {ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: "kvnet-migration-proxy-mappings-2"}},
		"the proxy's mappings, deleted": {ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: store.DefaultMappingsName},
			Data: map[string]string{"tenant.vm1": "forged"}},
	} {
		if err := sync.Create(ctx, cm); !refusedByRBAC(err, "configmaps") {
			t.Errorf("%s created by the synchronization controller: got %v, want RBAC's refusal", what, err)
		}
	}
	for _, name := range []string{"nocreate-kvnet", "nocreate-kvnet-migration-proxy-2"} {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: name},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("sync-controller")}}
		if err := sync.Create(ctx, l); !refusedByRBAC(err, "leases") {
			t.Errorf("Lease %s created by the synchronization controller: got %v, want RBAC's refusal", name, err)
		}
	}
	var list corev1.ConfigMapList
	if err := cl.List(ctx, &list, client.InNamespace(c.namespace), client.HasLabels{migration.LabelPool}); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("allocations in kvnet's namespace after the attempts: %d, want none", len(list.Items))
	}

	// What it still writes: the chart's bindings ConfigMap, and events.
	bindings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: store.DefaultBindingsName}}
	if err := sync.Patch(ctx, bindings, client.RawPatch(types.MergePatchType, []byte(`{"data":{"m1":"{}"}}`))); err != nil {
		t.Errorf("the chart's bindings ConfigMap patched by the synchronization controller: %v", err)
	}
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: "nocreate-proxy.leader"},
		InvolvedObject: corev1.ObjectReference{Kind: "Lease", Namespace: c.namespace, Name: "nocreate-kvnet-migration-proxy"},
		Reason:         "LeaderElection", Message: "became leader", Type: corev1.EventTypeNormal}
	if err := sync.Create(ctx, ev); err != nil {
		t.Errorf("the leader election's event: %v", err)
	}
}
