package validators_test

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/validators"
)

// Beside kubemacpool, a new VM may not ask for a MAC another VM holds
// (written in any case); the refusal names the field, the MAC and the
// holder. Without kubemacpool, on UPDATE, for a holder being deleted and
// for the VM itself, nothing is refused.
func TestMACsHeld(t *testing.T) {
	kmp := admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kubemacpool-mutator"}, Webhooks: []admissionregv1.MutatingWebhook{{
		Name: peers.KubemacpoolVMWebhook,
		Rules: []admissionregv1.RuleWithOperations{{
			Operations: []admissionregv1.OperationType{admissionregv1.Create, admissionregv1.Update},
			Rule:       admissionregv1.Rule{APIGroups: []string{"kubevirt.io"}, APIVersions: []string{"v1"}, Resources: []string{"virtualmachines"}},
		}},
	}}}
	holder := func(ns, name, mac string, deleting bool) kubevirtv1.VirtualMachine {
		vm := kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kubevirtv1.VirtualMachineSpec{
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{},
		}}
		vm.Spec.Template.Spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{{Name: "default"}, {Name: "lan", MacAddress: mac}}
		if deleting {
			vm.DeletionTimestamp = &metav1.Time{}
		}
		return vm
	}
	spec := `
spec:
  domain:
    devices:
      interfaces: [{name: default, masquerade: {}, macAddress: "02:00:00:00:00:0A"}]
  networks: [{name: default, pod: {}}]
`
	for name, c := range map[string]struct {
		pool bool
		op   admissionv1.Operation
		vms  []kubevirtv1.VirtualMachine
		want string
	}{
		"held, beside kubemacpool": {pool: true, op: admissionv1.Create, vms: []kubevirtv1.VirtualMachine{holder("other", "db", "02:00:00:00:00:0a", false)},
			want: "spec.template.spec.domain.devices.interfaces[0].macAddress: Duplicate value: \"MAC 02:00:00:00:00:0A is held by VirtualMachine other/db (interface lan)"},
		"free":                          {pool: true, op: admissionv1.Create, vms: []kubevirtv1.VirtualMachine{holder("other", "db", "02:00:00:00:00:0b", false)}},
		"held, no kubemacpool":          {op: admissionv1.Create, vms: []kubevirtv1.VirtualMachine{holder("other", "db", "02:00:00:00:00:0a", false)}},
		"held, on UPDATE":               {pool: true, op: admissionv1.Update, vms: []kubevirtv1.VirtualMachine{holder("other", "db", "02:00:00:00:00:0a", false)}},
		"held by a VM being deleted":    {pool: true, op: admissionv1.Create, vms: []kubevirtv1.VirtualMachine{holder("other", "db", "02:00:00:00:00:0a", true)}},
		"held by the VM itself (retry)": {pool: true, op: admissionv1.Create, vms: []kubevirtv1.VirtualMachine{holder(ns, "vm1", "02:00:00:00:00:0a", false)}},
	} {
		t.Run(name, func(t *testing.T) {
			req := vmRequest(t, spec, false)
			req.Operation = c.op
			facts := testFacts(nil)
			facts.VMs = c.vms
			if c.pool {
				facts.Webhooks = []admissionregv1.MutatingWebhookConfiguration{kmp}
			}
			req.Facts = facts
			errs, err := validators.MACsHeld{}.Validate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			got := errs.ToAggregate()
			switch {
			case c.want == "" && got != nil:
				t.Errorf("refused: %v", got)
			case c.want != "" && (got == nil || !strings.HasPrefix(got.Error(), c.want)):
				t.Errorf("got %v, want %s...", got, c.want)
			}
		})
	}
}
