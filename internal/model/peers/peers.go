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

// Kubemacpool is k8snetworkplumbingwg/kubemacpool's name in kvnet's
// metrics, logs and kvnet.io/mutations.
const Kubemacpool = "kubemacpool"

// KubemacpoolVMWebhook is the VM webhook kubemacpool registers (its
// config/release at v0.51.1): on VM CREATE it gives every interface on
// the pod network (masquerade) or a Multus network that has no macAddress
// one from its pool, and records those that have one as taken; on UPDATE
// it does the same for interfaces the VM did not have before.
const KubemacpoolVMWebhook = "mutatevirtualmachines.kubemacpool.io"

// KvnetVMWebhook is the name of kvnet's own VM mutating webhook
// (webhook.Registration and the chart), by which kvnet finds where the API
// server calls it among the other webhooks.
const KvnetVMWebhook = "virtualmachines.mutate.kvnet.io"

// MACPool is a MAC pool's VM webhook as the API server calls it for one
// namespace, relative to kvnet's own.
type MACPool struct {
	// Webhook names it, "configuration/webhook"; "" when none is
	// registered for the namespace.
	Webhook string
	// Before: the API server calls it before kvnet's VM webhook (its
	// configuration's name sorts first), or kvnet's is not found.
	Before bool
	// Reinvoked: its reinvocationPolicy is IfNeeded, so the API server
	// calls it again after kvnet changed the VM.
	Reinvoked bool
	// Hook is the webhook as registered (its address, CA bundle, timeout
	// and failure policy), for kvnet to call it where the API server does
	// not after kvnet (AskedByKvnet).
	Hook *admissionregv1.MutatingWebhook
}

// SeesKvnetInterfaces reports whether the pool sees the interfaces kvnet
// adds to a VM: it is called after kvnet, or again after kvnet changed the
// VM. When not, the interfaces kvnet adds get no MAC from it.
func (p MACPool) SeesKvnetInterfaces() bool { return p.Webhook != "" && (!p.Before || p.Reinvoked) }

// FailsClosed reports whether the API server refuses an object when the
// pool's webhook cannot be called (failurePolicy Fail, its default).
func (p MACPool) FailsClosed() bool {
	return p.Hook == nil || p.Hook.FailurePolicy == nil || *p.Hook.FailurePolicy == admissionregv1.Fail
}

// KubemacpoolFor is kubemacpool's VM webhook as the API server calls it
// for a VM in a namespace with nsLabels (the zero MACPool when none is).
// configs must be sorted by name, as the API server calls them.
func KubemacpoolFor(configs []admissionregv1.MutatingWebhookConfiguration, namespace string, nsLabels map[string]string) MACPool {
	ns := labels.Set{corev1.LabelMetadataName: namespace}
	for k, v := range nsLabels {
		ns[k] = v
	}
	var pool MACPool
	kvnetSeen := false
	for i := range configs {
		for j := range configs[i].Webhooks {
			wh := &configs[i].Webhooks[j]
			switch {
			case wh.Name == KvnetVMWebhook:
				kvnetSeen = true
			case pool.Webhook == "" && wh.Name == KubemacpoolVMWebhook && coversVMCreate(wh.Rules) && selects(wh.NamespaceSelector, ns):
				pool = MACPool{
					Webhook:   configs[i].Name + "/" + wh.Name,
					Before:    !kvnetSeen,
					Reinvoked: wh.ReinvocationPolicy != nil && *wh.ReinvocationPolicy == admissionregv1.IfNeededReinvocationPolicy,
					Hook:      wh,
				}
			}
		}
	}
	return pool
}

// coversVMCreate reports whether a rule matches kubevirt.io/v1
// virtualmachines on CREATE.
func coversVMCreate(rules []admissionregv1.RuleWithOperations) bool {
	for _, r := range rules {
		if (slices.Contains(r.Operations, admissionregv1.Create) || slices.Contains(r.Operations, admissionregv1.OperationAll)) &&
			anyOf(r.APIGroups, "kubevirt.io") && anyOf(r.APIVersions, "v1") &&
			(slices.Contains(r.Resources, "virtualmachines") || slices.Contains(r.Resources, "*") || slices.Contains(r.Resources, "*/*")) {
			return true
		}
	}
	return false
}
