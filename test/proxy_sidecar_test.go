package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/test/migholders"
)

// sidecarConfig is kvnet's policy in sidecar mode as the chart renders it:
// no alsoInCluster (the sidecar alone makes kvnet give the pod migration0),
// the proxy container with its certificate Secret.
const sidecarConfig = `
migration:
  namespace: %[1]s
  inCluster:
    nad: %[1]s/migration
    pool: {cidr: 10.94.0.0/24}
  crossCluster:
    nad: %[1]s/crosscluster
    addresses: [10.94.1.10/24, 10.94.1.11/24, 10.94.1.12/24]
  proxySidecar:
    enabled: %[2]t
    container:
      name: kvnet-proxy
      image: ghcr.io/kvnet/kvnet:test
      args: [proxy, --advertise-interface=migration0, --hop-interface=crosscluster0, --namespace=kvnet-system]
      volumeMounts: [{name: kvnet-proxy-cert, mountPath: /etc/kvnet/proxy, readOnly: true}]
    volumes: [{name: kvnet-proxy-cert, secret: {secretName: kvnet-migration-proxy-cert}}]
`

// syncControllerDeployment is virt-operator v1.9.0's Deployment (the
// fixture), created in ns, with the ReplicaSet the Deployment controller
// would make for it.
func syncControllerDeployment(t *testing.T, ns string) (*appsv1.Deployment, *appsv1.ReplicaSet) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "test", "testdata", "virt-synchronization-controller-v1.9.0.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	if err := yaml.UnmarshalStrict(raw, &dep); err != nil {
		t.Fatalf("the v1.9.0 fixture: %v", err)
	}
	dep.Namespace = ns
	// virt-operator creates the PriorityClass its pods name.
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "kubevirt-cluster-critical"}, Value: 1000000000}
	if err := env.Client.Create(context.Background(), pc); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := env.Client.Create(context.Background(), &dep); err != nil {
		t.Fatalf("creating the v1.9.0 Deployment: %v", err)
	}
	return &dep, syncReplicaSetOf(t, &dep, "5c6d7f8b9")
}

func syncReplicaSetOf(t *testing.T, dep *appsv1.Deployment, hash string) *appsv1.ReplicaSet {
	t.Helper()
	tpl := dep.Spec.Template.DeepCopy()
	tpl.Labels["pod-template-hash"] = hash
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: dep.Namespace, Name: dep.Name + "-" + hash, Labels: tpl.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: dep.Name, UID: dep.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: appsv1.ReplicaSetSpec{Replicas: dep.Spec.Replicas, Selector: &metav1.LabelSelector{MatchLabels: tpl.Labels}, Template: *tpl},
	}
	if err := env.Client.Create(context.Background(), rs); err != nil {
		t.Fatalf("creating ReplicaSet: %v", err)
	}
	return rs
}

// staticIPs reports whether the pod's Multus selection gives NAD name an
// address (virt-operator's own "migration@migration0" element has none).
func staticIPs(t *testing.T, p *corev1.Pod, nad string) bool {
	t.Helper()
	elems, err := multus.Parse(p.Annotations[multus.NetworksAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range elems {
		if e.Name() == nad && e.Raw(multus.KeyIPs) != nil {
			return true
		}
	}
	return false
}

func containerNames(p *corev1.Pod) []string {
	var out []string
	for _, c := range p.Spec.Containers {
		out = append(out, c.Name)
	}
	return out
}

// checkSidecarPod fails unless the stored pod has virt-operator's sync
// container and exactly one proxy sidecar with its certificate volume, and
// one address on each migration network.
func checkSidecarPod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if got := containerNames(p); len(got) != 2 || got[0] != "sync" || got[1] != "kvnet-proxy" {
		t.Fatalf("pod %s containers %v, want [sync kvnet-proxy]", p.Name, got)
	}
	cert := 0
	for _, v := range p.Spec.Volumes {
		if v.Name == "kvnet-proxy-cert" && v.Secret != nil && v.Secret.SecretName == "kvnet-migration-proxy-cert" {
			cert++
		}
	}
	if cert != 1 || len(p.Spec.Volumes) != 4 {
		t.Fatalf("pod %s volumes %+v: want virt-operator's three and the proxy certificate once", p.Name, p.Spec.Volumes)
	}
	migholders.Addr(t, p, "crosscluster", "crosscluster0")
	migholders.Addr(t, p, "migration", "migration0")
}

// The address count of sidecar mode, on a real API server with kvnet's
// webhook: N synchronization-controller pods, made from virt-operator
// v1.9.0's Deployment, get N cross-cluster addresses (each pod one, shared
// by the sync controller and its proxy sidecar, which also gets migration0
// for its relays); virt-handlers get none (only migration0, no sidecar);
// and no pod of a separate proxy holds one. The injection is idempotent
// through the API server (a pod that already carries the sidecar, a pod
// UPDATE), the Deployment virt-operator owns is never changed, a rolled
// template gets the sidecar again, and the off switch stops it.
func TestProxySidecarAddressCount(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	env.CreateNAD(t, ns, "crosscluster", "", fmt.Sprintf(bridgeConfig, "crosscluster"))
	useConfig(t, fmt.Sprintf(sidecarConfig, ns, true))
	ctx := context.Background()
	dep, rs := syncControllerDeployment(t, ns)
	fixture := dep.DeepCopy()

	var pods []*corev1.Pod
	t.Cleanup(func() {
		for _, p := range pods {
			migholders.DeletePod(t, env.Client, p)
		}
		migholders.WaitNoAllocations(t, env.Client, migration.PoolCrossCluster)
		migholders.WaitNoAllocations(t, env.Client, migration.PoolInCluster)
	})
	create := func(p *corev1.Pod) *corev1.Pod {
		t.Helper()
		migholders.Create(t, env.Client, p)
		pods = append(pods, p)
		return p
	}

	const n = 2 // the fixture's replicas
	for range n {
		checkSidecarPod(t, create(migholders.SyncPod(rs)))
	}
	migholders.Node(t, env.Client, "sidecar-node1")
	t.Cleanup(func() { migholders.DeleteNode(t, env.Client, "sidecar-node1") })
	ds := migholders.HandlerDaemonSet(t, env.Client, ns)
	h := create(migholders.HandlerPod(ds, "sidecar-node1", nil))
	if got := containerNames(h); len(got) != 1 {
		t.Fatalf("virt-handler containers %v: it must get no sidecar", got)
	}
	migholders.Addr(t, h, "migration", "migration0")
	if staticIPs(t, h, "crosscluster") {
		t.Fatalf("virt-handler got a cross-cluster element: %s", h.Annotations["k8s.v1.cni.cncf.io/networks"])
	}

	// The count: as many cross-cluster allocations as sync-controller
	// pods, each bound to one of them; none to a virt-handler or a proxy pod.
	countCrossCluster := func(want int) {
		t.Helper()
		framework.Eventually(t, "every cross-cluster address bound to a synchronization-controller pod", 60*time.Second, func() error {
			allocs := migholders.Allocations(t, env.Client, migration.PoolCrossCluster)
			if len(allocs) != want {
				return fmt.Errorf("%d cross-cluster allocations, want %d", len(allocs), want)
			}
			for _, a := range allocs {
				if a.State != migration.StateBound {
					return fmt.Errorf("%s is %s", a.Address, a.State)
				}
				var p corev1.Pod
				if err := env.Client.Get(ctx, client.ObjectKey{Namespace: a.PodNamespace, Name: a.PodName}, &p); err != nil {
					return err
				}
				if p.Labels["kubevirt.io"] != "virt-synchronization-controller" {
					return fmt.Errorf("%s is held by %s (kubevirt.io=%s)", a.Address, p.Name, p.Labels["kubevirt.io"])
				}
			}
			return nil
		})
	}
	countCrossCluster(n)
	var proxyPods corev1.PodList
	if err := env.Client.List(ctx, &proxyPods, client.MatchingLabels{"kubevirt.io": "kvnet-migration-proxy"}); err != nil {
		t.Fatal(err)
	}
	if len(proxyPods.Items) != 0 {
		t.Fatalf("%d separate proxy pods exist in sidecar mode", len(proxyPods.Items))
	}

	// Idempotent through the API server: a pod whose manifest already
	// carries the sidecar (copied from an injected one) gets no second one.
	copied := migholders.SyncPod(rs)
	copied.Spec = *pods[0].Spec.DeepCopy()
	copied.Spec.NodeName = ""
	checkSidecarPod(t, create(copied))
	countCrossCluster(n + 1)
	migholders.DeletePod(t, env.Client, copied)
	countCrossCluster(n)

	// An UPDATE (the sync controller's pod relabelled) keeps the one sidecar.
	var cur corev1.Pod
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pods[0]), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Labels["example.com/touched"] = "yes"
	if err := env.Client.Update(ctx, &cur); err != nil {
		t.Fatalf("updating an injected pod: %v", err)
	}
	checkSidecarPod(t, &cur)

	// virt-operator's Deployment is as it wrote it: kvnet changes pods only.
	var stored appsv1.Deployment
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(dep), &stored); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(stored.Spec.Template, fixture.Spec.Template) || len(stored.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("the Deployment's template changed: %+v", stored.Spec.Template)
	}
	// A reconcile that rolls the template (a new install strategy): the
	// new ReplicaSet's pods get the sidecar again, the old ones go, and the
	// count stays one address per pod.
	stored.Spec.Template.Annotations["kubevirt.io/install-strategy-identifier"] = "rolled"
	if err := env.Client.Update(ctx, &stored); err != nil {
		t.Fatal(err)
	}
	rolled := syncReplicaSetOf(t, &stored, "8d9e0f1a2")
	old := append([]*corev1.Pod(nil), pods[:n]...)
	for i := range n {
		checkSidecarPod(t, create(migholders.SyncPod(rolled)))
		migholders.DeletePod(t, env.Client, old[i])
	}
	countCrossCluster(n)

	// The off switch: a new pod gets no sidecar and, without
	// alsoInCluster, only its cross-cluster address.
	useConfig(t, fmt.Sprintf(sidecarConfig, ns, false))
	off := create(migholders.SyncPod(rolled))
	if got := containerNames(off); len(got) != 1 || got[0] != "sync" {
		t.Fatalf("with the sidecar off the pod has containers %v", got)
	}
	migholders.Addr(t, off, "crosscluster", "crosscluster0")
	if staticIPs(t, off, "migration") {
		t.Fatalf("with the sidecar off and no alsoInCluster the pod still got migration0 from kvnet")
	}
}
