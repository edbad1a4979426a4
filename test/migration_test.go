package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"

	"github.com/kvnet/kvnet/chain"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/lookup"
	"github.com/kvnet/kvnet/migration"
	"github.com/kvnet/kvnet/multus"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/webhook"
)

// The migration tests build what KubeVirt and Kubernetes would: a
// virt-handler DaemonSet whose pods (generateName, controller ownerRef, the
// node only in the required node affinity) carry virt-operator's
// "<nad>@migration0"; a synchronization-controller Deployment with its
// ReplicaSet and pods. envtest runs no controllers, so the test creates the
// pods, deletes them, and removes nodes, as the DaemonSet controller, the
// ReplicaSet controller and PodGC would. Pods without a node are deleted at
// once (no kubelet grace period), and stay Pending: live, by kvnet's rule.

const migNetworksAnn = "migration@migration0" // what virt-operator writes

// migSetConfig swaps kvnet's policy for the test and restores it after.
func migSetConfig(t *testing.T, yaml string) {
	t.Helper()
	restore, err := env.SetConfig(yaml)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	t.Cleanup(restore)
}

func migNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if err := env.Client.Create(context.Background(), n); err != nil {
		t.Fatalf("creating node %s: %v", name, err)
	}
	return n
}

func migDeleteNode(t *testing.T, name string) {
	t.Helper()
	err := env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("deleting node %s: %v", name, err)
	}
}

func migPodTemplate(labels map[string]string, name string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{multus.NetworksAnnotation: migNetworksAnn}},
		Spec: corev1.PodSpec{
			ServiceAccountName: "kubevirt-handler",
			Containers:         []corev1.Container{{Name: name, Image: "quay.io/kubevirt/" + name + ":v1.6.0"}},
		},
	}
}

// migHandlerDaemonSet is virt-handler's DaemonSet as virt-operator creates it.
func migHandlerDaemonSet(t *testing.T, ns string) *appsv1.DaemonSet {
	t.Helper()
	labels := map[string]string{"kubevirt.io": "virt-handler"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "virt-handler", Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: migPodTemplate(labels, "virt-handler"),
		},
	}
	if err := env.Client.Create(context.Background(), ds); err != nil {
		t.Fatalf("creating DaemonSet: %v", err)
	}
	return ds
}

// migHandlerPod is the pod the DaemonSet controller creates for a node: no
// name (generateName), no nodeName, the node in the required affinity.
func migHandlerPod(ds *appsv1.DaemonSet, node string, extraLabels map[string]string) *corev1.Pod {
	tpl := ds.Spec.Template.DeepCopy()
	labels := map[string]string{"controller-revision-hash": "7c5d8b9f6d", "pod-template-generation": "1"}
	for k, v := range tpl.Labels {
		labels[k] = v
	}
	for k, v := range extraLabels {
		labels[k] = v
	}
	spec := tpl.Spec
	spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}}
	for _, k := range []string{"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"} {
		spec.Tolerations = append(spec.Tolerations, corev1.Toleration{Key: k, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute})
	}
	for _, k := range []string{"node.kubernetes.io/disk-pressure", "node.kubernetes.io/memory-pressure", "node.kubernetes.io/pid-pressure", "node.kubernetes.io/unschedulable"} {
		spec.Tolerations = append(spec.Tolerations, corev1.Toleration{Key: k, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ds.Namespace, GenerateName: ds.Name + "-", Labels: labels, Annotations: tpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: spec,
	}
}

// migSyncReplicaSet is the synchronization controller's Deployment and the
// ReplicaSet the Deployment controller would make for it.
func migSyncReplicaSet(t *testing.T, ns string, replicas int32) *appsv1.ReplicaSet {
	t.Helper()
	labels := map[string]string{"kubevirt.io": "virt-synchronization-controller"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "virt-synchronization-controller", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: migPodTemplate(labels, "virt-synchronization-controller"),
		},
	}
	if err := env.Client.Create(context.Background(), dep); err != nil {
		t.Fatalf("creating Deployment: %v", err)
	}
	hash := "6b7f9c8d5"
	rsLabels := map[string]string{"kubevirt.io": "virt-synchronization-controller", "pod-template-hash": hash}
	tpl := dep.Spec.Template.DeepCopy()
	tpl.Labels = rsLabels
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: dep.Name + "-" + hash, Labels: rsLabels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: dep.Name, UID: dep.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: rsLabels}, Template: *tpl},
	}
	if err := env.Client.Create(context.Background(), rs); err != nil {
		t.Fatalf("creating ReplicaSet: %v", err)
	}
	return rs
}

// migSyncPod is the pod the ReplicaSet controller creates.
func migSyncPod(rs *appsv1.ReplicaSet) *corev1.Pod {
	tpl := rs.Spec.Template.DeepCopy()
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: rs.Namespace, GenerateName: rs.Name + "-", Labels: tpl.Labels, Annotations: tpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: tpl.Spec,
	}
}

func migCreate(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if err := env.Client.Create(context.Background(), pod); err != nil {
		t.Fatalf("creating pod %s for %v: %v", pod.GenerateName, pod.Spec.Affinity != nil, err)
	}
	return pod
}

func migDeletePod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	err := env.Client.Delete(context.Background(), pod, client.Preconditions{UID: &pod.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("deleting pod %s: %v", pod.Name, err)
	}
}

// migElement returns the pod's selection element for NAD name with the
// interface, failing if there is not exactly one.
func migElement(t *testing.T, pod *corev1.Pod, nad, iface string) *multus.Element {
	t.Helper()
	elems, err := multus.Parse(pod.Annotations[multus.NetworksAnnotation])
	if err != nil {
		t.Fatalf("pod %s: %v", pod.Name, err)
	}
	var found *multus.Element
	for _, e := range elems {
		if e.Name() == nad && e.Interface() == iface {
			if found != nil {
				t.Fatalf("pod %s has two %s@%s elements: %s", pod.Name, nad, iface, pod.Annotations[multus.NetworksAnnotation])
			}
			found = e
		}
	}
	if found == nil {
		t.Fatalf("pod %s has no %s@%s element: %s", pod.Name, nad, iface, pod.Annotations[multus.NetworksAnnotation])
	}
	return found
}

// migAddr is the single static address of the pod's element.
func migAddr(t *testing.T, pod *corev1.Pod, nad, iface string) netip.Prefix {
	t.Helper()
	e := migElement(t, pod, nad, iface)
	var ips []string
	if raw := e.Raw(multus.KeyIPs); raw != nil {
		if err := json.Unmarshal(raw, &ips); err != nil {
			t.Fatal(err)
		}
	}
	if len(ips) != 1 {
		t.Fatalf("pod %s element %s@%s: ips = %v, want one address", pod.Name, nad, iface, ips)
	}
	p, err := netip.ParsePrefix(ips[0])
	if err != nil {
		t.Fatalf("pod %s: ips[0] %q: %v", pod.Name, ips[0], err)
	}
	return p
}

// migAllocations reads the allocation table from the API server.
func migAllocations(t *testing.T, pool string) []*migration.Allocation {
	t.Helper()
	all, err := migration.ReadTable(context.Background(), env.Client, framework.KvnetNamespace)
	if err != nil {
		t.Fatal(err)
	}
	var out []*migration.Allocation
	for _, a := range all {
		if a.Pool == pool {
			out = append(out, a)
		}
	}
	return out
}

// migWaitBound waits until the controller bound the pod's address to it.
func migWaitBound(t *testing.T, pool string, addr netip.Addr, pod *corev1.Pod) {
	t.Helper()
	framework.Eventually(t, fmt.Sprintf("%s bound to %s", addr, pod.Name), 60*time.Second, func() error {
		a, err := migration.AllocationOf(context.Background(), env.Client, framework.KvnetNamespace, pool, addr)
		if err != nil {
			return err
		}
		if a.State != migration.StateBound || a.PodUID != pod.UID || a.PodName != pod.Name {
			return fmt.Errorf("allocation is %s, holder %s", a.State, a.Holder())
		}
		return nil
	})
}

// migWaitNoAllocations is the leak check: once every pod and node is gone,
// no allocation of the pool may remain.
func migWaitNoAllocations(t *testing.T, pool string) {
	t.Helper()
	framework.Eventually(t, "every "+pool+" address released", 120*time.Second, func() error {
		if left := migAllocations(t, pool); len(left) > 0 {
			return fmt.Errorf("%d allocations left, first %s %s (%s)", len(left), left[0].Address, left[0].State, left[0].Holder())
		}
		return nil
	})
}

func migCounter(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// virt-handler pods on N nodes get distinct addresses from the pool; a pod
// recreated on its node gets the node's address back; when the pool is
// exhausted the next pod is denied with the pool and its size, an event on
// the DaemonSet and a metric, and nothing is left half-allocated; a removed
// node's address is released and reused.
func TestMigrationHandlersStickyPerNode(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	migSetConfig(t, fmt.Sprintf(`
migration:
  inCluster:
    nad: %s/migration
    pool:
      cidr: 10.91.0.0/24
      ranges: [10.91.0.10-10.91.0.14]
      exclude: [10.91.0.12]
`, ns))
	ds := migHandlerDaemonSet(t, ns)
	nodes := []string{"mig-a-1", "mig-a-2", "mig-a-3", "mig-a-4", "mig-a-5"}
	pods := map[string]*corev1.Pod{}
	t.Cleanup(func() {
		for _, p := range pods {
			migDeletePod(t, p)
		}
		for _, n := range nodes {
			migDeleteNode(t, n)
		}
		migWaitNoAllocations(t, migration.PoolInCluster)
	})
	for _, n := range nodes {
		migNode(t, n)
	}
	pool := netip.MustParsePrefix("10.91.0.0/24")
	byNode := map[string]netip.Addr{}
	seen := map[netip.Addr]string{}
	for _, n := range nodes[:4] {
		pod := migCreate(t, migHandlerPod(ds, n, nil))
		pods[n] = pod
		p := migAddr(t, pod, "migration", "migration0")
		if p.Bits() != 24 || !pool.Contains(p.Addr()) || p.Addr() == netip.MustParseAddr("10.91.0.12") {
			t.Fatalf("node %s got %s: want a /24 address of 10.91.0.10-14 other than the excluded .12", n, p)
		}
		if other, dup := seen[p.Addr()]; dup {
			t.Fatalf("nodes %s and %s both got %s", other, n, p.Addr())
		}
		seen[p.Addr()], byNode[n] = n, p.Addr()
		if elems, _ := multus.Parse(pod.Annotations[multus.NetworksAnnotation]); len(elems) != 1 {
			t.Fatalf("virt-operator's element must be completed, not duplicated: %s", pod.Annotations[multus.NetworksAnnotation])
		}
	}
	for _, n := range nodes[:4] {
		migWaitBound(t, migration.PoolInCluster, byNode[n], pods[n])
	}

	// Recreated at once (the controller may not have seen the deletion) and
	// again after the controller parked the address: same address both times.
	for round := 0; round < 2; round++ {
		old := pods[nodes[1]]
		migDeletePod(t, old)
		if round == 1 {
			framework.Eventually(t, "address parked for its node", 60*time.Second, func() error {
				a, err := migration.AllocationOf(context.Background(), env.Client, framework.KvnetNamespace, migration.PoolInCluster, byNode[nodes[1]])
				if err != nil {
					return err
				}
				if a.State != migration.StateIdle || a.Node != nodes[1] {
					return fmt.Errorf("state %s node %q", a.State, a.Node)
				}
				return nil
			})
		}
		pod := migCreate(t, migHandlerPod(ds, nodes[1], nil))
		pods[nodes[1]] = pod
		if got := migAddr(t, pod, "migration", "migration0").Addr(); got != byNode[nodes[1]] {
			t.Fatalf("round %d: recreated virt-handler on %s got %s, want its node's %s", round, nodes[1], got, byNode[nodes[1]])
		}
		migWaitBound(t, migration.PoolInCluster, byNode[nodes[1]], pod)
	}

	// Exhausted: 4 addresses, 4 nodes; the fifth node's pod is denied.
	before := migCounter(t, "kvnet_migration_denials_total", map[string]string{"pool": "in-cluster", "reason": "exhausted"})
	err := env.Client.Create(context.Background(), migHandlerPod(ds, nodes[4], nil))
	if err == nil {
		t.Fatalf("a fifth virt-handler got an address from a pool of four")
	}
	for _, want := range []string{"migration.inCluster.pool 10.91.0.0/24", "all 4 addresses"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("denial %q does not say %q", err, want)
		}
	}
	if !apierrors.IsForbidden(err) {
		t.Fatalf("denial should be 403 Forbidden (like an exceeded quota), got %v", err)
	}
	if after := migCounter(t, "kvnet_migration_denials_total", map[string]string{"pool": "in-cluster", "reason": "exhausted"}); after != before+1 {
		t.Fatalf("kvnet_migration_denials_total{in-cluster,exhausted} went %v -> %v, want +1", before, after)
	}
	if n := len(migAllocations(t, migration.PoolInCluster)); n != 4 {
		t.Fatalf("%d allocations after the denial, want the 4 of the live pods", n)
	}
	if size := migCounter(t, "kvnet_migration_pool_size", map[string]string{"pool": "in-cluster"}); size != 4 {
		t.Fatalf("kvnet_migration_pool_size{in-cluster} = %v, want 4", size)
	}
	framework.Eventually(t, "kvnet_migration_pool_used{in-cluster} = 4", 30*time.Second, func() error {
		if used := migCounter(t, "kvnet_migration_pool_used", map[string]string{"pool": "in-cluster"}); used != 4 {
			return fmt.Errorf("%v", used)
		}
		return nil
	})
	framework.Eventually(t, "MigrationPoolExhausted event on the DaemonSet", 30*time.Second, func() error {
		var evs corev1.EventList
		if err := env.Client.List(context.Background(), &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "MigrationPoolExhausted" && e.InvolvedObject.Kind == "DaemonSet" && e.InvolvedObject.Name == ds.Name {
				return nil
			}
		}
		return fmt.Errorf("none among %d events", len(evs.Items))
	})

	// Node 3 leaves the cluster; PodGC deletes its virt-handler. The address
	// is released and the fifth node gets it.
	gone := byNode[nodes[2]]
	migDeleteNode(t, nodes[2])
	migDeletePod(t, pods[nodes[2]])
	delete(pods, nodes[2])
	framework.Eventually(t, "removed node's address released", 60*time.Second, func() error {
		_, err := migration.AllocationOf(context.Background(), env.Client, framework.KvnetNamespace, migration.PoolInCluster, gone)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("allocation of %s still there (%v)", gone, err)
	})
	pod := migCreate(t, migHandlerPod(ds, nodes[4], nil))
	pods[nodes[4]] = pod
	if got := migAddr(t, pod, "migration", "migration0").Addr(); got != gone {
		t.Fatalf("fifth node got %s, want the released %s", got, gone)
	}
	migWaitBound(t, migration.PoolInCluster, gone, pod)

	// The operator's table (kvnet migration-ips, run as the CLI is) shows
	// every address with its node and pod.
	out := migRunCLI(t, "migration-ips", "-n", framework.KvnetNamespace)
	for _, n := range []string{nodes[0], nodes[1], nodes[3], nodes[4]} {
		row := ""
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, " "+n+" ") {
				row = line
			}
		}
		want := []string{"in-cluster", byNodeOr(byNode, n, gone).String() + "/24", "bound", ns + "/virt-handler-"}
		for _, w := range want {
			if !strings.Contains(row, w) {
				t.Fatalf("kvnet migration-ips: %s's row %q lacks %q:\n%s", n, row, w, out)
			}
		}
	}
}

// migRunCLI runs kvnet with args against the test API server, through a
// kubeconfig file as an operator would, and returns its stdout.
func migRunCLI(t *testing.T, args ...string) string {
	t.Helper()
	user, err := env.Env.AddUser(envtest.User{Name: "mig-operator", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	if err := app.Run(context.Background(), append(args, "--kubeconfig", path), strings.NewReader(""), &stdout, &stderr); err != nil {
		t.Fatalf("kvnet %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String()
}

func byNodeOr(m map[string]netip.Addr, n string, def netip.Addr) netip.Addr {
	if a, ok := m[n]; ok {
		return a
	}
	return def
}

// A dual-stack-free IPv6 pool works the same; a dry-run create gets an
// address in its answer but reserves nothing.
func TestMigrationIPv6Pool(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	migSetConfig(t, fmt.Sprintf(`
migration:
  inCluster:
    nad: %s/migration
    pool:
      cidr: fd00:94::/120
      exclude: [fd00:94::1-fd00:94::f]
`, ns))
	ds := migHandlerDaemonSet(t, ns)
	nodes := []string{"mig-v6-1", "mig-v6-2", "mig-v6-3"}
	var pods []*corev1.Pod
	t.Cleanup(func() {
		for _, p := range pods {
			migDeletePod(t, p)
		}
		for _, n := range nodes {
			migDeleteNode(t, n)
		}
		migWaitNoAllocations(t, migration.PoolInCluster)
	})
	pool := netip.MustParsePrefix("fd00:94::/120")
	seen := map[netip.Addr]bool{}
	for _, n := range nodes {
		migNode(t, n)
		pod := migCreate(t, migHandlerPod(ds, n, nil))
		pods = append(pods, pod)
		p := migAddr(t, pod, "migration", "migration0")
		if p.Bits() != 120 || !pool.Contains(p.Addr()) || p.Addr().Less(netip.MustParseAddr("fd00:94::10")) || seen[p.Addr()] {
			t.Fatalf("node %s got %s: want a distinct /120 address of fd00:94::10-ff", n, p)
		}
		seen[p.Addr()] = true
		migWaitBound(t, migration.PoolInCluster, p.Addr(), pod)
	}
	dry := migHandlerPod(ds, "mig-v6-dry", nil)
	if err := env.Client.Create(context.Background(), dry, client.DryRunAll); err != nil {
		t.Fatalf("dry-run create: %v", err)
	}
	if p := migAddr(t, dry, "migration", "migration0"); !pool.Contains(p.Addr()) {
		t.Fatalf("dry run answered %s", p)
	}
	if n := len(migAllocations(t, migration.PoolInCluster)); n != len(nodes) {
		t.Fatalf("%d allocations after a dry run, want %d: a dry run must reserve nothing", n, len(nodes))
	}
}

// Synchronization controllers (a Deployment: pods without name or node at
// admission) share a list of three addresses with two replicas: a surge of
// one works, the fourth pod waits (denied) until an old one is gone (a
// terminating pod still holds its address), and a reservation whose pod
// failed to create after admission expires. With alsoInCluster each holder
// also gets an in-cluster address, and a denial leaves none behind.
func TestMigrationSyncControllersSurgeAndExpiry(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	env.CreateNAD(t, ns, "crosscluster", "", fmt.Sprintf(bridgeConfig, "crosscluster"))
	migSetConfig(t, fmt.Sprintf(`
migration:
  reservationTimeout: 5s
  inCluster:
    nad: %[1]s/migration
    pool: {cidr: 10.93.0.0/24}
  crossCluster:
    nad: %[1]s/crosscluster
    addresses: [10.93.1.10/24, 10.93.1.11/24, 10.93.1.12/24]
    alsoInCluster: true
`, ns))
	rs := migSyncReplicaSet(t, ns, 2)
	var pods []*corev1.Pod
	t.Cleanup(func() {
		for _, p := range pods {
			var cur corev1.Pod
			if env.Client.Get(context.Background(), client.ObjectKeyFromObject(p), &cur) == nil && len(cur.Finalizers) > 0 {
				cur.Finalizers = nil
				_ = env.Client.Update(context.Background(), &cur)
			}
			migDeletePod(t, p)
		}
		migWaitNoAllocations(t, migration.PoolCrossCluster)
		migWaitNoAllocations(t, migration.PoolInCluster)
	})
	create := func(mod func(*corev1.Pod)) (*corev1.Pod, error) {
		p := migSyncPod(rs)
		if mod != nil {
			mod(p)
		}
		err := env.Client.Create(context.Background(), p)
		if err == nil {
			pods = append(pods, p)
		}
		return p, err
	}
	cc := map[netip.Addr]*corev1.Pod{}
	admit := func(mod func(*corev1.Pod)) *corev1.Pod {
		t.Helper()
		p, err := create(mod)
		if err != nil {
			t.Fatalf("creating a synchronization-controller pod: %v", err)
		}
		a := migAddr(t, p, "crosscluster", "crosscluster0")
		if a.Bits() != 24 || !netip.MustParsePrefix("10.93.1.10/31").Contains(a.Addr()) && a.Addr() != netip.MustParseAddr("10.93.1.12") {
			t.Fatalf("pod got %s, not a listed address", a)
		}
		if other, dup := cc[a.Addr()]; dup {
			t.Fatalf("pods %s and %s both hold %s", other.Name, p.Name, a.Addr())
		}
		cc[a.Addr()] = p
		ic := migAddr(t, p, "migration", "migration0")
		if !netip.MustParsePrefix("10.93.0.0/24").Contains(ic.Addr()) {
			t.Fatalf("alsoInCluster: pod got in-cluster %s", ic)
		}
		migWaitBound(t, migration.PoolCrossCluster, a.Addr(), p)
		migWaitBound(t, migration.PoolInCluster, ic.Addr(), p)
		return p
	}
	deniedExhausted := func(what string) {
		t.Helper()
		_, err := create(nil)
		if err == nil || !strings.Contains(err.Error(), "migration.crossCluster.addresses 3 listed addresses is exhausted: all 3 addresses") {
			t.Fatalf("%s: want the cross-cluster exhaustion denial, got %v", what, err)
		}
		if n := len(migAllocations(t, migration.PoolInCluster)); n != len(cc) {
			t.Fatalf("%s: %d in-cluster allocations for %d live holders: the denied pod's in-cluster reservation was left behind", what, n, len(cc))
		}
	}

	hold := func(p *corev1.Pod) { p.Finalizers = []string{"kvnet.io/test-hold"} }
	old1 := admit(hold)
	old2 := admit(nil)
	surge := admit(nil) // the spare address
	deniedExhausted("a fourth holder")

	// The Deployment controller deletes old1; its finalizer keeps it around
	// (as a kubelet would during the grace period): it still holds its address.
	migDeletePod(t, old1)
	deniedExhausted("while the old pod is terminating")
	var cur corev1.Pod
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(old1), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Finalizers = nil
	if err := env.Client.Update(context.Background(), &cur); err != nil {
		t.Fatal(err)
	}
	oldAddr := migAddr(t, old1, "crosscluster", "crosscluster0").Addr()
	delete(cc, oldAddr)
	framework.Eventually(t, "the rolled-out pod's address taken by the next new pod", 60*time.Second, func() error {
		p, err := create(nil)
		if err != nil {
			return err
		}
		if got := migAddr(t, p, "crosscluster", "crosscluster0").Addr(); got != oldAddr {
			t.Fatalf("next pod got %s, want the freed %s", got, oldAddr)
		}
		cc[oldAddr] = p
		return nil
	})
	migDeletePod(t, old2)
	delete(cc, migAddr(t, old2, "crosscluster", "crosscluster0").Addr())
	_ = surge

	// A create that fails after admission (the pod is invalid: validation
	// runs after mutating admission) leaves a reservation that blocks the
	// spare address until it expires.
	_, err := create(func(p *corev1.Pod) { p.Spec.Containers[0].Image = "" })
	if !apierrors.IsInvalid(err) {
		t.Fatalf("want the invalid pod refused by validation, got %v", err)
	}
	var reserved *migration.Allocation
	for _, a := range migAllocations(t, migration.PoolCrossCluster) {
		if a.State == migration.StateReserved {
			reserved = a
		}
	}
	if reserved == nil {
		t.Fatalf("no reservation left by the failed create; allocations: %v", migAllocations(t, migration.PoolCrossCluster))
	}
	if _, err := create(nil); err == nil || !strings.Contains(err.Error(), "1 reserved") {
		t.Fatalf("while the failed create's reservation is pending, want a denial that counts it, got %v", err)
	}
	framework.Eventually(t, "failed create's reservation expired", 60*time.Second, func() error {
		_, err := migration.AllocationOf(context.Background(), env.Client, framework.KvnetNamespace, migration.PoolCrossCluster, reserved.Address)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	p := admit(nil)
	if got := migAddr(t, p, "crosscluster", "crosscluster0").Addr(); got != reserved.Address {
		t.Fatalf("got %s, want the expired reservation's %s", got, reserved.Address)
	}
}

// Two kvnet replicas admit 200 virt-handler pods at once. Replica B is a
// second manager with its own webhook server, cache, allocator and
// controller; the API server calls it for half the pods (a configuration
// named to sort before kvnet's, so B runs first and kvnet's replica then
// sees the pod already carries a reservation). No address is given twice,
// every allocation binds to its pod, and when the pods and nodes are gone
// nothing is left.
func TestMigrationTwoReplicasConcurrent(t *testing.T) {
	const pods = 200
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	migSetConfig(t, fmt.Sprintf(`
migration:
  inCluster:
    nad: %s/migration
    pool: {cidr: 10.92.0.0/24}
`, ns))
	ds := migHandlerDaemonSet(t, ns)
	var calls atomic.Int32
	migReplicaB(t, &calls)

	nodes := make([]string, pods)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("mig-c-%03d", i)
	}
	created := make([]*corev1.Pod, pods)
	t.Cleanup(func() {
		migParallel(t, pods, func(i int) error {
			if created[i] != nil {
				if err := env.Client.Delete(context.Background(), created[i]); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
			return client.IgnoreNotFound(env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[i]}}))
		})
		migWaitNoAllocations(t, migration.PoolInCluster)
	})
	migParallel(t, pods, func(i int) error {
		return env.Client.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[i]}})
	})

	migParallel(t, pods, func(i int) error {
		var extra map[string]string
		if i%2 == 0 {
			extra = map[string]string{"kvnet-test/replica": "b"}
		}
		p := migHandlerPod(ds, nodes[i], extra)
		if err := env.Client.Create(context.Background(), p); err != nil {
			return fmt.Errorf("pod for %s: %w", nodes[i], err)
		}
		created[i] = p
		return nil
	})
	if c := calls.Load(); c < pods/2 {
		t.Fatalf("replica B admitted %d pods, want at least %d", c, pods/2)
	}
	owner := map[netip.Addr]int{}
	for i, p := range created {
		a := migAddr(t, p, "migration", "migration0").Addr()
		if j, dup := owner[a]; dup {
			t.Fatalf("%s given to the pods of %s and %s", a, nodes[j], nodes[i])
		}
		owner[a] = i
	}
	framework.Eventually(t, "every allocation bound to its pod", 120*time.Second, func() error {
		allocs := migAllocations(t, migration.PoolInCluster)
		if len(allocs) != pods {
			return fmt.Errorf("%d allocations for %d pods", len(allocs), pods)
		}
		for _, a := range allocs {
			i, ok := owner[a.Address]
			if !ok {
				return fmt.Errorf("allocation %s (%s) belongs to no pod: leaked", a.Address, a.State)
			}
			if a.State != migration.StateBound {
				return fmt.Errorf("%s is %s", a.Address, a.State)
			}
			if a.PodUID != created[i].UID || a.Node != nodes[i] {
				t.Fatalf("%s bound to %s on %q, but pod %s on %s asks for it", a.Address, a.Holder(), a.Node, created[i].Name, nodes[i])
			}
		}
		return nil
	})
}

// migReplicaB starts a second kvnet replica (its own manager, webhook
// server, migration cache, allocator and controller) and has the API server
// call it for pods labelled kvnet-test/replica=b.
func migReplicaB(t *testing.T, calls *atomic.Int32) {
	t.Helper()
	wio := &env.Env.WebhookInstallOptions
	port := migFreePort(t)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 app.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          ctrlwebhook.NewServer(ctrlwebhook.Options{Host: wio.LocalServingHost, Port: port, CertDir: wio.LocalServingCertDir}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := mgr.GetCache().GetInformer(ctx, &nadv1.NetworkAttachmentDefinition{}); err != nil {
		t.Fatal(err)
	}
	capB, err := migration.Setup(ctx, mgr, env.Source, framework.KvnetNamespace)
	if err != nil {
		t.Fatal(err)
	}
	counter := migCountingMutator{calls: calls}
	mgr.GetWebhookServer().Register(webhook.PathMutateMigrationPods, &admission.Webhook{Handler: &webhook.PodMutator{
		Name: "migration-pods-replica-b", Config: env.Source, Facts: lookup.NewReader(mgr.GetCache()),
		Mutators: []chain.PodMutator{capB.Mutator, counter},
	}})
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replica B: %v", err)
		}
	})

	mwc := &admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "a-kvnet-replica-b"},
		Webhooks: []admissionregv1.MutatingWebhook{{
			Name: "migration-pods.replica-b.kvnet.io",
			ClientConfig: admissionregv1.WebhookClientConfig{
				URL:      ptr.To(fmt.Sprintf("https://%s:%d%s", wio.LocalServingHost, port, webhook.PathMutateMigrationPods)),
				CABundle: wio.LocalServingCAData,
			},
			Rules: []admissionregv1.RuleWithOperations{{
				Operations: []admissionregv1.OperationType{admissionregv1.Create},
				Rule:       admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"kvnet-test/replica": "b", "kubevirt.io": "virt-handler"}},
			FailurePolicy:           ptr.To(admissionregv1.Fail),
			SideEffects:             ptr.To(admissionregv1.SideEffectClassNoneOnDryRun),
			TimeoutSeconds:          ptr.To(int32(30)),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if err := env.Client.Create(context.Background(), mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), mwc) })
	// Wait until the API server calls B: a dry-run create reaches it.
	framework.Eventually(t, "API server calling replica B", 60*time.Second, func() error {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "probe-", Labels: map[string]string{"kvnet-test/replica": "b", "kubevirt.io": "virt-handler"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}
		before := calls.Load()
		if err := env.Client.Create(context.Background(), p, client.DryRunAll); err != nil {
			return err
		}
		if calls.Load() == before {
			return errors.New("replica B not called yet")
		}
		return nil
	})
	calls.Store(0)
}

// migCountingMutator counts the pods replica B admitted.
type migCountingMutator struct{ calls *atomic.Int32 }

func (migCountingMutator) Name() string { return "count" }

func (m migCountingMutator) MutatePod(context.Context, *chain.PodRequest) error {
	m.calls.Add(1)
	return nil
}

// migParallel runs f for 0..n-1 on 25 goroutines and fails on the first error.
func migParallel(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	work := make(chan int)
	for w := 0; w < 25; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d failed; first: %v", len(errs), n, errs[0])
	}
}

func migFreePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// The config is checked against the cluster: a missing NAD is an error
// naming the field; too few cross-cluster addresses for the holder replicas
// an error; exactly as many a warning (no spare for a surge).
func TestMigrationConfigCheckedAgainstCluster(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "crosscluster", "", fmt.Sprintf(bridgeConfig, "crosscluster"))
	migSyncReplicaSet(t, ns, 2)
	cfg, err := env.SetConfig(fmt.Sprintf(`
migration:
  inCluster:
    nad: %[1]s/missing
    pool: {cidr: 10.95.0.0/24}
  crossCluster:
    nad: %[1]s/crosscluster
    addresses: [10.95.1.10/24, 10.95.1.11/24]
`, ns))
	if err != nil {
		t.Fatal(err)
	}
	defer cfg()
	m := env.Source.Get().Migration
	errs, warnings, err := migration.CheckCluster(context.Background(), env.Client, &m)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != 1 || errs[0].Field != "migration.inCluster.nad" {
		t.Fatalf("errors = %v, want the missing NAD at migration.inCluster.nad", errs)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "2 addresses for 2 holder replicas leave none spare") {
		t.Fatalf("warnings = %v, want no-spare", warnings)
	}
	m.CrossCluster.Addresses = m.CrossCluster.Addresses[:1]
	errs, _, err = migration.CheckCluster(context.Background(), env.Client, &m)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != 2 || errs[1].Field != "migration.crossCluster.addresses" {
		t.Fatalf("errors = %v, want too few cross-cluster addresses", errs)
	}
	// A virt-handler admitted while the NAD is missing is denied, naming the field.
	ds := migHandlerDaemonSet(t, ns)
	err = env.Client.Create(context.Background(), migHandlerPod(ds, "mig-nad-1", nil))
	if err == nil || !strings.Contains(err.Error(), "migration.inCluster.nad: NetworkAttachmentDefinition "+ns+"/missing does not exist") {
		t.Fatalf("want a denial naming migration.inCluster.nad, got %v", err)
	}
}

// A DaemonSet surge (a second virt-handler admitted on a node while the
// first still runs) gets another address; when the old pod goes, its address
// is released rather than kept as a second one for the node, and the node's
// next virt-handler gets the surviving address.
func TestMigrationHandlerSurgeOnNode(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	migSetConfig(t, fmt.Sprintf(`
migration:
  inCluster:
    nad: %s/migration
    pool: {cidr: 10.96.0.0/28}
`, ns))
	ds := migHandlerDaemonSet(t, ns)
	const node = "mig-surge-1"
	var pods []*corev1.Pod
	t.Cleanup(func() {
		for _, p := range pods {
			migDeletePod(t, p)
		}
		migDeleteNode(t, node)
		migWaitNoAllocations(t, migration.PoolInCluster)
	})
	migNode(t, node)
	old := migCreate(t, migHandlerPod(ds, node, nil))
	pods = append(pods, old)
	x := migAddr(t, old, "migration", "migration0").Addr()
	migWaitBound(t, migration.PoolInCluster, x, old)
	surge := migCreate(t, migHandlerPod(ds, node, nil))
	pods = append(pods, surge)
	y := migAddr(t, surge, "migration", "migration0").Addr()
	if y == x {
		t.Fatalf("two live virt-handlers on %s share %s", node, x)
	}
	migWaitBound(t, migration.PoolInCluster, y, surge)
	migDeletePod(t, old)
	framework.Eventually(t, "the old pod's address released, not parked", 60*time.Second, func() error {
		_, err := migration.AllocationOf(context.Background(), env.Client, framework.KvnetNamespace, migration.PoolInCluster, x)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("allocation of %s still there (%v)", x, err)
	})
	migDeletePod(t, surge)
	next := migCreate(t, migHandlerPod(ds, node, nil))
	pods = append(pods, next)
	if got := migAddr(t, next, "migration", "migration0").Addr(); got != y {
		t.Fatalf("next virt-handler on %s got %s, want the node's %s", node, got, y)
	}
}
