package peers

import (
	"strings"
	"testing"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func rule(ops []admissionregv1.OperationType, groups, versions, resources []string) admissionregv1.RuleWithOperations {
	return admissionregv1.RuleWithOperations{Operations: ops, Rule: admissionregv1.Rule{APIGroups: groups, APIVersions: versions, Resources: resources}}
}

// A webhook is the injector's for a pod when the API server would call it
// for the pod's CREATE: its name, a rule covering core/v1 pods on CREATE
// (wildcards included; deployments/webhook.yaml lists the "apps" group
// too), and both selectors.
func TestResourceInjectorFor(t *testing.T) {
	create := []admissionregv1.OperationType{admissionregv1.Create}
	name := ResourceInjectorWebhooks[0]
	inKubeSystem := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{"kube-system"}}}}
	for desc, c := range map[string]struct {
		wh   admissionregv1.MutatingWebhook
		want bool
	}{
		"installer's":           {wh: admissionregv1.MutatingWebhook{Name: name, Rules: []admissionregv1.RuleWithOperations{rule(create, []string{""}, []string{"v1"}, []string{"pods"})}}, want: true},
		"static, apps and core": {wh: admissionregv1.MutatingWebhook{Name: ResourceInjectorWebhooks[1], Rules: []admissionregv1.RuleWithOperations{rule(create, []string{"apps", ""}, []string{"v1"}, []string{"pods"})}}, want: true},
		"wildcards":             {wh: admissionregv1.MutatingWebhook{Name: name, Rules: []admissionregv1.RuleWithOperations{rule([]admissionregv1.OperationType{admissionregv1.OperationAll}, []string{"*"}, []string{"*"}, []string{"*"})}}, want: true},
		"subresource only":      {wh: admissionregv1.MutatingWebhook{Name: name, Rules: []admissionregv1.RuleWithOperations{rule(create, []string{""}, []string{"v1"}, []string{"pods/status"})}}},
		"apps group only":       {wh: admissionregv1.MutatingWebhook{Name: name, Rules: []admissionregv1.RuleWithOperations{rule(create, []string{"apps"}, []string{"v1"}, []string{"pods"})}}},
		"another webhook":       {wh: admissionregv1.MutatingWebhook{Name: "pods.example.com", Rules: []admissionregv1.RuleWithOperations{rule(create, []string{""}, []string{"v1"}, []string{"pods"})}}},
		"namespace not selected (by its name label, which the API server sets)": {wh: admissionregv1.MutatingWebhook{Name: name, NamespaceSelector: inKubeSystem, Rules: []admissionregv1.RuleWithOperations{rule(create, []string{""}, []string{"v1"}, []string{"pods"})}}},
	} {
		t.Run(desc, func(t *testing.T) {
			configs := []admissionregv1.MutatingWebhookConfiguration{{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Webhooks: []admissionregv1.MutatingWebhook{c.wh}}}
			got := ResourceInjectorFor(configs, "tenant", nil, nil)
			if want := map[bool]string{true: "c/" + c.wh.Name, false: ""}[c.want]; got != want {
				t.Errorf("ResourceInjectorFor = %q, want %q", got, want)
			}
		})
	}
}

// ipam-extensions is known by its webhook's name, in a configuration of
// any name, when the webhook covers pod CREATE.
func TestIPAMExtensionsIn(t *testing.T) {
	podCreate := []admissionregv1.RuleWithOperations{rule([]admissionregv1.OperationType{admissionregv1.Create, admissionregv1.Update}, []string{""}, []string{"v1"}, []string{"pods"})}
	for name, c := range map[string]struct {
		configs []admissionregv1.MutatingWebhookConfiguration
		want    string
	}{
		"none": {},
		"as config/default renders it": {configs: []admissionregv1.MutatingWebhookConfiguration{
			{ObjectMeta: metav1.ObjectMeta{Name: "kubevirt-ipam-controller-mutating-webhook-configuration"}, Webhooks: []admissionregv1.MutatingWebhook{{Name: IPAMExtensionsWebhook, Rules: podCreate}}},
		}, want: "kubevirt-ipam-controller-mutating-webhook-configuration/" + IPAMExtensionsWebhook},
		"renamed configuration, after another": {configs: []admissionregv1.MutatingWebhookConfiguration{
			{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Webhooks: []admissionregv1.MutatingWebhook{{Name: "other.example.com", Rules: podCreate}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "zz-ipam"}, Webhooks: []admissionregv1.MutatingWebhook{{Name: IPAMExtensionsWebhook, Rules: podCreate}}},
		}, want: "zz-ipam/" + IPAMExtensionsWebhook},
		"the name on another kind": {configs: []admissionregv1.MutatingWebhookConfiguration{
			{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Webhooks: []admissionregv1.MutatingWebhook{{Name: IPAMExtensionsWebhook,
				Rules: []admissionregv1.RuleWithOperations{rule([]admissionregv1.OperationType{admissionregv1.Create}, []string{"apps"}, []string{"v1"}, []string{"deployments"})}}}},
		}},
	} {
		if got := IPAMExtensionsIn(c.configs); got != c.want {
			t.Errorf("%s: got %q, want %q", name, got, c.want)
		}
	}
}

// kubemacpool's VM webhook is found by name, for a namespace its selector
// takes (it ships opt-out: a namespace labelled ignore is not), placed
// before or after kvnet's own VM webhook as the API server orders them,
// with whether it is called again after kvnet changed the VM.
func TestKubemacpoolFor(t *testing.T) {
	vmCreate := []admissionregv1.RuleWithOperations{rule([]admissionregv1.OperationType{admissionregv1.Create, admissionregv1.Update}, []string{"kubevirt.io"}, []string{"v1"}, []string{"virtualmachines"})}
	optOut := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: KubemacpoolVMWebhook, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"ignore"}}}}
	kmp := func(name string, policy *admissionregv1.ReinvocationPolicyType) admissionregv1.MutatingWebhookConfiguration {
		return admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}, Webhooks: []admissionregv1.MutatingWebhook{
			{Name: "mutatepods.kubemacpool.io", Rules: []admissionregv1.RuleWithOperations{rule([]admissionregv1.OperationType{admissionregv1.Create}, []string{""}, []string{"v1"}, []string{"pods"})}},
			{Name: KubemacpoolVMWebhook, Rules: vmCreate, NamespaceSelector: optOut, ReinvocationPolicy: policy},
		}}
	}
	kvnet := admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kvnet"}, Webhooks: []admissionregv1.MutatingWebhook{{Name: KvnetVMWebhook, Rules: vmCreate}}}
	ifNeeded := admissionregv1.IfNeededReinvocationPolicy
	for name, c := range map[string]struct {
		configs  []admissionregv1.MutatingWebhookConfiguration
		nsLabels map[string]string
		want     MACPool
		sees     bool
	}{
		"none":                               {configs: []admissionregv1.MutatingWebhookConfiguration{kvnet}},
		"as shipped: its name sorts first":   {configs: []admissionregv1.MutatingWebhookConfiguration{kmp("kubemacpool-mutator", nil), kvnet}, want: MACPool{Webhook: "kubemacpool-mutator/" + KubemacpoolVMWebhook, Before: true}},
		"first, reinvoked":                   {configs: []admissionregv1.MutatingWebhookConfiguration{kmp("kubemacpool-mutator", &ifNeeded), kvnet}, want: MACPool{Webhook: "kubemacpool-mutator/" + KubemacpoolVMWebhook, Before: true, Reinvoked: true}, sees: true},
		"after kvnet":                        {configs: []admissionregv1.MutatingWebhookConfiguration{kvnet, kmp("zz-kubemacpool", nil)}, want: MACPool{Webhook: "zz-kubemacpool/" + KubemacpoolVMWebhook}, sees: true},
		"kvnet's webhook not found: assumed": {configs: []admissionregv1.MutatingWebhookConfiguration{kmp("kubemacpool-mutator", nil)}, want: MACPool{Webhook: "kubemacpool-mutator/" + KubemacpoolVMWebhook, Before: true}},
		"namespace opted out":                {configs: []admissionregv1.MutatingWebhookConfiguration{kmp("kubemacpool-mutator", nil), kvnet}, nsLabels: map[string]string{KubemacpoolVMWebhook: "ignore"}},
	} {
		t.Run(name, func(t *testing.T) {
			got := KubemacpoolFor(c.configs, "tenant", c.nsLabels)
			if (got.Webhook != "") != (got.Hook != nil) || got.Hook != nil && got.Webhook != got.Webhook[:strings.IndexByte(got.Webhook, '/')+1]+got.Hook.Name {
				t.Errorf("KubemacpoolFor = %+v: its Hook is not the webhook it names", got)
			}
			got.Hook = nil
			if got != c.want {
				t.Errorf("KubemacpoolFor = %+v, want %+v", got, c.want)
			}
			if got.SeesKvnetInterfaces() != c.sees {
				t.Errorf("SeesKvnetInterfaces = %v, want %v", got.SeesKvnetInterfaces(), c.sees)
			}
		})
	}
}
