package test

import (
	"context"
	"fmt"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A VM in a namespace a rule selects gets the rule's network, and the API
// server stores the mutated spec with the record of what changed.
func TestRuleInjectsNetworkIntoStoredVM(t *testing.T) {
	ns := newNamespace(t, map[string]string{"kvnet.io/storage-network": "true"})
	createNAD(t, ns, "storage", "", fmt.Sprintf(bridgeConfig, "storage"))
	var vm kubevirtv1.VirtualMachine
	fromYAML(t, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: db}
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        devices:
          interfaces: [{name: default, masquerade: {}}]
        resources: {requests: {memory: 1Gi}}
      networks: [{name: default, pod: {}}]
`, &vm)
	vm.Namespace = ns
	if err := env.Client.Create(context.Background(), &vm); err != nil {
		t.Fatalf("create: %v", err)
	}
	var got kubevirtv1.VirtualMachine
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(&vm), &got); err != nil {
		t.Fatal(err)
	}
	nets := got.Spec.Template.Spec.Networks
	if len(nets) != 2 || nets[1].Name != "storage" || nets[1].Multus == nil || nets[1].Multus.NetworkName != "storage" {
		t.Fatalf("stored networks = %+v, want default + storage", nets)
	}
	ifaces := got.Spec.Template.Spec.Domain.Devices.Interfaces
	if len(ifaces) != 2 || ifaces[1].Name != "storage" || ifaces[1].Bridge == nil {
		t.Fatalf("stored interfaces = %+v, want default + storage(bridge)", ifaces)
	}
	if got.Annotations["kvnet.io/mutations"] == "" {
		t.Fatalf("no kvnet.io/mutations annotation on the stored VM")
	}
}
