package test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/requested"
)

const plainVM = `
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
`

// A VM in a namespace a rule selects gets the rule's network, and the API
// server stores the mutated spec with the record of what changed.
func TestRuleInjectsNetworkIntoStoredVM(t *testing.T) {
	ns := env.NewNamespace(t, map[string]string{"kvnet.io/storage-network": "true"})
	env.CreateNAD(t, ns, "storage", "", fmt.Sprintf(bridgeConfig, "storage"))
	if _, err := createVM(t, env.Client, ns, plainVM); err != nil {
		t.Fatalf("create: %v", err)
	}
	got := getVM(t, ns, "db")
	nets := got.Spec.Template.Spec.Networks
	if len(nets) != 2 || nets[1].Name != "storage" || nets[1].Multus == nil || nets[1].Multus.NetworkName != "storage" {
		t.Fatalf("stored networks = %+v, want default + storage", nets)
	}
	ifaces := got.Spec.Template.Spec.Domain.Devices.Interfaces
	if len(ifaces) != 2 || ifaces[1].Name != "storage" || ifaces[1].Bridge == nil {
		t.Fatalf("stored interfaces = %+v, want default + storage(bridge)", ifaces)
	}
	var record []chain.Change
	if err := json.Unmarshal([]byte(got.Annotations[chain.MutationsAnnotation]), &record); err != nil {
		t.Fatalf("kvnet.io/mutations: %v", err)
	}
	if len(record) != 1 || record[0].Mutator != "networks" || record[0].Rule != "storage" || record[0].Networks[0] != "storage" {
		t.Fatalf("kvnet.io/mutations = %+v", record)
	}
}

// A namespace the rule does not select is left alone; so is an opted-out VM.
func TestNoInjectionOutsideRuleOrWhenSkipped(t *testing.T) {
	plain := env.NewNamespace(t, nil)
	if _, err := createVM(t, env.Client, plain, plainVM); err != nil {
		t.Fatal(err)
	}
	if n := len(getVM(t, plain, "db").Spec.Template.Spec.Networks); n != 1 {
		t.Fatalf("unselected namespace: %d networks, want 1", n)
	}
	selected := env.NewNamespace(t, map[string]string{"kvnet.io/storage-network": "true"})
	env.CreateNAD(t, selected, "storage", "", fmt.Sprintf(bridgeConfig, "storage"))
	vm, err := createVM(t, env.Client, selected, plainVM)
	_ = vm
	if err != nil {
		t.Fatal(err)
	}
	skipped := plainVM + "" // same VM, other name, opted out
	var v kubevirtv1.VirtualMachine
	fromYAML(t, skipped, &v)
	v.Name, v.Namespace = "legacy", selected
	v.Annotations = map[string]string{chain.SkipAnnotation: "true"}
	if err := env.Client.Create(context.Background(), &v); err != nil {
		t.Fatal(err)
	}
	got := getVM(t, selected, "legacy")
	if n := len(got.Spec.Template.Spec.Networks); n != 1 || got.Annotations[chain.MutationsAnnotation] != "" {
		t.Fatalf("opted-out VM was changed: %d networks, annotations %v", n, got.Annotations)
	}
}

// The annotation asks for networks in Multus short form; a network the user
// declared (same name, or the same NAD under another name) is not touched.
func TestAnnotationRequestsAndUserNetworksWin(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "blue", "", fmt.Sprintf(bridgeConfig, "blue"))
	env.CreateNAD(t, ns, "red", "", fmt.Sprintf(bridgeConfig, "red"))
	env.CreateNAD(t, ns, "sriov-a", "intel.com/sriov_a", `{"cniVersion":"0.4.0","name":"sriov-a","type":"sriov"}`)
	_, err := createVM(t, env.Client, ns, fmt.Sprintf(`
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: app
  annotations:
    kvnet.io/networks: "%[1]s/blue@blue, red@mine, sriov-a"
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        devices:
          interfaces: [{name: mine, bridge: {}}]
        resources: {requests: {memory: 1Gi}}
      networks: [{name: mine, multus: {networkName: red}}]
`, ns))
	if err != nil {
		t.Fatal(err)
	}
	spec := getVM(t, ns, "app").Spec.Template.Spec
	want := map[string]string{"mine": "red", "blue": ns + "/blue", "sriov-a": "sriov-a"}
	if len(spec.Networks) != len(want) {
		t.Fatalf("networks = %+v, want %v", spec.Networks, want)
	}
	for _, n := range spec.Networks {
		if n.Multus == nil || want[n.Name] != n.Multus.NetworkName {
			t.Fatalf("network %s = %+v, want NAD %s", n.Name, n.Multus, want[n.Name])
		}
	}
	for _, i := range spec.Domain.Devices.Interfaces {
		if i.Name == "sriov-a" && i.SRIOV == nil {
			t.Fatalf("SR-IOV NAD got binding %+v, want sriov", i.InterfaceBindingMethod)
		}
		if i.Name == "blue" && i.Bridge == nil {
			t.Fatalf("bridge NAD got binding %+v", i.InterfaceBindingMethod)
		}
	}
}

// A malformed annotation is the user's mistake: a 422 naming the annotation.
func TestMalformedAnnotationIsRefusedWithFieldPath(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	var vm kubevirtv1.VirtualMachine
	fromYAML(t, plainVM, &vm)
	vm.Namespace = ns
	vm.Annotations = map[string]string{requested.Annotation: "a/b/c@"}
	err := env.Client.Create(context.Background(), &vm)
	hasCause(t, err, "metadata.annotations[kvnet.io/networks]", "item 0")
}

// Labels changed on UPDATE make a rule match: the network is added then.
func TestInjectionOnUpdate(t *testing.T) {
	ns := env.NewNamespace(t, map[string]string{"kvnet.io/storage-network": "true"})
	env.CreateNAD(t, ns, "storage", "", fmt.Sprintf(bridgeConfig, "storage"))
	restore, err := env.SetConfig(`
networkRules:
  - name: gold
    vmSelector: {matchLabels: {tier: gold}}
    networks: [{name: storage, nad: storage}]
`)
	if err != nil {
		t.Fatal(err)
	}
	defer restore()
	if _, err := createVM(t, env.Client, ns, plainVM); err != nil {
		t.Fatal(err)
	}
	vm := getVM(t, ns, "db")
	if len(vm.Spec.Template.Spec.Networks) != 1 {
		t.Fatalf("VM without the label got networks: %+v", vm.Spec.Template.Spec.Networks)
	}
	vm.Labels = map[string]string{"tier": "gold"}
	if err := env.Client.Update(context.Background(), vm); err != nil {
		t.Fatal(err)
	}
	if nets := getVM(t, ns, "db").Spec.Template.Spec.Networks; len(nets) != 2 || nets[1].Name != "storage" {
		t.Fatalf("after relabelling: %+v", nets)
	}
}

// A standalone VMI is mutated on CREATE; a VMI a VM owns is not mutated again.
func TestStandaloneVMIMutatedOwnedVMIUntouched(t *testing.T) {
	ns := env.NewNamespace(t, map[string]string{"kvnet.io/storage-network": "true"})
	env.CreateNAD(t, ns, "storage", "", fmt.Sprintf(bridgeConfig, "storage"))
	vmiYAML := `
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: %s}
spec:
  domain:
    devices: {}
    resources: {requests: {memory: 1Gi}}
`
	var standalone kubevirtv1.VirtualMachineInstance
	fromYAML(t, fmt.Sprintf(vmiYAML, "lonely"), &standalone)
	standalone.Namespace = ns
	if err := env.Client.Create(context.Background(), &standalone); err != nil {
		t.Fatal(err)
	}
	var got kubevirtv1.VirtualMachineInstance
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(&standalone), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Networks) != 2 || got.Spec.Networks[0].Pod == nil || got.Spec.Networks[1].Name != "storage" {
		t.Fatalf("standalone VMI networks = %+v, want the implicit pod network written out, then storage", got.Spec.Networks)
	}

	var owned kubevirtv1.VirtualMachineInstance
	fromYAML(t, fmt.Sprintf(vmiYAML, "owned"), &owned)
	owned.Namespace = ns
	owned.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "owned", UID: "4f3c1c4e-1111-4d8e-9a7e-000000000001",
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
	if err := env.Client.Create(context.Background(), &owned); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(&owned), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Networks) != 0 {
		t.Fatalf("VM-owned VMI was mutated: %+v", got.Spec.Networks)
	}
}
