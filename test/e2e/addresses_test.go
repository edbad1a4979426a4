package e2e

import (
	"strings"
	"testing"
)

// A per-network address request reaches the real virt-launcher pod: kvnet
// writes it on the VM template, virt-controller copies it to the VMI and the
// pod, and kvnet's pod webhook puts ips, mac and cni-args into the
// network's Multus selection element.
func TestAddressRequestReachesLauncherPod(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "lan", "", `{"cniVersion":"0.4.0","name":"lan","type":"bridge","bridge":"br1","ipam":{"type":"static","subnet":"10.10.0.0/24"}}`)
	mustCreateVM(t, ns, vmYAML("db", "", "",
		`kvnet.io/networks: '[{"name":"lan","nad":"lan","ips":["10.10.0.5/24"],"mac":"02:00:00:00:00:05","cniArgs":{"vlan":"7"}}]'`))

	vmi := waitVMI(t, ns, "db")
	if !strings.Contains(vmi.Annotations["kvnet.io/addresses"], `"lan"`) {
		t.Errorf("VMI annotations = %v, want kvnet.io/addresses for lan", vmi.Annotations)
	}
	pod := waitLauncherPod(t, vmi)
	e := selection(t, pod)["lan"]
	if e == nil {
		t.Fatalf("launcher pod has no lan attachment: %s", pod.Annotations["k8s.v1.cni.cncf.io/networks"])
	}
	for key, want := range map[string]string{"ips": `["10.10.0.5/24"]`, "mac": `"02:00:00:00:00:05"`, "cni-args": `{"vlan":"7"}`} {
		if got := string(e.Raw(key)); got != want {
			t.Errorf("lan element %s = %s, want %s (element %s)", key, got, want, pod.Annotations["k8s.v1.cni.cncf.io/networks"])
		}
	}
	if e.Interface() == "" {
		t.Errorf("lan element lost KubeVirt's interface: %s", pod.Annotations["k8s.v1.cni.cncf.io/networks"])
	}
}
