package e2e

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/test/framework"
)

const (
	sriovResource   = "intel.com/sriov_netdevice"
	vdpaResource    = "jaguarmicro.com/vdpa"
	sriovNADConfig  = `{"cniVersion":"0.4.0","name":"%s","type":"sriov"}`
	externalNetGate = "ExternalNetResourceInjection"
)

// sriovVM has n SR-IOV interfaces, vf0 on NAD sriov-a and the others on
// sriov-b: two NADs of one device-plugin resource.
func sriovVM(name string, n int) string {
	var ifaces, nets strings.Builder
	for i := range n {
		nad := "sriov-b"
		if i == 0 {
			nad = "sriov-a"
		}
		fmt.Fprintf(&ifaces, "\n            - {name: vf%d, sriov: {}}", i)
		fmt.Fprintf(&nets, "\n        - {name: vf%d, multus: {networkName: %s}}", i, nad)
	}
	return vmYAML(name, ifaces.String(), nets.String(), "")
}

// resourceNADs creates the SR-IOV and vDPA NADs the tests attach.
func resourceNADs(t *testing.T, ns string) {
	t.Helper()
	env.CreateNAD(t, ns, "sriov-a", sriovResource, fmt.Sprintf(sriovNADConfig, "sriov-a"))
	env.CreateNAD(t, ns, "sriov-b", sriovResource, fmt.Sprintf(sriovNADConfig, "sriov-b"))
	env.CreateNAD(t, ns, "vdpa-net", vdpaResource, vdpaNADConfig)
}

// compute is the launcher pod's compute container.
func compute(t *testing.T, pod *corev1.Pod) *corev1.Container {
	t.Helper()
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == "compute" {
			return &pod.Spec.Containers[i]
		}
	}
	t.Fatalf("launcher pod %s has no compute container", pod.Name)
	return nil
}

// wantDevices checks the compute container's requests and limits of r.
func wantDevices(t *testing.T, pod *corev1.Pod, r string, n int64) {
	t.Helper()
	c := compute(t, pod)
	req, lim := c.Resources.Requests[corev1.ResourceName(r)], c.Resources.Limits[corev1.ResourceName(r)]
	if req.Value() != n || lim.Value() != n {
		t.Errorf("pod %s compute %s: requests %s, limits %s; want %d each (requests %v, limits %v)", pod.Name, r, req.String(), lim.String(), n, c.Resources.Requests, c.Resources.Limits)
	}
}

// launcherOf starts a VM from y and returns its first virt-launcher pod.
func launcherOf(t *testing.T, ns, name, y string) *corev1.Pod {
	t.Helper()
	mustCreateVM(t, ns, y)
	return waitLauncherPod(t, waitVMI(t, ns, name))
}

// kvnetInjected reports whether the pod's kvnet.io/mutations records the
// network-resources mutator.
func kvnetInjected(pod *corev1.Pod) bool {
	return strings.Contains(pod.Annotations[chain.MutationsAnnotation], `"network-resources"`)
}

// KubeVirt v1.9.0's default (ExternalNetResourceInjection, Beta, on): the
// real virt-controller writes no device resources into the launcher pod,
// and kvnet's launcher-pod webhook adds one per attachment: two VFs for
// an SR-IOV VM with two interfaces on two NADs of one resource, one vDPA
// device for a vDPA VM.
func TestDeviceResourcesWithExternalInjectionGateOn(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	resourceNADs(t, ns)

	pod := launcherOf(t, ns, "sriov", sriovVM("sriov", 2))
	wantDevices(t, pod, sriovResource, 2)
	if !kvnetInjected(pod) {
		t.Errorf("pod %s: %s = %q; kvnet should have added the VFs (virt-controller does not with the gate on)", pod.Name, chain.MutationsAnnotation, pod.Annotations[chain.MutationsAnnotation])
	}

	pod = launcherOf(t, ns, "fast", vdpaVM("fast", ""))
	wantDevices(t, pod, vdpaResource, 1)
	if !kvnetInjected(pod) {
		t.Errorf("pod %s: %s = %q; kvnet should have added the vDPA device", pod.Name, chain.MutationsAnnotation, pod.Annotations[chain.MutationsAnnotation])
	}
}

// With the gate switched off in the KubeVirt CR
// (spec.configuration.developerConfiguration.disabledFeatureGates, as v1.9.0
// spells it), virt-controller reads the NADs and writes the resources
// itself. kvnet steps aside: the counts are KubeVirt's, not doubled, and
// kvnet records no change.
func TestDeviceResourcesWithExternalInjectionGateOff(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	resourceNADs(t, ns)
	updateKubeVirt(t, func(s *kubevirtv1.KubeVirtSpec) {
		s.Configuration.DeveloperConfiguration.DisabledFeatureGates = []string{externalNetGate}
	})
	t.Cleanup(func() {
		updateKubeVirt(t, func(s *kubevirtv1.KubeVirtSpec) { s.Configuration.DeveloperConfiguration.DisabledFeatureGates = nil })
	})

	// virt-controller picks the CR change up on its own schedule. With
	// kvnet's injection off, a probe VM's pod has the VF only once
	// virt-controller writes it itself.
	restore, err := env.SetConfig(testConfig + "resources: {inject: never}\n")
	if err != nil {
		t.Fatal(err)
	}
	probes := 0
	framework.Eventually(t, "virt-controller writes device resources with the gate off", waitTimeout, func() error {
		probes++
		name := fmt.Sprintf("probe%d", probes)
		pod := launcherOf(t, ns, name, sriovVM(name, 1))
		if q := compute(t, pod).Resources.Requests[sriovResource]; q.Value() != 1 {
			return fmt.Errorf("probe %s: compute requests %v", name, compute(t, pod).Resources.Requests)
		}
		return nil
	})
	restore()

	pod := launcherOf(t, ns, "sriov", sriovVM("sriov", 2))
	wantDevices(t, pod, sriovResource, 2)
	pod2 := launcherOf(t, ns, "fast", vdpaVM("fast", ""))
	wantDevices(t, pod2, vdpaResource, 1)
	for _, p := range []*corev1.Pod{pod, pod2} {
		if kvnetInjected(p) {
			t.Errorf("pod %s: kvnet recorded a resource change (%s) where KubeVirt had written them", p.Name, p.Annotations[chain.MutationsAnnotation])
		}
	}
}
