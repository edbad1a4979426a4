package e2e

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/test/framework"
)

// An OVN-Kubernetes layer2 network that allows persistent IPs.
const persistentConfig = `{"cniVersion":"1.0.0","name":"%s","type":"ovn-k8s-cni-overlay","topology":"layer2","subnets":"10.100.0.0/24","netAttachDefName":"%s","allowPersistentIPs":true}`

func persistentNAD(t *testing.T, ns, name string) {
	t.Helper()
	env.CreateNAD(t, ns, name, "", fmt.Sprintf(persistentConfig, name+"-net", ns+"/"+name))
}

// claimRefs maps each NAD of the pod's Multus annotation to its
// ipam-claim-reference ("" when it has none).
func claimRefs(t *testing.T, pod *corev1.Pod) map[string]string {
	t.Helper()
	out := map[string]string{}
	for nad, e := range selection(t, pod) {
		out[nad] = e.String(multus.KeyIPAMClaimReference)
	}
	return out
}

// waitClaim waits until kvnet's controller has created the VM's claim.
func waitClaim(t *testing.T, ns, name string) *ipamv1alpha1.IPAMClaim {
	t.Helper()
	var claim ipamv1alpha1.IPAMClaim
	framework.Eventually(t, "kvnet creates IPAMClaim "+ns+"/"+name, waitTimeout, func() error {
		return env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &claim)
	})
	return &claim
}

// The claim reference lands in the virt-launcher pod virt-controller really
// renders, on the element of the persistent network, and the claim kvnet
// keeps for the VM names the interface KubeVirt really gave that element.
func TestClaimReferenceInRealLauncherPod(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	persistentNAD(t, ns, "tenant")
	mustCreateVM(t, ns, vmYAML("db", "\n            - {name: blue, bridge: {}}", "\n        - {name: blue, multus: {networkName: tenant}}", ""))

	vmi := waitVMI(t, ns, "db")
	pod := waitLauncherPod(t, vmi)
	want := persistentips.ClaimName("db", "blue")
	if got := claimRefs(t, pod)["tenant"]; got != want {
		t.Fatalf("launcher pod's tenant element has ipam-claim-reference %q, want %q (annotation %s)", got, want, pod.Annotations[multus.NetworksAnnotation])
	}
	claim := waitClaim(t, ns, want)
	if iface := selection(t, pod)["tenant"].Interface(); claim.Spec.Interface != iface {
		t.Errorf("claim interface %q, the real pod's element says %q", claim.Spec.Interface, iface)
	}
	if claim.Spec.Network != "tenant-net" {
		t.Errorf("claim network %q, want the NAD config's name tenant-net", claim.Spec.Network)
	}
	if o := metav1.GetControllerOf(claim); o == nil || o.Kind != "VirtualMachine" || o.Name != "db" {
		t.Errorf("claim controller = %+v, want the VM", o)
	}
}

// A live migration's target pod, created by virt-controller for a
// VirtualMachineInstanceMigration, gets the same claim reference as the
// source pod: the migrated VM keeps its address.
func TestMigrationTargetPodKeepsClaimReference(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	persistentNAD(t, ns, "tenant")
	mustCreateVM(t, ns, vmYAML("mig", "\n            - {name: blue, bridge: {}}", "\n        - {name: blue, multus: {networkName: tenant}}", ""))
	vmi := waitVMI(t, ns, "mig")
	source := waitLauncherPod(t, vmi)
	src, dst := nodeNames(t)
	runVMI(t, vmi, source, src)
	_ = dst

	vmim := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mig-1"},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "mig"},
	}
	if err := env.Client.Create(context.Background(), vmim); err != nil {
		t.Fatalf("creating the migration: %v", err)
	}
	var target corev1.Pod
	framework.Eventually(t, "virt-controller creates the migration target pod", waitTimeout, func() error {
		var pods corev1.PodList
		if err := env.Client.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{kubevirtv1.MigrationJobLabel: string(vmim.UID)}); err != nil || len(pods.Items) == 0 {
			return fmt.Errorf("%d pods, %v", len(pods.Items), err)
		}
		target = pods.Items[0]
		return nil
	})
	if target.Name == source.Name {
		t.Fatalf("target pod is the source pod")
	}
	want := persistentips.ClaimName("mig", "blue")
	if got := claimRefs(t, &target)["tenant"]; got != want {
		t.Fatalf("target pod's tenant element has ipam-claim-reference %q, want %q (annotation %s)", got, want, target.Annotations[multus.NetworksAnnotation])
	}
	if a, b := selection(t, source)["tenant"].Interface(), selection(t, &target)["tenant"].Interface(); a != b {
		t.Errorf("source interface %q, target %q: the claim names one interface", a, b)
	}
}

// A network hot-plugged into a running VM by a VM update reaches a
// virt-launcher pod through KubeVirt (v1.9 hot-plugs a NIC by migrating to a
// pod that has it, or by rewriting the pod's annotation), and kvnet puts the
// new network's claim reference there while keeping the first one.
func TestHotpluggedNetworkGetsClaimReference(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	persistentNAD(t, ns, "tenant")
	persistentNAD(t, ns, "extra")
	mustCreateVM(t, ns, vmYAML("hot", "\n            - {name: blue, bridge: {}}", "\n        - {name: blue, multus: {networkName: tenant}}", ""))
	vmi := waitVMI(t, ns, "hot")
	pod := waitLauncherPod(t, vmi)
	src, _ := nodeNames(t)
	runVMI(t, vmi, pod, src)

	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var vm kubevirtv1.VirtualMachine
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "hot"}, &vm); err != nil {
			return err
		}
		spec := &vm.Spec.Template.Spec
		spec.Domain.Devices.Interfaces = append(spec.Domain.Devices.Interfaces, kubevirtv1.Interface{
			Name: "green", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
		})
		spec.Networks = append(spec.Networks, kubevirtv1.Network{
			Name: "green", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "extra"}},
		})
		return env.Client.Update(context.Background(), &vm)
	})
	if err != nil {
		t.Fatalf("hot-plugging a network: %v", err)
	}
	var carrier corev1.Pod
	framework.Eventually(t, "KubeVirt puts the hot-plugged network on a virt-launcher pod", waitTimeout, func() error {
		ctx := context.Background()
		pods, err := launcherPods(ctx, vmi)
		if err != nil {
			return err
		}
		var seen []string
		for _, p := range pods {
			if _, ok := selection(t, &p)["extra"]; ok {
				carrier = p
				return nil
			}
			seen = append(seen, p.Name+": "+p.Annotations[multus.NetworksAnnotation])
		}
		return fmt.Errorf("%v; VMI %s", seen, vmiConditions(ctx, vmi))
	})
	how := "rewrote the pod's annotation"
	if carrier.Name != pod.Name {
		how = "created a migration target pod"
	}
	t.Logf("KubeVirt %s for the hot-plug (pod %s)", how, carrier.Name)
	refs := claimRefs(t, &carrier)
	if want := persistentips.ClaimName("hot", "green"); refs["extra"] != want {
		t.Errorf("hot-plugged element has ipam-claim-reference %q, want %q", refs["extra"], want)
	}
	if want := persistentips.ClaimName("hot", "blue"); refs["tenant"] != want {
		t.Errorf("first element has ipam-claim-reference %q, want %q", refs["tenant"], want)
	}
}

// nodeCounter keeps the Node names of one run apart.
var nodeCounter atomic.Int32

// nodeNames creates two schedulable Nodes for one test.
func nodeNames(t *testing.T) (string, string) {
	t.Helper()
	n := nodeCounter.Add(1)
	var names [2]string
	for i := range names {
		names[i] = fmt.Sprintf("node-%d-%d", n, i)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: map[string]string{
			"kubernetes.io/hostname": names[i], kubevirtv1.NodeSchedulable: "true",
		}}}
		if err := env.Client.Create(context.Background(), node); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), node) })
	}
	return names[0], names[1]
}

// runVMI plays the parts of the components that do not exist here, each with
// the write that component makes: the scheduler binds the launcher pod to
// node; kubelet reports it running (written with admin credentials: envtest
// has no kubelet identity); virt-handler on that node, under its own
// node-bound service-account token, reports the domain running and live
// migratable. virt-controller in between moves the VMI to Scheduled itself.
func runVMI(t *testing.T, vmi *kubevirtv1.VirtualMachineInstance, pod *corev1.Pod, node string) {
	t.Helper()
	ctx := context.Background()
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}, Target: corev1.ObjectReference{Kind: "Node", Name: node}}
	if err := env.Client.SubResource("binding").Create(ctx, pod, binding); err != nil {
		t.Fatalf("binding %s to %s: %v", pod.Name, node, err)
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur corev1.Pod
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &cur); err != nil {
			return err
		}
		now := metav1.Now()
		cur.Status.Phase = corev1.PodRunning
		cur.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
		cur.Status.ContainerStatuses = nil
		for _, c := range cur.Spec.Containers {
			cur.Status.ContainerStatuses = append(cur.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			})
		}
		return env.Client.Status().Update(ctx, &cur)
	})
	if err != nil {
		t.Fatalf("reporting %s running: %v", pod.Name, err)
	}
	framework.Eventually(t, "virt-controller schedules the VMI on "+node, waitTimeout, func() error {
		var cur kubevirtv1.VirtualMachineInstance
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), &cur); err != nil {
			return err
		}
		if cur.Status.Phase != kubevirtv1.Scheduled || cur.Status.NodeName != node {
			return fmt.Errorf("%s on %s", cur.Status.Phase, cur.Status.NodeName)
		}
		return nil
	})
	handler, err := env.KubeVirt.HandlerClient(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	// The VMI CRD has no status subresource: virt-handler updates the object.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur kubevirtv1.VirtualMachineInstance
		if err := handler.Get(ctx, client.ObjectKeyFromObject(vmi), &cur); err != nil {
			return err
		}
		cur.Status.Phase = kubevirtv1.Running
		cur.Status.SelinuxContext = "none"
		cur.Status.Conditions = append(cur.Status.Conditions, kubevirtv1.VirtualMachineInstanceCondition{
			Type: kubevirtv1.VirtualMachineInstanceIsMigratable, Status: corev1.ConditionTrue,
		})
		return handler.Update(ctx, &cur)
	})
	if err != nil {
		t.Fatalf("virt-handler reporting VMI %s running: %v", vmi.Name, err)
	}
}
