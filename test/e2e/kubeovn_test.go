package e2e

import (
	"testing"
)

const kubeOVNConfig = `{"cniVersion":"0.3.0","type":"kube-ovn","server_socket":"/run/openvswitch/kube-ovn-daemon.sock"}`

// kvnet writes kube-ovn's attachment annotations on the VM template; KubeVirt
// copies template annotations to the VMI and from there to the real
// virt-launcher pod, where kube-ovn reads them.
func TestKubeOVNAnnotationsReachLauncherPod(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "ovn-a", "", kubeOVNConfig)
	env.CreateNAD(t, ns, "ovn-b", "", kubeOVNConfig)
	mustCreateVM(t, ns, vmYAML("web", "", "",
		`kvnet.io/networks: '[{"name":"a","nad":"ovn-a"},{"name":"b","nad":"ovn-b","defaultRoute":true}]'`))

	vmi := waitVMI(t, ns, "web")
	key := "ovn-b." + ns + ".ovn.kubernetes.io/default_route"
	if vmi.Annotations[key] != "true" {
		t.Errorf("VMI annotations = %v, want %s", vmi.Annotations, key)
	}
	pod := waitLauncherPod(t, vmi)
	if pod.Annotations[key] != "true" {
		t.Errorf("launcher pod annotations = %v, want %s=true", pod.Annotations, key)
	}
	if v, ok := pod.Annotations["ovn-a."+ns+".ovn.kubernetes.io/default_route"]; ok {
		t.Errorf("ovn-a got default_route=%q; only b asked for it", v)
	}
	sel := selection(t, pod)
	for _, nad := range []string{"ovn-a", "ovn-b"} {
		if _, ok := sel[nad]; !ok {
			t.Errorf("launcher pod has no %s attachment: %s", nad, pod.Annotations["k8s.v1.cni.cncf.io/networks"])
		}
	}
}
