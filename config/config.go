// Package config holds kvnet's policy: which networks VMs get, how NADs map to
// interface bindings, and the knobs of each capability. It is one YAML file,
// mounted from a ConfigMap and reloaded on change, so that an admin changes
// policy without restarting the webhook.
package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Binding names accepted in network rules. Any other value names a KubeVirt
// network binding plugin declared in the KubeVirt CR.
const (
	BindingAuto   = "auto"
	BindingBridge = "bridge"
	BindingSRIOV  = "sriov"
)

// Config is the whole policy file. The zero value is usable: Default fills in
// what an empty file means.
type Config struct {
	// ExcludedNamespaces are never touched by any kvnet mutator or validator.
	ExcludedNamespaces []string `json:"excludedNamespaces,omitempty"`
	// NetworkRules add Multus secondary networks to matching VMs.
	NetworkRules []NetworkRule `json:"networkRules,omitempty"`
	// SRIOV says which NAD resource names are SR-IOV virtual functions.
	SRIOV SRIOV `json:"sriov,omitempty"`
	// VDPA says which NAD resource names are vDPA devices and how they bind.
	VDPA VDPA `json:"vdpa,omitempty"`
	// KubeOVN tunes the kube-ovn attachment annotations.
	KubeOVN KubeOVN `json:"kubeOVN,omitempty"`
	// PersistentIPs turns IPAMClaim management on or off.
	PersistentIPs PersistentIPs `json:"persistentIPs,omitempty"`
	// Migration configures the migration networks of virt-handler and the
	// synchronization controllers.
	Migration Migration `json:"migration,omitempty"`
}

// NetworkRule adds networks to every VM whose namespace and labels match.
type NetworkRule struct {
	// Name identifies the rule in the kvnet.io/mutations annotation and in logs.
	Name string `json:"name"`
	// NamespaceSelector matches the labels of the VM's namespace; empty matches all.
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// VMSelector matches the VM's own labels (a standalone VMI's labels); empty matches all.
	VMSelector *metav1.LabelSelector `json:"vmSelector,omitempty"`
	// Networks are added in order, unless the VM already has them.
	Networks []Network `json:"networks"`

	// Selectors compiled once per config load, not once per request.
	nsSel, vmSel labels.Selector
}

// Matches reports whether the rule applies to a VM with these labels in a
// namespace with these labels.
func (r *NetworkRule) Matches(namespaceLabels, vmLabels map[string]string) bool {
	return matches(r.nsSel, r.NamespaceSelector, namespaceLabels) && matches(r.vmSel, r.VMSelector, vmLabels)
}

// NeedsNamespaceLabels reports whether matching reads the namespace's labels.
func (r *NetworkRule) NeedsNamespaceLabels() bool { return r.NamespaceSelector != nil }

func matches(compiled labels.Selector, s *metav1.LabelSelector, set map[string]string) bool {
	if s == nil {
		return true
	}
	if compiled == nil {
		var err error
		if compiled, err = metav1.LabelSelectorAsSelector(s); err != nil {
			return false // Validate rejects such selectors before they get here.
		}
	}
	return compiled.Matches(labels.Set(set))
}

// Network is one secondary network to attach.
type Network struct {
	// Name is the VMI network and interface name.
	Name string `json:"name"`
	// NAD references the NetworkAttachmentDefinition, "ns/name" or "name"
	// (the VM's namespace).
	NAD string `json:"nad"`
	// Binding is auto, bridge, sriov or a binding plugin name; default auto.
	Binding string `json:"binding,omitempty"`
	// DefaultRoute asks for the default route on this attachment (kube-ovn).
	DefaultRoute bool `json:"defaultRoute,omitempty"`
}

// SRIOV lists resource-name prefixes of SR-IOV device plugins.
type SRIOV struct {
	ResourcePrefixes []string `json:"resourcePrefixes,omitempty"`
}

// VDPA lists resource-name prefixes of vDPA device plugins and the KubeVirt
// binding plugin that attaches them.
type VDPA struct {
	ResourcePrefixes []string `json:"resourcePrefixes,omitempty"`
	// BindingPlugin is the name of the plugin in the KubeVirt CR; default "vdpa".
	BindingPlugin string `json:"bindingPlugin,omitempty"`
}

// KubeOVN configures kube-ovn attachment annotations.
type KubeOVN struct {
	// LegacyLiveMigration sets <provider>.kubernetes.io/allow_live_migration,
	// which kube-ovn up to v1.12 needs to keep the IP during live migration.
	LegacyLiveMigration bool `json:"legacyLiveMigration,omitempty"`
}

// PersistentIPs configures IPAMClaim management.
type PersistentIPs struct {
	// Enabled defaults to true.
	Enabled *bool `json:"enabled,omitempty"`
}

// Migration is filled in by the migration-network capability.
type Migration struct {
	InCluster    *InClusterMigration    `json:"inCluster,omitempty"`
	CrossCluster *CrossClusterMigration `json:"crossCluster,omitempty"`
}

// InClusterMigration gives each virt-handler pod a static address on the
// in-cluster migration network.
type InClusterMigration struct {
	NAD         string                `json:"nad"`
	Interface   string                `json:"interface,omitempty"`
	Pool        Pool                  `json:"pool"`
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
}

// CrossClusterMigration gives the few pods that talk across clusters an address
// from a short explicit list.
type CrossClusterMigration struct {
	NAD           string                `json:"nad"`
	Interface     string                `json:"interface,omitempty"`
	Addresses     []string              `json:"addresses"`
	PodSelector   *metav1.LabelSelector `json:"podSelector,omitempty"`
	AlsoInCluster bool                  `json:"alsoInCluster,omitempty"`
}

// Pool is a CIDR with optional ranges to use and addresses to skip.
type Pool struct {
	CIDR    string   `json:"cidr"`
	Ranges  []string `json:"ranges,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
}

// Defaults used when the file leaves a field out.
var (
	DefaultExcludedNamespaces = []string{"kube-system"}
	DefaultSRIOVPrefixes      = []string{"intel.com/", "nvidia.com/", "mellanox.com/", "openshift.io/"}
	DefaultVDPAPrefixes       = []string{"jaguarmicro.com/", "nvidia.com/vdpa", "intel.com/vdpa", "mellanox.com/vdpa"}
)

// DefaultVDPAPlugin is the binding plugin name used when vdpa.bindingPlugin is unset.
const DefaultVDPAPlugin = "vdpa"

// Default returns a copy of c with every unset field given its default.
// ownNamespace (kvnet's namespace) is always excluded.
func (c Config) Default(ownNamespace string) Config {
	if c.ExcludedNamespaces == nil {
		c.ExcludedNamespaces = append([]string(nil), DefaultExcludedNamespaces...)
	}
	if ownNamespace != "" && !contains(c.ExcludedNamespaces, ownNamespace) {
		c.ExcludedNamespaces = append(append([]string(nil), c.ExcludedNamespaces...), ownNamespace)
	}
	if c.SRIOV.ResourcePrefixes == nil {
		c.SRIOV.ResourcePrefixes = DefaultSRIOVPrefixes
	}
	if c.VDPA.ResourcePrefixes == nil {
		c.VDPA.ResourcePrefixes = DefaultVDPAPrefixes
	}
	if c.VDPA.BindingPlugin == "" {
		c.VDPA.BindingPlugin = DefaultVDPAPlugin
	}
	rules := make([]NetworkRule, len(c.NetworkRules))
	for i, r := range c.NetworkRules {
		nets := make([]Network, len(r.Networks))
		for j, n := range r.Networks {
			if n.Binding == "" {
				n.Binding = BindingAuto
			}
			nets[j] = n
		}
		r.Networks = nets
		if r.NamespaceSelector != nil {
			r.nsSel, _ = metav1.LabelSelectorAsSelector(r.NamespaceSelector)
		}
		if r.VMSelector != nil {
			r.vmSel, _ = metav1.LabelSelectorAsSelector(r.VMSelector)
		}
		rules[i] = r
	}
	c.NetworkRules = rules
	return c
}

// PersistentIPsEnabled reports whether kvnet manages IPAMClaims.
func (c *Config) PersistentIPsEnabled() bool {
	return c.PersistentIPs.Enabled == nil || *c.PersistentIPs.Enabled
}

// Excluded reports whether kvnet must leave the namespace alone.
func (c *Config) Excluded(namespace string) bool {
	return contains(c.ExcludedNamespaces, namespace)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
