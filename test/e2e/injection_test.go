package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/persistentips"
)

const bridgeConfig = `{"cniVersion":"0.4.0","name":"%s","type":"bridge","bridge":"br1"}`

// A rule's network reaches the running VM: kvnet adds it to the VM, virt-api
// admits and defaults the result, virt-controller renders it into the VMI and
// the virt-launcher pod's Multus annotation, under the pod interface name
// KubeVirt gives a secondary network.
func TestRuleInjectionReachesLauncherPod(t *testing.T) {
	ns := env.NewNamespace(t, map[string]string{"kvnet.io/storage-network": "true"})
	env.CreateNAD(t, ns, "storage", "", fmt.Sprintf(bridgeConfig, "storage"))
	mustCreateVM(t, ns, vmYAML("db", "", "", ""))

	var vm kubevirtv1.VirtualMachine
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "db"}, &vm); err != nil {
		t.Fatal(err)
	}
	spec := vm.Spec.Template.Spec
	if n := len(spec.Networks); n != 2 || spec.Networks[1].Multus == nil || spec.Networks[1].Multus.NetworkName != "storage" {
		t.Fatalf("stored networks = %+v, want default + storage from the rule", spec.Networks)
	}
	// virt-api's VM mutator ran beside kvnet's: it defaults the machine type.
	if spec.Domain.Machine == nil || spec.Domain.Machine.Type == "" {
		t.Errorf("stored VM has no machine type: virt-api's mutator did not run on kvnet's result")
	}

	vmi := waitVMI(t, ns, "db")
	if names := networkNames(vmi.Spec.Networks); names != "default,storage" {
		t.Errorf("VMI networks = %s, want default,storage", names)
	}
	pod := waitLauncherPod(t, vmi)
	sel := selection(t, pod)
	e, ok := sel["storage"]
	if !ok {
		t.Fatalf("launcher pod %s: %s = %s, want an element for storage", pod.Name, "k8s.v1.cni.cncf.io/networks", pod.Annotations["k8s.v1.cni.cncf.io/networks"])
	}
	if e.Namespace() != ns {
		t.Errorf("storage element namespace = %q, want %q", e.Namespace(), ns)
	}
	// kvnet's claim references and IPAMClaims name the interface the same way.
	if want := persistentips.PodInterfaceName("storage"); e.Interface() != want {
		t.Errorf("storage element interface = %q, kvnet assumes KubeVirt names it %q", e.Interface(), want)
	}
}

// A VM that declared no network relied on KubeVirt's automatic pod network.
// kvnet writes it out before adding the rule's network (KubeVirt stops
// adding it once any network is declared), and virt-api accepts the result.
func TestVMWithoutNetworksKeepsPodNetwork(t *testing.T) {
	ns := env.NewNamespace(t, map[string]string{"kvnet.io/storage-network": "true"})
	env.CreateNAD(t, ns, "storage", "", fmt.Sprintf(bridgeConfig, "storage"))
	y := strings.NewReplacer(
		"          interfaces:\n            - {name: default, masquerade: {}}\n", "",
		"      networks:\n        - {name: default, pod: {}}\n", "",
	).Replace(vmYAML("bare", "", "", ""))
	if strings.Contains(y, "networks:") {
		t.Fatalf("test VM still declares networks:\n%s", y)
	}
	mustCreateVM(t, ns, y)
	vmi := waitVMI(t, ns, "bare")
	if names := networkNames(vmi.Spec.Networks); names != "default,storage" {
		t.Fatalf("VMI networks = %s, want the pod network kept and storage added", names)
	}
	if vmi.Spec.Networks[0].Pod == nil {
		t.Errorf("first network %+v is not the pod network", vmi.Spec.Networks[0])
	}
	pod := waitLauncherPod(t, vmi)
	if _, ok := selection(t, pod)["storage"]; !ok {
		t.Errorf("launcher pod has no storage attachment: %s", pod.Annotations["k8s.v1.cni.cncf.io/networks"])
	}
}

func networkNames(nets []kubevirtv1.Network) string {
	var names []string
	for _, n := range nets {
		names = append(names, n.Name)
	}
	return strings.Join(names, ",")
}
