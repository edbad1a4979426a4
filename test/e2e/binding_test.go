package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/test/framework"
)

// An interface naming a binding plugin the KubeVirt CR does not register is
// admitted by virt-api v1.9.0, and then the VM never gets a pod: the VMI
// stays Pending with "couldn't find configuration for network binding".
// kvnet refuses it at once, with the field path. The first half shows what
// happens without kvnet (the VM opted out with kvnet.io/skip), so that the
// second half is a claim about the real KubeVirt, not about an assumption.
func TestUnknownBindingPluginRefusedBeforeKubeVirtStrandsTheVM(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "net1", "", fmt.Sprintf(bridgeConfig, "net1"))
	iface := "\n            - {name: net1, binding: {name: nosuchplugin}}"
	net := "\n        - {name: net1, multus: {networkName: net1}}"

	mustCreateVM(t, ns, vmYAML("stranded", iface, net, `kvnet.io/skip: "true"`))
	vmi := waitVMI(t, ns, "stranded")
	framework.Eventually(t, "virt-controller reports it cannot render the pod", waitTimeout, func() error {
		if conds := vmiConditions(context.Background(), vmi); !strings.Contains(conds, "couldn't find configuration for network binding") {
			return fmt.Errorf("VMI conditions %s", conds)
		}
		return nil
	})
	if pods, err := launcherPods(context.Background(), vmi); err != nil || len(pods) != 0 {
		t.Fatalf("virt-launcher pods of the stranded VMI = %d (%v), want none", len(pods), err)
	}

	_, err := createVM(t, ns, vmYAML("refused", iface, net, ""))
	if !apierrors.IsInvalid(err) {
		t.Fatalf("kvnet admitted a VM whose binding plugin KubeVirt does not know: %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "spec.template.spec.domain.devices.interfaces[1].binding.name") || !strings.Contains(msg, "nosuchplugin") {
		t.Errorf("refusal does not name the field and the plugin: %v", err)
	}
	var vm kubevirtv1.VirtualMachine
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "refused"}, &vm); !apierrors.IsNotFound(err) {
		t.Errorf("refused VM exists: %v", err)
	}
}
