// Package chaintest builds the chain requests the webhook builds, from
// YAML, for the mutators' and validators' unit tests.
package chaintest

import (
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/internal/chain"
)

// VM is the chain request for vmYAML (a VirtualMachine; namespace when it
// names none), a CREATE, and the VM it aliases.
func VM(t testing.TB, vmYAML, namespace string) (*kubevirtv1.VirtualMachine, *chain.Request) {
	t.Helper()
	var vm kubevirtv1.VirtualMachine
	if err := yaml.UnmarshalStrict([]byte(vmYAML), &vm); err != nil {
		t.Fatalf("test VM: %v", err)
	}
	if vm.Namespace == "" {
		vm.Namespace = namespace
	}
	req := chain.ForVM(&vm)
	req.Operation = "CREATE"
	return &vm, req
}

// Template is the chain request for a VM named vm1 in namespace whose
// template is specYAML or, with vmi, for a standalone VMI of that spec: a
// CREATE.
func Template(t testing.TB, specYAML, namespace string, vmi bool) *chain.Request {
	t.Helper()
	var tmpl kubevirtv1.VirtualMachineInstanceTemplateSpec
	if err := yaml.UnmarshalStrict([]byte(specYAML), &tmpl); err != nil {
		t.Fatalf("test spec: %v", err)
	}
	var req *chain.Request
	if vmi {
		req = chain.ForVMI(&kubevirtv1.VirtualMachineInstance{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec})
	} else {
		req = chain.ForVM(&kubevirtv1.VirtualMachine{Spec: kubevirtv1.VirtualMachineSpec{Template: &tmpl}})
	}
	req.Meta.Name, req.Meta.Namespace, req.Name, req.Namespace = "vm1", namespace, "vm1", namespace
	req.Operation = "CREATE"
	return req
}
