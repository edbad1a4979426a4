package test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/test/framework"
)

// OVN-Kubernetes localnet/layer2 NAD configs: the kind of network whose IPAM
// honours IPAMClaims.
const (
	piPersistentConfig = `{"cniVersion":"1.0.0","name":"%s","type":"ovn-k8s-cni-overlay","topology":"layer2","subnets":"10.100.0.0/24","netAttachDefName":"%s","allowPersistentIPs":true}`
	// piKubeVirtVMFinalizer is the finalizer virt-controller puts on every VM.
	piKubeVirtVMFinalizer = "kubevirt.io/virtualMachineControllerFinalize"
)

const piPollTimeout = 30 * time.Second

// piEventually polls f until it returns nil, failing the test with f's last
// error after a generous deadline.
func piEventually(t *testing.T, what string, f func() error) {
	t.Helper()
	framework.Eventually(t, what, piPollTimeout, f)
}

func piPersistentNAD(t *testing.T, ns, name, network string) {
	t.Helper()
	env.CreateNAD(t, ns, name, "", fmt.Sprintf(piPersistentConfig, network, ns+"/"+name))
}

// piVmWithNetworks is a running VM with the pod network and one bridge
// interface per Multus network (name -> NAD).
func piVmWithNetworks(ns, name string, nets ...[2]string) *kubevirtv1.VirtualMachine {
	vm := &kubevirtv1.VirtualMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyAlways),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"kubevirt.io/domain": name}},
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{
						Interfaces: []kubevirtv1.Interface{{Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}}}},
					}},
					Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
				},
			},
		},
	}
	spec := &vm.Spec.Template.Spec
	for _, n := range nets {
		spec.Networks = append(spec.Networks, kubevirtv1.Network{Name: n[0], NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: n[1]}}})
		spec.Domain.Devices.Interfaces = append(spec.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: n[0], InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}}})
	}
	return vm
}

// piCreateVM creates vm and then, as virt-controller does first, adds
// KubeVirt's VM finalizer, so deleting the VM leaves it terminating until
// the test (standing in for virt-controller) removes it.
func piCreateVM(t *testing.T, vm *kubevirtv1.VirtualMachine) {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.Create(ctx, vm); err != nil {
		t.Fatalf("creating VM %s: %v", vm.Name, err)
	}
	base := vm.DeepCopy()
	controllerutil.AddFinalizer(vm, piKubeVirtVMFinalizer)
	if err := env.Client.Patch(ctx, vm, client.MergeFrom(base)); err != nil {
		t.Fatalf("adding KubeVirt's finalizer: %v", err)
	}
	t.Cleanup(func() { piDropFinalizer(vm) })
}

func piDropFinalizer(vm *kubevirtv1.VirtualMachine) {
	ctx := context.Background()
	var cur kubevirtv1.VirtualMachine
	if env.Client.Get(ctx, client.ObjectKeyFromObject(vm), &cur) != nil {
		return
	}
	base := cur.DeepCopy()
	if controllerutil.RemoveFinalizer(&cur, piKubeVirtVMFinalizer) {
		_ = env.Client.Patch(ctx, &cur, client.MergeFrom(base))
	}
}

// piStartVMI creates the VMI as virt-controller does for a running VM: same
// name, the template's metadata and spec, and the VM as controlling owner.
func piStartVMI(t *testing.T, vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachineInstance {
	t.Helper()
	var cur kubevirtv1.VirtualMachine
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(vm), &cur); err != nil {
		t.Fatal(err)
	}
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   cur.Namespace,
			Name:        cur.Name,
			Labels:      cur.Spec.Template.ObjectMeta.Labels,
			Annotations: map[string]string{"kubevirt.io/vm-generation": fmt.Sprint(cur.Generation)},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: cur.Name, UID: cur.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: *cur.Spec.Template.Spec.DeepCopy(),
	}
	if err := env.Client.Create(context.Background(), vmi); err != nil {
		t.Fatalf("creating VMI %s: %v", vmi.Name, err)
	}
	return vmi
}

// piLauncherNetworks is the k8s.v1.cni.cncf.io/networks value virt-controller
// writes: one element per secondary Multus network, with the NAD's
// namespace and the hashed pod interface name.
func piLauncherNetworks(vmi *kubevirtv1.VirtualMachineInstance) string {
	var elems []map[string]string
	for _, n := range vmi.Spec.Networks {
		if n.Multus == nil || n.Multus.Default {
			continue
		}
		ns, name, found := strings.Cut(n.Multus.NetworkName, "/")
		if !found {
			ns, name = vmi.Namespace, n.Multus.NetworkName
		}
		elems = append(elems, map[string]string{"name": name, "namespace": ns, "interface": persistentips.PodInterfaceName(n.Name)})
	}
	// KubeVirt marshals its NetworkSelectionElement struct: name, namespace, interface.
	var b strings.Builder
	b.WriteByte('[')
	for i, e := range elems {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":%q,"namespace":%q,"interface":%q}`, e["name"], e["namespace"], e["interface"])
	}
	b.WriteByte(']')
	return b.String()
}

// piCreateLauncher creates the virt-launcher pod for vmi as virt-controller
// writes it (labels, annotations, owner reference) and returns it as stored.
func piCreateLauncher(t *testing.T, vmi *kubevirtv1.VirtualMachineInstance) *corev1.Pod {
	t.Helper()
	pod := piLauncherPod(vmi)
	if err := env.Client.Create(context.Background(), pod); err != nil {
		t.Fatalf("creating launcher pod: %v", err)
	}
	return pod
}

// piLauncherPod is the virt-launcher pod virt-controller writes for vmi.
func piLauncherPod(vmi *kubevirtv1.VirtualMachineInstance) *corev1.Pod {
	labels := map[string]string{"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": string(vmi.UID)}
	if len(vmi.Name) <= 63 {
		labels["vm.kubevirt.io/name"] = vmi.Name
	}
	for k, v := range vmi.Labels {
		labels[k] = v
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    vmi.Namespace,
			GenerateName: "virt-launcher-",
			Labels:       labels,
			Annotations: map[string]string{
				"kubevirt.io/domain":                                 vmi.Name,
				"kubectl.kubernetes.io/default-container":            "compute",
				"kubevirt.io/migrationTransportUnix":                 "true",
				"post.hook.backup.velero.io/command":                 `["/usr/bin/virt-freezer", "--unfreeze", "--name", "` + vmi.Name + `", "--namespace", "` + vmi.Namespace + `"]`,
				multus.NetworksAnnotation:                            piLauncherNetworks(vmi),
				"descheduler.alpha.kubernetes.io/request-evict-only": "",
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: vmi.Name, UID: vmi.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "quay.io/kubevirt/virt-launcher:v1.9.0"}}},
	}
	return pod
}

// piSelection parses the stored pod's networks annotation into maps.
func piSelection(t *testing.T, pod *corev1.Pod) []map[string]any {
	t.Helper()
	var out []map[string]any
	if err := json.Unmarshal([]byte(pod.Annotations[multus.NetworksAnnotation]), &out); err != nil {
		t.Fatalf("stored %s %q: %v", multus.NetworksAnnotation, pod.Annotations[multus.NetworksAnnotation], err)
	}
	return out
}

// piClaimRefs maps each element's NAD name to its ipam-claim-reference ("" when absent).
func piClaimRefs(t *testing.T, pod *corev1.Pod) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range piSelection(t, pod) {
		ref, _ := e["ipam-claim-reference"].(string)
		out[e["name"].(string)] = ref
	}
	return out
}

func piGetClaim(ns, name string) (*ipamv1alpha1.IPAMClaim, error) {
	var c ipamv1alpha1.IPAMClaim
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &c)
	return &c, err
}

// piWaitClaim waits for the claim and checks everything kvnet promises about it.
func piWaitClaim(t *testing.T, ns, name, ownerKind, ownerName string, ownerUID types.UID, network, vmiNetwork string) *ipamv1alpha1.IPAMClaim {
	t.Helper()
	var c *ipamv1alpha1.IPAMClaim
	piEventually(t, "claim "+name+" created", func() (err error) {
		c, err = piGetClaim(ns, name)
		return err
	})
	ref := metav1.GetControllerOf(c)
	if ref == nil || ref.Kind != ownerKind || ref.Name != ownerName || ref.UID != ownerUID || ref.APIVersion != "kubevirt.io/v1" ||
		ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion || len(c.OwnerReferences) != 1 {
		t.Errorf("claim %s owner references = %+v, want controller %s %s (%s) with blockOwnerDeletion", name, c.OwnerReferences, ownerKind, ownerName, ownerUID)
	}
	if !controllerutil.ContainsFinalizer(c, persistentips.Finalizer) {
		t.Errorf("claim %s finalizers = %v, want %s", name, c.Finalizers, persistentips.Finalizer)
	}
	if c.Spec.Network != network || c.Spec.Interface != persistentips.PodInterfaceName(vmiNetwork) {
		t.Errorf("claim %s spec = %+v, want network %q interface %q", name, c.Spec, network, persistentips.PodInterfaceName(vmiNetwork))
	}
	if len(ownerName) <= 63 && c.Labels[persistentips.VMLabel] != ownerName {
		t.Errorf("claim %s labels = %v, want %s=%s", name, c.Labels, persistentips.VMLabel, ownerName)
	}
	return c
}

func piStoredPod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	var got corev1.Pod
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

func piDeleteAndWait(t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Delete(context.Background(), obj); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("deleting %T %s: %v", obj, obj.GetName(), err)
	}
	piEventually(t, fmt.Sprintf("%T %s gone", obj, obj.GetName()), func() error {
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err %v)", err)
	})
}

// The whole life of a VM with a persistent-IP network: claim on VM create,
// reference on the launcher pod (with a missing NAD for another network and a
// network whose NAD does not allow persistent IPs), idempotent on pod
// UPDATE and on KubeVirt's hotplug rewrite, the same claim after stop/start,
// and the finalizer released when the VM is deleted.
func TestPersistentIPsVMLifecycle(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, nil)
	piPersistentNAD(t, ns, "tenant", "tenant-net")
	piPersistentNAD(t, ns, "hotplug", "hotplug-net")
	env.CreateNAD(t, ns, "plain", "", fmt.Sprintf(bridgeConfig, "plain"))
	env.CreateNAD(t, ns, "doomed", "", fmt.Sprintf(piPersistentConfig, "doomed-net", ns+"/doomed"))

	vm := piVmWithNetworks(ns, "web", [2]string{"doomed", "doomed"}, [2]string{"tenant", "tenant"}, [2]string{"plain", "plain"})
	piCreateVM(t, vm)
	claim := piWaitClaim(t, ns, "web.tenant", "VirtualMachine", "web", vm.UID, "tenant-net", "tenant")
	piWaitClaim(t, ns, "web.doomed", "VirtualMachine", "web", vm.UID, "doomed-net", "doomed")
	if _, err := piGetClaim(ns, "web.plain"); !apierrors.IsNotFound(err) {
		t.Errorf("claim for a NAD without allowPersistentIPs: err = %v, want NotFound", err)
	}

	vmi := piStartVMI(t, vm)
	// The doomed NAD disappears between VMI and pod: its network loses the
	// reference, the others keep theirs.
	if err := env.Client.Delete(ctx, &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "doomed"}}); err != nil {
		t.Fatal(err)
	}
	piEventually(t, "NAD doomed gone from kvnet's cache", func() error {
		var n nadv1.NetworkAttachmentDefinition
		if err := env.Manager.GetCache().Get(ctx, client.ObjectKey{Namespace: ns, Name: "doomed"}, &n); apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still cached")
	})
	pod := piCreateLauncher(t, vmi)
	got := piStoredPod(t, pod)
	if refs := piClaimRefs(t, got); refs["tenant"] != "web.tenant" || refs["doomed"] != "" || refs["plain"] != "" {
		t.Fatalf("claim references = %v, want only tenant -> web.tenant", refs)
	}
	elems := piSelection(t, got)
	if len(elems) != 3 || len(elems[0]) != 3 || len(elems[2]) != 3 || len(elems[1]) != 4 || elems[1]["interface"] != persistentips.PodInterfaceName("tenant") {
		t.Fatalf("stored elements = %v, want KubeVirt's three elements with only the reference added", elems)
	}

	// An UPDATE that does not touch the annotation keeps it byte for byte.
	before := got.Annotations[multus.NetworksAnnotation]
	base := got.DeepCopy()
	got.Labels["kubevirt.io/nodeName"] = "node01"
	if err := env.Client.Patch(ctx, got, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	if after := piStoredPod(t, pod).Annotations[multus.NetworksAnnotation]; after != before {
		t.Fatalf("label-only UPDATE changed the annotation:\n%s\n%s", before, after)
	}

	// NIC hotplug: virt-controller adds the network to the VM and VMI and
	// rewrites the pod annotation from the VMI, without kvnet's references.
	var curVM kubevirtv1.VirtualMachine
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vm), &curVM); err != nil {
		t.Fatal(err)
	}
	vmBase := curVM.DeepCopy()
	hot := piVmWithNetworks(ns, "web", [2]string{"hotplug", "hotplug"}).Spec.Template.Spec
	curVM.Spec.Template.Spec.Networks = append(curVM.Spec.Template.Spec.Networks, hot.Networks[1])
	curVM.Spec.Template.Spec.Domain.Devices.Interfaces = append(curVM.Spec.Template.Spec.Domain.Devices.Interfaces, hot.Domain.Devices.Interfaces[1])
	if err := env.Client.Patch(ctx, &curVM, client.MergeFrom(vmBase)); err != nil {
		t.Fatal(err)
	}
	piWaitClaim(t, ns, "web.hotplug", "VirtualMachine", "web", vm.UID, "hotplug-net", "hotplug")
	var curVMI kubevirtv1.VirtualMachineInstance
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), &curVMI); err != nil {
		t.Fatal(err)
	}
	vmiBase := curVMI.DeepCopy()
	curVMI.Spec.Networks = curVM.Spec.Template.Spec.Networks
	curVMI.Spec.Domain.Devices.Interfaces = curVM.Spec.Template.Spec.Domain.Devices.Interfaces
	if err := env.Client.Patch(ctx, &curVMI, client.MergeFrom(vmiBase)); err != nil {
		t.Fatal(err)
	}
	piEventually(t, "hotplugged VMI network in kvnet's cache", func() error {
		var c kubevirtv1.VirtualMachineInstance
		if err := env.Manager.GetCache().Get(ctx, client.ObjectKeyFromObject(vmi), &c); err != nil || len(c.Spec.Networks) != 5 {
			return fmt.Errorf("cached VMI has %d networks (err %v)", len(c.Spec.Networks), err)
		}
		return nil
	})
	got = piStoredPod(t, pod)
	base = got.DeepCopy()
	got.Annotations[multus.NetworksAnnotation] = piLauncherNetworks(&curVMI)
	if err := env.Client.Patch(ctx, got, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	got = piStoredPod(t, pod)
	if refs := piClaimRefs(t, got); refs["tenant"] != "web.tenant" || refs["hotplug"] != "web.hotplug" || refs["plain"] != "" || refs["doomed"] != "" || len(refs) != 4 {
		t.Fatalf("after hotplug, claim references = %v, want tenant and hotplug", refs)
	}

	// Stop: virt-controller deletes the VMI and its pod goes. The claims stay.
	piDeleteAndWait(t, pod)
	piDeleteAndWait(t, vmi)
	// KubeVirt's VMI would be refused while a NAD it names is missing.
	env.CreateNAD(t, ns, "doomed", "", fmt.Sprintf(piPersistentConfig, "doomed-net", ns+"/doomed"))
	// Start: a new VMI and pod reference the very same claim.
	vmi2 := piStartVMI(t, &curVM)
	pod2 := piCreateLauncher(t, vmi2)
	if refs := piClaimRefs(t, piStoredPod(t, pod2)); refs["tenant"] != "web.tenant" || refs["hotplug"] != "web.hotplug" {
		t.Fatalf("after restart, claim references = %v", refs)
	}
	again, err := piGetClaim(ns, "web.tenant")
	if err != nil {
		t.Fatal(err)
	}
	if again.UID != claim.UID || !controllerutil.ContainsFinalizer(again, persistentips.Finalizer) {
		t.Fatalf("after stop/start the claim is %s with finalizers %v, want the same claim %s, still held", again.UID, again.Finalizers, claim.UID)
	}

	// Delete the VM: KubeVirt's finalizer keeps it terminating, and kvnet
	// releases the claims as soon as it is being deleted. The API server's
	// garbage collector would then delete them through the owner reference;
	// envtest runs no garbage collector, so the test checks the release and
	// the reference that the collector follows.
	if err := env.Client.Delete(ctx, &curVM); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"web.tenant", "web.hotplug", "web.doomed"} {
		piEventually(t, "finalizer of "+name+" released", func() error {
			c, err := piGetClaim(ns, name)
			if err != nil {
				return err
			}
			if controllerutil.ContainsFinalizer(c, persistentips.Finalizer) {
				return fmt.Errorf("finalizers %v", c.Finalizers)
			}
			if ref := metav1.GetControllerOf(c); ref == nil || ref.UID != vm.UID {
				return fmt.Errorf("owner references %v lost", c.OwnerReferences)
			}
			return nil
		})
	}
}

// A standalone VMI owns its claims; they are released only once the VMI is
// gone and no launcher pod of it is active.
func TestPersistentIPsStandaloneVMI(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, nil)
	piPersistentNAD(t, ns, "tenant", "tenant-net")
	tmpl := piVmWithNetworks(ns, "solo", [2]string{"tenant", "tenant"}).Spec.Template
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "solo"},
		Spec:       tmpl.Spec,
	}
	if err := env.Client.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	piWaitClaim(t, ns, "solo.tenant", "VirtualMachineInstance", "solo", vmi.UID, "tenant-net", "tenant")
	pod := piCreateLauncher(t, vmi)
	if refs := piClaimRefs(t, piStoredPod(t, pod)); refs["tenant"] != "solo.tenant" {
		t.Fatalf("claim references = %v", refs)
	}
	held := metricValue(t, "kvnet_persistentips_claims_held_for_launcher_total", nil)
	piDeleteAndWait(t, vmi)
	// The pod (Pending: envtest has no kubelet) is still active, so the
	// claim stays held. Wait until the controller has reconciled the VMI's
	// deletion and decided so, then check the claim: no timing window.
	piEventually(t, "controller kept the claim for the active launcher pod", func() error {
		if got := metricValue(t, "kvnet_persistentips_claims_held_for_launcher_total", nil); got <= held {
			return fmt.Errorf("no reconcile has kept a claim since the VMI was deleted")
		}
		return nil
	})
	c, err := piGetClaim(ns, "solo.tenant")
	if err != nil {
		t.Fatal(err)
	}
	if !controllerutil.ContainsFinalizer(c, persistentips.Finalizer) {
		t.Fatalf("claim released while the launcher pod is active: finalizers %v", c.Finalizers)
	}
	piDeleteAndWait(t, pod)
	piEventually(t, "finalizer released after the launcher pod went", func() error {
		c, err := piGetClaim(ns, "solo.tenant")
		if err != nil {
			return err
		}
		if controllerutil.ContainsFinalizer(c, persistentips.Finalizer) {
			return fmt.Errorf("finalizers %v", c.Finalizers)
		}
		return nil
	})
}

// Two VMs with the same name and network name in two namespaces get one
// claim each, in their own namespace, owned by their own VM.
func TestPersistentIPsTwoNamespaces(t *testing.T) {
	var uids []types.UID
	for i := 0; i < 2; i++ {
		ns := env.NewNamespace(t, nil)
		piPersistentNAD(t, ns, "tenant", "tenant-net")
		vm := piVmWithNetworks(ns, "db", [2]string{"data", "tenant"})
		piCreateVM(t, vm)
		c := piWaitClaim(t, ns, "db.data", "VirtualMachine", "db", vm.UID, "tenant-net", "data")
		uids = append(uids, c.UID)
		vmi := piStartVMI(t, vm)
		if refs := piClaimRefs(t, piStoredPod(t, piCreateLauncher(t, vmi))); refs["tenant"] != "db.data" {
			t.Fatalf("namespace %s: claim references = %v", ns, refs)
		}
	}
	if uids[0] == uids[1] {
		t.Fatalf("both namespaces share claim %s", uids[0])
	}
}

// A VM and network name too long for one object name give a deterministic,
// valid, shortened claim name, which the pod references.
func TestPersistentIPsTruncatedName(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	piPersistentNAD(t, ns, "tenant", "tenant-net")
	vmName := strings.Repeat("v", 63)
	network := "net-" + strings.Repeat("n", 196)
	want := persistentips.ClaimName(vmName, network)
	if len(want) != persistentips.MaxClaimNameLength || want == vmName+"."+network {
		t.Fatalf("ClaimName = %q (%d chars), want a shortened name of %d", want, len(want), persistentips.MaxClaimNameLength)
	}
	vm := piVmWithNetworks(ns, vmName, [2]string{network, "tenant"})
	piCreateVM(t, vm)
	piWaitClaim(t, ns, want, "VirtualMachine", vmName, vm.UID, "tenant-net", network)
	if refs := piClaimRefs(t, piStoredPod(t, piCreateLauncher(t, piStartVMI(t, vm)))); refs["tenant"] != want {
		t.Fatalf("claim references = %v, want %s", refs, want)
	}
}

// A claim with the wanted name but another controller is never adopted:
// kvnet leaves its owner and finalizers alone, reports a condition on it and
// an event on the VM, and the launcher pod does not reference it.
func TestPersistentIPsForeignClaimNotAdopted(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, nil)
	piPersistentNAD(t, ns, "tenant", "tenant-net")
	piPersistentNAD(t, ns, "other", "other-net")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "someone-else"}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	foreign := &ipamv1alpha1.IPAMClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app.tenant", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID, Controller: ptr.To(true),
		}}},
		Spec: ipamv1alpha1.IPAMClaimSpec{Network: "tenant-net", Interface: "eth1"},
	}
	if err := env.Client.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	env.WaitCached(t, &ipamv1alpha1.IPAMClaim{}, client.ObjectKeyFromObject(foreign))
	vm := piVmWithNetworks(ns, "app", [2]string{"tenant", "tenant"}, [2]string{"other", "other"})
	piCreateVM(t, vm)
	piWaitClaim(t, ns, "app.other", "VirtualMachine", "app", vm.UID, "other-net", "other")
	var c *ipamv1alpha1.IPAMClaim
	piEventually(t, "conflict condition on the foreign claim", func() (err error) {
		if c, err = piGetClaim(ns, "app.tenant"); err != nil {
			return err
		}
		if cond := meta.FindStatusCondition(c.Status.Conditions, persistentips.ConflictCondition); cond == nil || cond.Status != metav1.ConditionTrue {
			return fmt.Errorf("conditions %+v", c.Status.Conditions)
		}
		return nil
	})
	if len(c.OwnerReferences) != 1 || c.OwnerReferences[0].UID != cm.UID || len(c.Finalizers) != 0 || c.Spec.Interface != "eth1" {
		t.Fatalf("foreign claim was changed: owners %v finalizers %v spec %+v", c.OwnerReferences, c.Finalizers, c.Spec)
	}
	piEventually(t, "conflict event on the VM", func() error {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Kind == "VirtualMachine" && e.Regarding.Name == "app" && e.Reason == "IPAMClaimConflict" && e.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("%d events, none a conflict on the VM", len(evs.Items))
	})
	refs := piClaimRefs(t, piStoredPod(t, piCreateLauncher(t, piStartVMI(t, vm))))
	if refs["tenant"] != "" || refs["other"] != "app.other" {
		t.Fatalf("claim references = %v, want none for tenant and app.other for other", refs)
	}
}

// A VM that asks for persistent IPs (kvnet.io/networks "persistentIPs":
// true) on a NAD that does not allow them is refused with the annotation's
// field path; a NAD that allows them but whose CNI cannot honour claims
// gets a warning.
func TestPersistentIPsValidation(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "plain", "", fmt.Sprintf(bridgeConfig, "plain"))
	env.CreateNAD(t, ns, "bridgy", "", `{"cniVersion":"0.4.0","name":"bridgy","type":"bridge","allowPersistentIPs":true,"ipam":{"type":"host-local","subnet":"10.9.0.0/24"}}`)
	piPersistentNAD(t, ns, "tenant", "tenant-net")

	bad := piVmWithNetworks(ns, "bad")
	bad.Annotations = map[string]string{"kvnet.io/networks": `[{"name":"plain","nad":"plain","persistentIPs":true}]`}
	err := env.Client.Create(ctx, bad)
	if got := causes(t, err); len(got) != 1 || got[0] != "metadata.annotations[kvnet.io/networks]" {
		t.Fatalf("causes = %v, want the annotation", got)
	}
	if !strings.Contains(err.Error(), "allowPersistentIPs") {
		t.Fatalf("error %q does not say what is missing", err)
	}

	good := piVmWithNetworks(ns, "good")
	good.Annotations = map[string]string{"kvnet.io/networks": `[{"name":"tenant","nad":"tenant","persistentIPs":true}]`}
	c, warnings := warningClient(t)
	if err := c.Create(ctx, good); err != nil {
		t.Fatalf("persistentIPs on a NAD that allows them: %v", err)
	}
	piWaitClaim(t, ns, "good.tenant", "VirtualMachine", "good", good.UID, "tenant-net", "tenant")
	if w := warnings.all(); len(w) != 0 {
		t.Fatalf("unexpected warnings %q", w)
	}

	risky := piVmWithNetworks(ns, "risky", [2]string{"bridgy", "bridgy"})
	c2, warnings2 := warningClient(t)
	if err := c2.Create(ctx, risky); err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(warnings2.all(), "\n"); !strings.Contains(w, "not known to honour IPAMClaims") {
		t.Fatalf("warnings %q lack the IPAMClaim warning", w)
	}
}

// persistentIPs.enabled: false stops references on new launcher pods (and
// warns on VMs whose IP would have persisted). Not parallel: it swaps the
// suite's config.
func TestPersistentIPsDisabled(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, nil)
	piPersistentNAD(t, ns, "tenant", "tenant-net")
	restore, err := env.SetConfig(testConfig + "persistentIPs: {enabled: false}\n")
	if err != nil {
		t.Fatal(err)
	}
	defer restore()
	vm := piVmWithNetworks(ns, "off", [2]string{"tenant", "tenant"})
	c, warnings := warningClient(t)
	if err := c.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(warnings.all(), "\n"); !strings.Contains(w, "persistent IPs are turned off") {
		t.Fatalf("warnings %q lack the switched-off warning", w)
	}
	if refs := piClaimRefs(t, piStoredPod(t, piCreateLauncher(t, piStartVMI(t, vm)))); refs["tenant"] != "" {
		t.Fatalf("claim reference %q added while the feature is off", refs["tenant"])
	}
}

// A NAD that starts allowing persistent IPs after the VM exists gets the VM
// its claim: NAD events reach the VMs that attach the NAD.
func TestPersistentIPsNADAllowsLater(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, nil)
	nad := env.CreateNAD(t, ns, "tenant", "", `{"cniVersion":"1.0.0","name":"tenant-net","type":"ovn-k8s-cni-overlay","topology":"layer2"}`)
	vm := piVmWithNetworks(ns, "late", [2]string{"data", "tenant"})
	piCreateVM(t, vm)
	if _, err := piGetClaim(ns, "late.data"); !apierrors.IsNotFound(err) {
		t.Fatalf("claim before the NAD allows persistent IPs: err = %v", err)
	}
	base := nad.DeepCopy()
	nad.Spec.Config = fmt.Sprintf(piPersistentConfig, "tenant-net", ns+"/tenant")
	if err := env.Client.Patch(ctx, nad, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	piWaitClaim(t, ns, "late.data", "VirtualMachine", "late", vm.UID, "tenant-net", "data")
}

// KubeVirt v1.9.0's LiveUpdateNADRef lets a running VM's network point at
// another NAD. A NAD of the same network ("name" in its config) keeps the
// claim and its IP; a NAD of another network gets the claim created again
// for that network (OVN-Kubernetes ignores a claim whose spec.network is not
// the pod's network), with a Warning event that names the released IPs.
func TestPersistentIPsNADRefChanged(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, nil)
	piPersistentNAD(t, ns, "blue-a", "blue-net")
	piPersistentNAD(t, ns, "blue-b", "blue-net")
	piPersistentNAD(t, ns, "red", "red-net")
	vm := piVmWithNetworks(ns, "mover", [2]string{"data", "blue-a"})
	piCreateVM(t, vm)
	first := piWaitClaim(t, ns, "mover.data", "VirtualMachine", "mover", vm.UID, "blue-net", "data")
	// The IPAM plugin's allocation, which the event must name.
	base := first.DeepCopy()
	first.Status.IPs = []string{"10.100.0.7/24"}
	if err := env.Client.Status().Patch(ctx, first, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}

	repoint := func(nad string) {
		t.Helper()
		var cur kubevirtv1.VirtualMachine
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vm), &cur); err != nil {
			t.Fatal(err)
		}
		base := cur.DeepCopy()
		for i := range cur.Spec.Template.Spec.Networks {
			if n := &cur.Spec.Template.Spec.Networks[i]; n.Name == "data" {
				n.Multus.NetworkName = nad
			}
		}
		if err := env.Client.Patch(ctx, &cur, client.MergeFrom(base)); err != nil {
			t.Fatalf("pointing network data at %s: %v", nad, err)
		}
	}

	// Same network, another NAD: the claim stays. Changing the VM triggers a
	// reconcile; pointing at red afterwards proves it ran past this state.
	repoint("blue-b")
	piEventually(t, "claim kept for a NAD on the same network", func() error {
		c, err := piGetClaim(ns, "mover.data")
		if err != nil {
			return err
		}
		if c.UID != first.UID || c.DeletionTimestamp != nil {
			return fmt.Errorf("the claim of a NAD on the same network was replaced (uid %s, was %s)", c.UID, first.UID)
		}
		return nil
	})

	repoint("red")
	var second *ipamv1alpha1.IPAMClaim
	piEventually(t, "claim recreated for red-net", func() error {
		c, err := piGetClaim(ns, "mover.data")
		if err != nil {
			return err
		}
		if c.UID == first.UID || c.Spec.Network != "red-net" {
			return fmt.Errorf("claim uid %s spec.network %q, want a new claim for red-net", c.UID, c.Spec.Network)
		}
		second = c
		return nil
	})
	piWaitClaim(t, ns, "mover.data", "VirtualMachine", "mover", vm.UID, "red-net", "data")
	if len(second.Status.IPs) != 0 {
		t.Errorf("new claim carries IPs %v of the old network", second.Status.IPs)
	}
	piEventually(t, "IPAMClaimRecreated event", func() error {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "IPAMClaimRecreated" && e.Regarding.Name == "mover" && e.Type == corev1.EventTypeWarning &&
				strings.Contains(e.Note, `"red-net"`) && strings.Contains(e.Note, "10.100.0.7/24") && strings.Contains(e.Note, `"blue-net"`) {
				return nil
			}
		}
		return fmt.Errorf("no IPAMClaimRecreated event naming both networks and the released IP among %d events", len(evs.Items))
	})
}
