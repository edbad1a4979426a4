// Package peers recognises the other admission webhooks a cluster runs on
// the objects kvnet mutates, by what they register: their
// MutatingWebhookConfigurations. kvnet leaves a job to a peer that does it
// (and says so) where doing it too would do it twice; see docs/peers.md.
package peers

import (
	"slices"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// ResourceInjector is network-resources-injector's name in kvnet's metrics,
// logs and kvnet.io/mutations.
const ResourceInjector = "network-resources-injector"

// ResourceInjectorWebhooks are the webhook names network-resources-injector
// registers as it ships (v1.9.0): its installer, which its Deployment runs
// as an init container, names the webhook after its -name prefix
// ("<prefix>-mutating-config.k8s.cni.cncf.io"; the default prefix is
// network-resources-injector), and its static deployments/webhook.yaml
// names it network-resources-injector-config.k8s.io. The webhook, not the
// configuration, is matched: the configuration's name only decides the
// order the API server calls webhooks in, and a cluster may rename it.
var ResourceInjectorWebhooks = []string{
	"network-resources-injector-mutating-config.k8s.cni.cncf.io",
	"network-resources-injector-config.k8s.io",
}

// IPAMExtensions is kubevirt/ipam-extensions' name in kvnet's metrics,
// logs and kvnet.io/mutations.
const IPAMExtensions = "ipam-extensions"

// IPAMExtensionsWebhook is the launcher-pod webhook ipam-extensions
// registers (config/webhook at edb24de), whatever its configuration is
// called; IPAMExtensionsFinalizer the finalizer it puts on the claims it
// creates (pkg/claims).
const (
	IPAMExtensionsWebhook   = "ipam-claims.k8s.cni.cncf.io"
	IPAMExtensionsFinalizer = "kubevirt.io/persistent-ipam"
)

// IPAMExtensionsIn names ("configuration/webhook") the ipam-extensions
// webhook registered for pod CREATE among configs, or "" when there is
// none: with it gone, ipam-extensions is uninstalled (its controllers go
// with it), and nobody else removes its finalizer from the claims it made.
func IPAMExtensionsIn(configs []admissionregv1.MutatingWebhookConfiguration) string {
	for i := range configs {
		for j := range configs[i].Webhooks {
			if wh := &configs[i].Webhooks[j]; wh.Name == IPAMExtensionsWebhook && coversPodCreate(wh.Rules) {
				return configs[i].Name + "/" + wh.Name
			}
		}
	}
	return ""
}

// ResourceInjectorFor names the configuration (and its webhook, as
// "configuration/webhook") of a network-resources-injector that the API
// server calls for the CREATE of a pod with podLabels in a namespace with
// nsLabels, or "" when none does. configs should be sorted by name, so
// that the answer is the one the API server calls first.
//
// A webhook is called for the pod when a rule of it covers pods on CREATE
// and both its namespace and object selectors match, as the API server
// decides. Its matchConditions (CEL) are not evaluated: a configuration
// that has them is taken as calling for every pod its selectors match, the
// shipped one has none.
func ResourceInjectorFor(configs []admissionregv1.MutatingWebhookConfiguration, namespace string, nsLabels, podLabels map[string]string) string {
	ns := labels.Set{corev1.LabelMetadataName: namespace}
	for k, v := range nsLabels {
		ns[k] = v
	}
	for i := range configs {
		for j := range configs[i].Webhooks {
			wh := &configs[i].Webhooks[j]
			if !slices.Contains(ResourceInjectorWebhooks, wh.Name) || !coversPodCreate(wh.Rules) ||
				!selects(wh.NamespaceSelector, ns) || !selects(wh.ObjectSelector, labels.Set(podLabels)) {
				continue
			}
			return configs[i].Name + "/" + wh.Name
		}
	}
	return ""
}

// coversPodCreate reports whether a rule matches core/v1 pods on CREATE.
func coversPodCreate(rules []admissionregv1.RuleWithOperations) bool {
	for _, r := range rules {
		if (slices.Contains(r.Operations, admissionregv1.Create) || slices.Contains(r.Operations, admissionregv1.OperationAll)) &&
			anyOf(r.APIGroups, "") && anyOf(r.APIVersions, "v1") &&
			(slices.Contains(r.Resources, "pods") || slices.Contains(r.Resources, "*") || slices.Contains(r.Resources, "*/*")) {
			return true
		}
	}
	return false
}

func anyOf(values []string, want string) bool {
	return slices.Contains(values, want) || slices.Contains(values, "*")
}

// selects applies a webhook's label selector as the API server does: nil
// or empty matches everything, one it cannot parse matches nothing (the
// API server refuses such a configuration anyway).
func selects(sel *metav1.LabelSelector, set labels.Set) bool {
	if sel == nil {
		return true
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false
	}
	return s.Matches(set)
}
