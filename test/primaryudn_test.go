package test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/primaryudn"
	"github.com/kvnet/kvnet/internal/persistentips"
)

// A primary layer2 UDN as OVN-Kubernetes renders it for a
// UserDefinedNetwork "udn" in namespace %[1]s.
const udnPrimaryConfig = `{"cniVersion":"1.0.0","name":"%[1]s_udn","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary","subnets":"10.210.0.0/16","netAttachDefName":"%[1]s/udn","allowPersistentIPs":true}`

// udnOn is the suite's policy with primary-UDN persistent IPs switched on.
const udnOn = testConfig + "persistentIPs: {primaryUDN: {enabled: true}}\n"

const udnMAC = "02:00:00:00:10:01"

// udnVM is a VM on the pod network, with a MAC on its pod interface and the
// IPs it asks for in network.kubevirt.io/addresses.
func udnVM(ns, name string) *kubevirtv1.VirtualMachine {
	vm := piVmWithNetworks(ns, name)
	tmpl := vm.Spec.Template
	tmpl.ObjectMeta.Annotations = map[string]string{primaryudn.AddressesAnnotation: `{"default":["10.210.0.7"]}`}
	tmpl.Spec.Domain.Devices.Interfaces[0].MacAddress = udnMAC
	return vm
}

// udnStartVMI creates the VMI as virt-controller does, with the template's
// annotations (KubeVirt copies them to the VMI).
func udnStartVMI(t *testing.T, vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachineInstance {
	t.Helper()
	vmi := piStartVMI(t, vm)
	base := vmi.DeepCopy()
	for k, v := range vm.Spec.Template.ObjectMeta.Annotations {
		vmi.Annotations[k] = v
	}
	if err := env.Client.Patch(context.Background(), vmi, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	waitCachedWith(t, vmi, func(cur *kubevirtv1.VirtualMachineInstance) bool {
		return cur.Annotations[primaryudn.AddressesAnnotation] != ""
	})
	return vmi
}

// waitCachedWith waits until kvnet's cache has the VMI in a state cond
// accepts: admission reads it from there.
func waitCachedWith(t *testing.T, vmi *kubevirtv1.VirtualMachineInstance, cond func(*kubevirtv1.VirtualMachineInstance) bool) {
	t.Helper()
	piEventually(t, "VMI "+vmi.Name+" updated in kvnet's cache", func() error {
		var cur kubevirtv1.VirtualMachineInstance
		if err := env.Manager.GetCache().Get(context.Background(), client.ObjectKeyFromObject(vmi), &cur); err != nil {
			return err
		}
		if !cond(&cur) {
			return fmt.Errorf("not yet")
		}
		return nil
	})
}

// udnLauncher is the virt-launcher pod virt-controller writes for a VMI with
// only the pod network (no k8s.v1.cni.cncf.io/networks), with extra
// annotations (from the VM template, say).
func udnLauncher(vmi *kubevirtv1.VirtualMachineInstance, extra map[string]string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    vmi.Namespace,
			GenerateName: "virt-launcher-",
			Labels:       map[string]string{"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": string(vmi.UID), "vm.kubevirt.io/name": vmi.Name},
			Annotations: map[string]string{
				"kubevirt.io/domain":                      vmi.Name,
				"kubectl.kubernetes.io/default-container": "compute",
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: vmi.Name, UID: vmi.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "quay.io/kubevirt/virt-launcher:v1.9.0"}}},
	}
	for k, v := range extra {
		pod.Annotations[k] = v
	}
	return pod
}

// udnDefaultNAD creates OVN-Kubernetes' cluster default network NAD
// (ovn-kubernetes/default), which the default-network element names.
func udnDefaultNAD(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ovn-kubernetes"}}
	if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	nad := env.CreateNAD(t, "ovn-kubernetes", "default", "", `{"cniVersion":"0.4.0","name":"ovn-kubernetes","type":"ovn-k8s-cni-overlay"}`)
	t.Cleanup(func() { _ = env.Client.Delete(ctx, nad) })
}

// Without persistentIPs.primaryUDN nothing changes: a namespace with a
// primary UDN gets no pod-network claim and its launcher pods no
// default-network annotation. The controller's claim for a secondary
// network of the same VM shows it did reconcile the VM meanwhile.
func TestPrimaryUDNOffByDefault(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "udn", "", fmt.Sprintf(udnPrimaryConfig, ns))
	piPersistentNAD(t, ns, "tenant", "tenant-net")
	vm := udnVM(ns, "plain")
	vm.Spec.Template.Spec.Networks = append(vm.Spec.Template.Spec.Networks, kubevirtv1.Network{Name: "tenant", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "tenant"}}})
	vm.Spec.Template.Spec.Domain.Devices.Interfaces = append(vm.Spec.Template.Spec.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: "tenant", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}}})
	piCreateVM(t, vm)
	piWaitClaim(t, ns, "plain.tenant", "VirtualMachine", "plain", vm.UID, "tenant-net", "tenant")
	if _, err := piGetClaim(ns, "plain.default"); !apierrors.IsNotFound(err) {
		t.Fatalf("pod-network claim with primaryUDN off: err = %v, want NotFound", err)
	}
	pod := udnLauncher(udnStartVMI(t, vm), nil)
	if err := env.Client.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	got := piStoredPod(t, pod)
	for _, k := range []string{multus.DefaultNetworkAnnotation, primaryudn.LegacyClaimAnnotation} {
		if v, ok := got.Annotations[k]; ok {
			t.Errorf("launcher pod got %s=%q with primaryUDN off", k, v)
		}
	}
}

// With persistentIPs.primaryUDN on: a VM created before its namespace's
// primary UDN gets its pod-network claim when the NAD arrives (owned by the
// VM, kvnet's finalizer, spec.network = the UDN's network name,
// spec.interface = ovn-udn1); the launcher pod stored by the API server
// carries the default-network element (claim, MAC, IPs) and the legacy
// annotation; a second launcher pod (stop/start) names the same claim; a
// pod whose default-network annotation kvnet would have to overwrite is
// refused with a 403 naming it; deleting the VM releases the claim.
// Not parallel: it swaps the suite's config.
func TestPrimaryUDNClaimAndLauncherPod(t *testing.T) {
	ctx := context.Background()
	restore, err := env.SetConfig(udnOn)
	if err != nil {
		t.Fatal(err)
	}
	defer restore()
	udnDefaultNAD(t)
	ns := env.NewNamespace(t, nil)
	vm := udnVM(ns, "web")
	piCreateVM(t, vm)
	env.CreateNAD(t, ns, "udn", "", fmt.Sprintf(udnPrimaryConfig, ns))
	claim := persistentips.ClaimName("web", "default")
	c := piWaitClaimFor(t, ns, claim, vm)
	if c.Spec.Network != ns+"_udn" || c.Spec.Interface != persistentips.PrimaryUDNInterface {
		t.Errorf("claim spec = %+v, want network %s_udn, interface %s", c.Spec, ns, persistentips.PrimaryUDNInterface)
	}

	vmi := udnStartVMI(t, vm)
	pod := udnLauncher(vmi, nil)
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatalf("creating the launcher pod: %v", err)
	}
	got := piStoredPod(t, pod)
	want := `[{"name":"default","namespace":"ovn-kubernetes","ips":["10.210.0.7/16"],"mac":"` + udnMAC + `","ipam-claim-reference":"` + claim + `"}]`
	if v := got.Annotations[multus.DefaultNetworkAnnotation]; v != want {
		t.Errorf("stored %s\n got %s\nwant %s", multus.DefaultNetworkAnnotation, v, want)
	}
	if v := got.Annotations[primaryudn.LegacyClaimAnnotation]; v != claim {
		t.Errorf("stored %s = %q, want %q", primaryudn.LegacyClaimAnnotation, v, claim)
	}
	// A label-only UPDATE (virt-controller's kind) keeps both byte for byte.
	base := got.DeepCopy()
	got.Labels["kubevirt.io/nodeName"] = "node-a"
	if err := env.Client.Patch(ctx, got, client.MergeFrom(base)); err != nil {
		t.Fatalf("label update: %v", err)
	}
	if after := piStoredPod(t, pod); after.Annotations[multus.DefaultNetworkAnnotation] != want {
		t.Errorf("UPDATE changed the element to %s", after.Annotations[multus.DefaultNetworkAnnotation])
	}

	// A default-network annotation copied from the VM template, naming
	// another network: refused, naming the annotation, never a 500.
	foreign := udnLauncher(vmi, map[string]string{multus.DefaultNetworkAnnotation: ns + "/mine"})
	err = env.Client.Create(ctx, foreign)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), multus.DefaultNetworkAnnotation) || !strings.Contains(err.Error(), ns+"/mine") {
		t.Fatalf("pod with a foreign default network: err = %v, want 403 naming %s", err, multus.DefaultNetworkAnnotation)
	}
	// The same element kvnet would write is completed, not refused.
	partial := udnLauncher(vmi, map[string]string{multus.DefaultNetworkAnnotation: `[{"name":"default","namespace":"ovn-kubernetes","mac":"` + udnMAC + `"}]`})
	if err := env.Client.Create(ctx, partial); err != nil {
		t.Fatalf("pod with kvnet's own element, partly: %v", err)
	}
	if v := piStoredPod(t, partial).Annotations[multus.DefaultNetworkAnnotation]; v != `[{"name":"default","namespace":"ovn-kubernetes","mac":"`+udnMAC+`","ips":["10.210.0.7/16"],"ipam-claim-reference":"`+claim+`"}]` {
		t.Errorf("completed element %s", v)
	}

	// Stop/start: a new VMI and pod name the same claim (same UID).
	piDeleteAndWait(t, pod)
	piDeleteAndWait(t, partial)
	piDeleteAndWait(t, vmi)
	vmi2 := udnStartVMI(t, vm)
	pod2 := udnLauncher(vmi2, nil)
	if err := env.Client.Create(ctx, pod2); err != nil {
		t.Fatal(err)
	}
	if v := piStoredPod(t, pod2).Annotations[multus.DefaultNetworkAnnotation]; v != want {
		t.Errorf("after restart %s = %s", multus.DefaultNetworkAnnotation, v)
	}
	if again, err := piGetClaim(ns, claim); err != nil || again.UID != c.UID {
		t.Errorf("claim after restart: %v (uid %s, was %s)", err, again.UID, c.UID)
	}

	// A VM asking for an IP outside the primary network is refused on the
	// VM, naming the annotation, rather than losing the IP at pod creation.
	bad := udnVM(ns, "bad")
	bad.Spec.Template.ObjectMeta.Annotations[primaryudn.AddressesAnnotation] = `{"default":["192.168.9.9"]}`
	if err := env.Client.Create(ctx, bad); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.template.metadata.annotations[network.kubevirt.io/addresses]") {
		t.Errorf("VM with an IP outside the primary network: err = %v, want 422 naming the annotation", err)
	}

	// Deleting the VM (KubeVirt's finalizer keeps it terminating) releases
	// kvnet's finalizer; the owner reference stays for the garbage collector.
	if err := env.Client.Delete(ctx, vm); err != nil {
		t.Fatal(err)
	}
	piEventually(t, "kvnet's finalizer released", func() error {
		cur, err := piGetClaim(ns, claim)
		if err != nil {
			return err
		}
		if controllerutil.ContainsFinalizer(cur, persistentips.Finalizer) {
			return fmt.Errorf("finalizers %v", cur.Finalizers)
		}
		if metav1.GetControllerOf(cur) == nil {
			return fmt.Errorf("owner reference gone")
		}
		return nil
	})
}

// piWaitClaimFor waits for a claim controlled by vm with kvnet's finalizer
// and the VM label.
func piWaitClaimFor(t *testing.T, ns, name string, vm *kubevirtv1.VirtualMachine) *ipamv1alpha1.IPAMClaim {
	t.Helper()
	var c *ipamv1alpha1.IPAMClaim
	piEventually(t, "claim "+name+" created", func() (err error) {
		c, err = piGetClaim(ns, name)
		return err
	})
	if o := metav1.GetControllerOf(c); o == nil || o.Kind != "VirtualMachine" || o.Name != vm.Name || o.UID != vm.UID || o.BlockOwnerDeletion == nil || !*o.BlockOwnerDeletion {
		t.Errorf("claim %s controller = %+v, want VM %s (%s) with blockOwnerDeletion", name, o, vm.Name, vm.UID)
	}
	if !controllerutil.ContainsFinalizer(c, persistentips.Finalizer) || c.Labels[persistentips.VMLabel] != vm.Name {
		t.Errorf("claim %s finalizers %v labels %v", name, c.Finalizers, c.Labels)
	}
	return c
}

// With persistentIPs.primaryUDN.legacyClaimAnnotation: false (for an
// OVN-Kubernetes that has dropped k8s.ovn.org/primary-udn-ipamclaim, as
// OKEP-5233 plans), the stored launcher pod carries the claim in the
// default-network element only; TestPrimaryUDNClaimAndLauncherPod shows the
// default, which writes both.
func TestPrimaryUDNLegacyAnnotationOff(t *testing.T) {
	ctx := context.Background()
	restore, err := env.SetConfig(testConfig + "persistentIPs: {primaryUDN: {enabled: true, legacyClaimAnnotation: false}}\n")
	if err != nil {
		t.Fatal(err)
	}
	defer restore()
	udnDefaultNAD(t)
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "udn", "", fmt.Sprintf(udnPrimaryConfig, ns))
	vm := udnVM(ns, "web")
	piCreateVM(t, vm)
	claim := persistentips.ClaimName("web", "default")
	piWaitClaimFor(t, ns, claim, vm)
	vmi := udnStartVMI(t, vm)
	pod := udnLauncher(vmi, nil)
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatalf("creating the launcher pod: %v", err)
	}
	got := piStoredPod(t, pod)
	want := `[{"name":"default","namespace":"ovn-kubernetes","ips":["10.210.0.7/16"],"mac":"` + udnMAC + `","ipam-claim-reference":"` + claim + `"}]`
	if v := got.Annotations[multus.DefaultNetworkAnnotation]; v != want {
		t.Errorf("stored %s\n got %s\nwant %s", multus.DefaultNetworkAnnotation, v, want)
	}
	if v, ok := got.Annotations[primaryudn.LegacyClaimAnnotation]; ok {
		t.Errorf("stored pod carries %s=%q with the switch off", primaryudn.LegacyClaimAnnotation, v)
	}
}

// A VM whose pod-network claim already holds an IP (OVN-Kubernetes wrote
// it into status.ips, as this test does in its place) is refused on UPDATE
// when network.kubevirt.io/addresses asks for another one: 422 with one
// cause naming the annotation, read from kvnet's claim cache. Asking for
// the claim's own IP is admitted.
func TestPrimaryUDNAddressesMustMatchClaim(t *testing.T) {
	ctx := context.Background()
	restore, err := env.SetConfig(udnOn)
	if err != nil {
		t.Fatal(err)
	}
	defer restore()
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "udn", "", fmt.Sprintf(udnPrimaryConfig, ns))
	vm := udnVM(ns, "web")
	delete(vm.Spec.Template.ObjectMeta.Annotations, primaryudn.AddressesAnnotation)
	piCreateVM(t, vm)
	claim := piWaitClaimFor(t, ns, persistentips.ClaimName("web", "default"), vm)

	// OVN-Kubernetes' part: the IP it allocated, recorded in the claim.
	claim.Status.IPs = []string{"10.210.0.33/16"}
	if err := env.Client.Status().Update(ctx, claim); err != nil {
		t.Fatalf("writing the claim's status.ips: %v", err)
	}
	piEventually(t, "claim IPs in kvnet's cache", func() error {
		var c ipamv1alpha1.IPAMClaim
		if err := env.Manager.GetCache().Get(ctx, client.ObjectKeyFromObject(claim), &c); err != nil {
			return err
		}
		if len(c.Status.IPs) == 0 {
			return fmt.Errorf("not yet")
		}
		return nil
	})

	ask := func(ip string) error {
		cur := getVM(t, ns, "web")
		if cur.Spec.Template.ObjectMeta.Annotations == nil {
			cur.Spec.Template.ObjectMeta.Annotations = map[string]string{}
		}
		cur.Spec.Template.ObjectMeta.Annotations[primaryudn.AddressesAnnotation] = `{"default":["` + ip + `"]}`
		return env.Client.Update(ctx, cur)
	}
	err = ask("10.210.0.7")
	hasCause(t, err, "spec.template.metadata.annotations[network.kubevirt.io/addresses]", "IPAMClaim web.default already holds [10.210.0.33/16]")
	if n := len(causes(t, err)); n != 1 {
		t.Errorf("%d causes, want 1: %v", n, err)
	}
	if err := ask("10.210.0.33"); err != nil {
		t.Errorf("asking for the claim's own IP: %v", err)
	}
}
