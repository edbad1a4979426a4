package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/test/framework"
)

const vdpaNADConfig = `{"cniVersion":"0.4.0","name":"vdpa-net","type":"sriov"}`

// vdpaVM attaches one interface, with no binding, to the vDPA NAD.
func vdpaVM(name, annotations string) string {
	return vmYAML(name,
		"\n            - {name: fast}",
		"\n        - {name: fast, multus: {networkName: vdpa-net}}", annotations)
}

// A VM on a vDPA NAD gets the binding plugin, locked memory and multiqueue
// from kvnet; virt-api (with the memLock feature gate on) admits the result
// and virt-controller renders the plugin's sidecar into the launcher pod.
func TestVDPAVMStartsUnderVirtAPI(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "vdpa-net", "jaguarmicro.com/vdpa", vdpaNADConfig)
	mustCreateVM(t, ns, vdpaVM("fast", ""))

	var vm kubevirtv1.VirtualMachine
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "fast"}, &vm); err != nil {
		t.Fatal(err)
	}
	spec := vm.Spec.Template.Spec
	ifaces := spec.Domain.Devices.Interfaces
	if len(ifaces) != 2 || ifaces[1].Binding == nil || ifaces[1].Binding.Name != "vdpa" {
		t.Fatalf("stored interfaces = %+v, want fast bound to the vdpa plugin", ifaces)
	}
	if m := spec.Domain.Memory; m == nil || m.ReservedOverhead == nil || m.ReservedOverhead.MemLock == nil || *m.ReservedOverhead.MemLock != kubevirtv1.MemLockRequired {
		t.Errorf("stored memory = %+v, want reservedOverhead.memLock: Required", spec.Domain.Memory)
	}
	if q := spec.Domain.Devices.NetworkInterfaceMultiQueue; q == nil || !*q {
		t.Errorf("networkInterfaceMultiqueue = %v, want true", q)
	}

	vmi := waitVMI(t, ns, "fast")
	pod := waitLauncherPod(t, vmi)
	var images []string
	for _, c := range pod.Spec.Containers {
		images = append(images, c.Image)
	}
	if !slices.Contains(images, kubeVirtSpec().Configuration.NetworkConfiguration.Binding["vdpa"].SidecarImage) {
		t.Errorf("launcher pod containers %v lack the vdpa plugin's sidecar", images)
	}
	if _, ok := selection(t, pod)["vdpa-net"]; !ok {
		t.Errorf("launcher pod has no vdpa-net attachment: %s", pod.Annotations["k8s.v1.cni.cncf.io/networks"])
	}
}

// Without the ReservedOverheadMemlock feature gate virt-api refuses memLock
// on any VM, and a vDPA device cannot work without locked memory. kvnet
// therefore refuses the VM itself, naming the gate to enable, instead of
// writing a memLock that virt-api then refuses with no word about vDPA.
func TestVDPAWithoutMemLockGateIsRefusedByKvnet(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "vdpa-net", "jaguarmicro.com/vdpa", vdpaNADConfig)
	updateKubeVirt(t, func(s *kubevirtv1.KubeVirtSpec) { s.Configuration.DeveloperConfiguration.FeatureGates = nil })
	t.Cleanup(func() {
		updateKubeVirt(t, func(s *kubevirtv1.KubeVirtSpec) {
			s.Configuration.DeveloperConfiguration.FeatureGates = []string{memLockGate}
		})
		waitVirtAPIGate(t, true)
	})
	waitVirtAPIGate(t, false)

	_, err := createVM(t, ns, vdpaVM("fast", ""))
	if !apierrors.IsInvalid(err) {
		t.Fatalf("want kvnet's 422, got %v", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "kvnet") || !strings.Contains(msg, memLockGate) || !strings.Contains(msg, "spec.template.spec.domain.memory.reservedOverhead.memLock") {
		t.Errorf("refusal should come from kvnet, name the field and the feature gate: %v", err)
	}
}

// waitVirtAPIGate waits until virt-api has seen the gate's state: it admits
// (on) or refuses (off) memLock on a VM kvnet skips, in a dry run.
func waitVirtAPIGate(t *testing.T, on bool) {
	t.Helper()
	probe := strings.Replace(vmYAML("memlock-probe", "", "", `kvnet.io/skip: "true"`),
		"        memory: {guest: 1Gi}", "        memory: {guest: 1Gi, reservedOverhead: {memLock: Required}}", 1)
	var vm kubevirtv1.VirtualMachine
	if err := yaml.UnmarshalStrict([]byte(probe), &vm); err != nil {
		t.Fatal(err)
	}
	vm.Namespace = "default"
	framework.Eventually(t, fmt.Sprintf("virt-api sees %s on=%v", memLockGate, on), waitTimeout, func() error {
		err := env.Client.Create(context.Background(), vm.DeepCopy(), client.DryRunAll)
		if on {
			return err
		}
		if err == nil || !strings.Contains(err.Error(), "virtualmachine-validator.kubevirt.io") {
			return fmt.Errorf("virt-api's answer: %v", err)
		}
		return nil
	})
}
