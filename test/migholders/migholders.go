// Package migholders builds, on a test control plane, the pods that hold
// migration addresses as KubeVirt and Kubernetes would make them, and
// reads the addresses kvnet gave them: a
// virt-handler DaemonSet whose pods (generateName, controller ownerRef, the
// node only in the required node affinity) carry virt-operator's
// "<nad>@migration0"; a synchronization-controller Deployment with its
// ReplicaSet and pods. envtest runs no controllers, so the test creates the
// pods, deletes them, and removes nodes, as the DaemonSet controller, the
// ReplicaSet controller and PodGC would. Pods without a node are deleted at
// once (no kubelet grace period), and stay Pending: live, by kvnet's rule.
package migholders

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/test/framework"
)

// NetworksAnnotation is the Multus selection virt-operator writes on
// virt-handler's pods: the migration network on migration0.
const NetworksAnnotation = "migration@migration0"

// Node creates a Node named name.
func Node(t *testing.T, c client.Client, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if err := c.Create(context.Background(), n); err != nil {
		t.Fatalf("creating node %s: %v", name, err)
	}
	return n
}

// DeleteNode deletes Node name, as a node going away.
func DeleteNode(t *testing.T, c client.Client, name string) {
	t.Helper()
	err := c.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("deleting node %s: %v", name, err)
	}
}

func podTemplate(labels map[string]string, name string) corev1.PodTemplateSpec {
	// virt-operator's ServiceAccount for each component: kvnet gives
	// migration addresses only to pods that run as KubeVirt's.
	sa := config.DefaultHandlerServiceAccount
	if labels["kubevirt.io"] == "virt-synchronization-controller" {
		sa = config.DefaultSyncServiceAccount
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{multus.NetworksAnnotation: NetworksAnnotation}},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			Containers:         []corev1.Container{{Name: name, Image: "quay.io/kubevirt/" + name + ":v1.6.0"}},
		},
	}
}

// HandlerDaemonSet is virt-handler's DaemonSet as virt-operator creates it.
func HandlerDaemonSet(t *testing.T, c client.Client, ns string) *appsv1.DaemonSet {
	t.Helper()
	labels := map[string]string{"kubevirt.io": "virt-handler"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "virt-handler", Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: podTemplate(labels, "virt-handler"),
		},
	}
	if err := c.Create(context.Background(), ds); err != nil {
		t.Fatalf("creating DaemonSet: %v", err)
	}
	return ds
}

// HandlerPod is the pod the DaemonSet controller creates for a node: no
// name (generateName), no nodeName, the node in the required affinity.
func HandlerPod(ds *appsv1.DaemonSet, node string, extraLabels map[string]string) *corev1.Pod {
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

// SyncReplicaSet is the synchronization controller's Deployment and the
// ReplicaSet the Deployment controller would make for it.
func SyncReplicaSet(t *testing.T, c client.Client, ns string, replicas int32) *appsv1.ReplicaSet {
	t.Helper()
	labels := map[string]string{"kubevirt.io": "virt-synchronization-controller"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "virt-synchronization-controller", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: podTemplate(labels, "virt-synchronization-controller"),
		},
	}
	if err := c.Create(context.Background(), dep); err != nil {
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
	if err := c.Create(context.Background(), rs); err != nil {
		t.Fatalf("creating ReplicaSet: %v", err)
	}
	return rs
}

// SyncPod is the pod the ReplicaSet controller creates.
func SyncPod(rs *appsv1.ReplicaSet) *corev1.Pod {
	tpl := rs.Spec.Template.DeepCopy()
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: rs.Namespace, GenerateName: rs.Name + "-", Labels: tpl.Labels, Annotations: tpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: tpl.Spec,
	}
}

// Create creates pod, as its controller would.
func Create(t *testing.T, c client.Client, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if err := c.Create(context.Background(), pod); err != nil {
		t.Fatalf("creating pod %s for %v: %v", pod.GenerateName, pod.Spec.Affinity != nil, err)
	}
	return pod
}

// DeletePod deletes pod (that very pod: by UID), as its controller or
// PodGC would.
func DeletePod(t *testing.T, c client.Client, pod *corev1.Pod) {
	t.Helper()
	err := c.Delete(context.Background(), pod, client.Preconditions{UID: &pod.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("deleting pod %s: %v", pod.Name, err)
	}
}

// Element returns the pod's selection element for NAD name with the
// interface, failing if there is not exactly one.
func Element(t *testing.T, pod *corev1.Pod, nad, iface string) *multus.Element {
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

// Addr is the single static address of the pod's element.
func Addr(t *testing.T, pod *corev1.Pod, nad, iface string) netip.Prefix {
	t.Helper()
	e := Element(t, pod, nad, iface)
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

// Allocations reads the allocation table from the API server.
func Allocations(t *testing.T, c client.Client, pool string) []*migration.Allocation {
	t.Helper()
	all, err := migration.ReadTable(context.Background(), c, framework.KvnetNamespace)
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

// WaitBound waits until the controller bound the pod's address to it.
func WaitBound(t *testing.T, c client.Client, pool string, addr netip.Addr, pod *corev1.Pod) {
	t.Helper()
	framework.Eventually(t, fmt.Sprintf("%s bound to %s", addr, pod.Name), 60*time.Second, func() error {
		a, err := migration.AllocationOf(context.Background(), c, framework.KvnetNamespace, pool, addr)
		if err != nil {
			return err
		}
		if a.State != migration.StateBound || a.PodUID != pod.UID || a.PodName != pod.Name {
			return fmt.Errorf("allocation is %s, holder %s", a.State, a.Holder())
		}
		return nil
	})
}

// WaitNoAllocations is the leak check: once every pod and node is gone,
// no allocation of the pool may remain.
func WaitNoAllocations(t *testing.T, c client.Client, pool string) {
	t.Helper()
	framework.Eventually(t, "every "+pool+" address released", 120*time.Second, func() error {
		if left := Allocations(t, c, pool); len(left) > 0 {
			return fmt.Errorf("%d allocations left, first %s %s (%s)", len(left), left[0].Address, left[0].State, left[0].Holder())
		}
		return nil
	})
}
