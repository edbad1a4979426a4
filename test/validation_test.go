package test

import (
	"context"
	"fmt"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
)

// Each class of mistake comes back as a 422 whose cause names the field.
func TestValidationErrors(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "blue", "", fmt.Sprintf(bridgeConfig, "blue"))
	env.CreateNAD(t, ns, "vf", "intel.com/sriov_a", `{"cniVersion":"0.4.0","name":"vf","type":"sriov"}`)
	env.CreateNAD(t, ns, "broken", "", `{"cniVersion": "0.4.0", "name": `)
	vm := func(name, ifaces, nets string) string {
		return fmt.Sprintf(`
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: %s}
spec:
  template:
    spec:
      domain:
        devices:
          interfaces: %s
        resources: {requests: {memory: 1Gi}}
      networks: %s
`, name, ifaces, nets)
	}
	cases := []struct {
		name, ifaces, nets, field, msg string
	}{
		{"missing-nad", `[{name: a, bridge: {}}]`, `[{name: a, multus: {networkName: nope}}]`,
			"spec.template.spec.networks[0].multus.networkName", "Not found"},
		{"bad-ref", `[{name: a, bridge: {}}]`, `[{name: a, multus: {networkName: "a/b/c"}}]`,
			"spec.template.spec.networks[0].multus.networkName", "namespace/name"},
		{"unparsable-config", `[{name: a, bridge: {}}]`, `[{name: a, multus: {networkName: broken}}]`,
			"spec.template.spec.networks[0].multus.networkName", "spec.config is not valid JSON"},
		{"interface-without-network", `[{name: a, bridge: {}}, {name: b, bridge: {}}]`, `[{name: a, multus: {networkName: blue}}]`,
			"spec.template.spec.domain.devices.interfaces[1].name", "no network"},
		{"network-without-interface", `[{name: a, bridge: {}}]`, `[{name: a, multus: {networkName: blue}}, {name: b, multus: {networkName: blue}}]`,
			"spec.template.spec.domain.devices.interfaces", "network b"},
		{"sriov-on-bridge-nad", `[{name: a, sriov: {}}]`, `[{name: a, multus: {networkName: blue}}]`,
			"spec.template.spec.domain.devices.interfaces[0].sriov", "not an SR-IOV network"},
		{"bridge-on-sriov-nad", `[{name: a, bridge: {}}]`, `[{name: a, multus: {networkName: vf}}]`,
			"spec.template.spec.domain.devices.interfaces[0]", "use sriov"},
		{"masquerade-on-multus", `[{name: a, masquerade: {}}]`, `[{name: a, multus: {networkName: blue}}]`,
			"spec.template.spec.domain.devices.interfaces[0].masquerade", "only on the pod network"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := createVM(t, env.Client, ns, vm(tc.name, tc.ifaces, tc.nets))
			hasCause(t, err, tc.field, tc.msg)
		})
	}
}

// On UPDATE an error the stored VM already had does not block the edit:
// the NAD of a running VM was deleted, and the owner can still relabel it.
func TestUpdateRatchetsExistingErrors(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	nad := env.CreateNAD(t, ns, "blue", "", fmt.Sprintf(bridgeConfig, "blue"))
	if _, err := createVM(t, env.Client, ns, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: app}
spec:
  template:
    spec:
      domain:
        devices:
          interfaces: [{name: a, bridge: {}}]
        resources: {requests: {memory: 1Gi}}
      networks: [{name: a, multus: {networkName: blue}}]
`); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(context.Background(), nad); err != nil {
		t.Fatal(err)
	}
	waitGone(t, nad)
	vm := getVM(t, ns, "app")
	vm.Labels = map[string]string{"edited": "yes"}
	if err := env.Client.Update(context.Background(), vm); err != nil {
		t.Fatalf("an unrelated edit was blocked by the pre-existing missing NAD: %v", err)
	}
	// A new mistake in the same update is still refused.
	vm = getVM(t, ns, "app")
	vm.Spec.Template.Spec.Networks = append(vm.Spec.Template.Spec.Networks, kubevirtv1.Network{
		Name: "b", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "also-missing"}},
	})
	vm.Spec.Template.Spec.Domain.Devices.Interfaces = append(vm.Spec.Template.Spec.Domain.Devices.Interfaces,
		kubevirtv1.Interface{Name: "b", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}}})
	err := env.Client.Update(context.Background(), vm)
	hasCause(t, err, "spec.template.spec.networks[1].multus.networkName", "Not found")
}

// A terminating VM whose finalizer is being removed is never refused, even
// when it would no longer validate: otherwise it stays Terminating forever.
func TestTerminatingVMNotBlocked(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	nad := env.CreateNAD(t, ns, "blue", "", fmt.Sprintf(bridgeConfig, "blue"))
	vm, err := createVM(t, env.Client, ns, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: app, finalizers: [kubevirt.io/virtualMachineControllerFinalize]}
spec:
  template:
    spec:
      domain:
        devices:
          interfaces: [{name: a, bridge: {}}]
        resources: {requests: {memory: 1Gi}}
      networks: [{name: a, multus: {networkName: blue}}]
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(context.Background(), nad); err != nil {
		t.Fatal(err)
	}
	waitGone(t, nad)
	if err := env.Client.Delete(context.Background(), vm); err != nil {
		t.Fatal(err)
	}
	// virt-controller's finalizer removal, with a new mistake in the same
	// write to prove validation is not consulted for a terminating object.
	vm = getVM(t, ns, "app")
	vm.Finalizers = nil
	vm.Spec.Template.Spec.Networks[0].Multus.NetworkName = "still-missing"
	if err := env.Client.Update(context.Background(), vm); err != nil {
		t.Fatalf("finalizer removal of a terminating VM was refused: %v", err)
	}
}
