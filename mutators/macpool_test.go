package mutators_test

import (
	"context"
	"strings"
	"testing"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/mutators"
)

// What kvnet records of the interfaces it added, by where kubemacpool's VM
// webhook runs: nothing without it; left to it when it sees them (after
// kvnet, or reinvoked); missed, with a warning, when it ran before and is
// not called again. An interface that has a MAC (here, asked for in
// kvnet.io/networks) is no concern of the pool's.
func TestMACPool(t *testing.T) {
	kmp := func(name string, policy *admissionregv1.ReinvocationPolicyType) admissionregv1.MutatingWebhookConfiguration {
		return admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}, Webhooks: []admissionregv1.MutatingWebhook{{
			Name: peers.KubemacpoolVMWebhook, ReinvocationPolicy: policy,
			Rules: []admissionregv1.RuleWithOperations{{
				Operations: []admissionregv1.OperationType{admissionregv1.Create, admissionregv1.Update},
				Rule:       admissionregv1.Rule{APIGroups: []string{"kubevirt.io"}, APIVersions: []string{"v1"}, Resources: []string{"virtualmachines"}},
			}},
		}}}
	}
	kvnet := admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kvnet"}, Webhooks: []admissionregv1.MutatingWebhook{{Name: peers.KvnetVMWebhook}}}
	vm := `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: web
  annotations:
    kvnet.io/networks: '[{"name":"a","nad":"br"},{"name":"b","nad":"vf","mac":"02:00:00:00:00:0b"}]'
spec:
  template:
    spec:
      domain:
        devices:
          interfaces: [{name: default, masquerade: {}}]
      networks: [{name: default, pod: {}}]
`
	for name, c := range map[string]struct {
		webhooks []admissionregv1.MutatingWebhookConfiguration
		want     []chain.Change
		warned   bool
	}{
		"no kubemacpool": {webhooks: []admissionregv1.MutatingWebhookConfiguration{kvnet}},
		"kubemacpool after kvnet": {webhooks: []admissionregv1.MutatingWebhookConfiguration{kvnet, kmp("zz-kubemacpool", nil)},
			want: []chain.Change{{Mutator: "mac-pool", Networks: []string{"a"}, LeftTo: peers.Kubemacpool}}},
		"kubemacpool first, reinvoked": {webhooks: []admissionregv1.MutatingWebhookConfiguration{kmp("kubemacpool-mutator", ptr.To(admissionregv1.IfNeededReinvocationPolicy)), kvnet},
			want: []chain.Change{{Mutator: "mac-pool", Networks: []string{"a"}, LeftTo: peers.Kubemacpool}}},
		"kubemacpool first, as shipped": {webhooks: []admissionregv1.MutatingWebhookConfiguration{kmp("kubemacpool-mutator", nil), kvnet},
			want: []chain.Change{{Mutator: "mac-pool", Networks: []string{"a"}, MissedBy: peers.Kubemacpool}}, warned: true},
	} {
		t.Run(name, func(t *testing.T) {
			_, req := vmRequest(t, vm, mustConfig(t, ""))
			facts := testFacts()
			facts.Webhooks = c.webhooks
			req.Facts = facts
			for _, m := range []chain.VMMutator{mutators.NetworkInjector{}, mutators.Addresses{}, mutators.MACPool{}} {
				if err := m.Mutate(context.Background(), req); err != nil {
					t.Fatalf("%s: %v", m.Name(), err)
				}
			}
			var got []chain.Change
			for _, ch := range req.Changes {
				if ch.Mutator == "mac-pool" {
					got = append(got, ch)
				}
			}
			if !equalChanges(got, c.want) {
				t.Errorf("mac-pool changes = %+v, want %+v", got, c.want)
			}
			warned := strings.Contains(strings.Join(req.Warnings, "\n"), "get no MAC from kubemacpool")
			if warned != c.warned {
				t.Errorf("warned = %v (%q), want %v", warned, req.Warnings, c.warned)
			}
		})
	}
}

func equalChanges(a, b []chain.Change) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Mutator != b[i].Mutator || a[i].LeftTo != b[i].LeftTo || a[i].MissedBy != b[i].MissedBy || strings.Join(a[i].Networks, ",") != strings.Join(b[i].Networks, ",") {
			return false
		}
	}
	return true
}
