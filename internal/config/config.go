// Package config holds kvnet's policy: which networks VMs get, how NADs map to
// interface bindings, and the knobs of each capability. It is one YAML file,
// mounted from a ConfigMap and reloaded on change, so that an admin changes
// policy without restarting the webhook.
package config

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kvnet/kvnet/internal/model/addresses"
	"github.com/kvnet/kvnet/internal/model/ippool"
	"github.com/kvnet/kvnet/internal/model/netattach"
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
	// Resources configures the device resources kvnet adds to virt-launcher
	// pods for their Multus networks.
	Resources Resources `json:"resources,omitempty"`
}

// Resources configures network device-resource injection into
// virt-launcher pods (mutators.NetworkResources).
type Resources struct {
	// Inject is "auto" (the default: add a NAD's resource to the compute
	// container where nobody else did) or "never".
	Inject string `json:"inject,omitempty"`
}

// Values of resources.inject.
const (
	InjectAuto  = "auto"
	InjectNever = "never"
)

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
	NAD netattach.Ref `json:"nad"`
	// Binding is auto, bridge, sriov or a binding plugin name; default auto.
	Binding string `json:"binding,omitempty"`
	// DefaultRoute asks for the default route on this attachment (kube-ovn).
	DefaultRoute bool `json:"defaultRoute,omitempty"`
	// PersistentIPs states that this attachment must keep its IP across
	// restarts and migrations: a NAD that does not allow persistent IPs is
	// then an error instead of a silently changing address.
	PersistentIPs bool `json:"persistentIPs,omitempty"`
	// Request asks for fixed IPs, a MAC, CNI args (and kube-ovn's logical
	// switch) on this attachment: the JSON keys ips, mac, cniArgs and
	// logicalSwitch. Only the kvnet.io/networks annotation may set the
	// addresses; a rule matches many VMs, which cannot share them.
	addresses.Request `json:",inline"`
}

// SRIOV lists resource-name prefixes of SR-IOV device plugins.
type SRIOV struct {
	// ResourcePrefixes: a NAD whose k8s.v1.cni.cncf.io/resourceName starts
	// with one is an SR-IOV network (binding auto is sriov); omitted means
	// intel.com/, nvidia.com/, mellanox.com/ and openshift.io/
	// (DefaultSRIOVPrefixes).
	ResourcePrefixes []string `json:"resourcePrefixes,omitempty"`
}

// VDPA lists resource-name prefixes of vDPA device plugins and the KubeVirt
// binding plugin that attaches them.
type VDPA struct {
	// ResourcePrefixes: a NAD whose resourceName starts with one is a vDPA
	// network (binding auto is the vDPA plugin); checked before the SR-IOV
	// prefixes; omitted means jaguarmicro.com/, nvidia.com/vdpa,
	// intel.com/vdpa and mellanox.com/vdpa (DefaultVDPAPrefixes).
	ResourcePrefixes []string `json:"resourcePrefixes,omitempty"`
	// BindingPlugin is the name of the plugin in the KubeVirt CR; default "vdpa".
	BindingPlugin string `json:"bindingPlugin,omitempty"`
}

// KubeOVN configures kube-ovn attachment annotations.
type KubeOVN struct {
	// LegacyLiveMigration sets <provider>.kubernetes.io/allow_live_migration,
	// which kube-ovn up to v1.12 needs to keep the IP during live migration.
	// kube-ovn v1.13 and later detect the migration themselves and ignore
	// it; kvnet warns on every VM that carries it.
	LegacyLiveMigration bool `json:"legacyLiveMigration,omitempty"`
}

// PersistentIPs configures IPAMClaim management.
type PersistentIPs struct {
	// Enabled defaults to true.
	Enabled *bool `json:"enabled,omitempty"`
	// PrimaryUDN extends persistent IPs to the pod network of VMs in
	// namespaces whose primary network is an OVN-Kubernetes user-defined
	// network. Off by default: it writes the launcher pod's
	// v1.multus-cni.io/default-network, which other tools may own.
	PrimaryUDN PrimaryUDN `json:"primaryUDN,omitempty"`
}

// PrimaryUDN configures persistent IPs on primary user-defined networks.
type PrimaryUDN struct {
	// Enabled turns it on (default false); it also needs persistent IPs on.
	Enabled bool `json:"enabled,omitempty"`
	// DefaultNetworkNAD is the NAD, "namespace/name", that OVN-Kubernetes
	// keeps for the cluster default network (its cluster-default-nad,
	// default ovn-kubernetes/default) and that the default-network
	// selection element names. kvnet writes the element only while the
	// NAD exists: Multus fails a pod whose element names a missing NAD.
	DefaultNetworkNAD netattach.Ref `json:"defaultNetworkNAD,omitzero"`
	// LegacyClaimAnnotation writes k8s.ovn.org/primary-udn-ipamclaim on
	// launcher pods (default true). OVN-Kubernetes releases before the
	// claim reference in the default-network element read only it, and it
	// alone carries the claim while DefaultNetworkNAD does not exist.
	// OVN-Kubernetes plans to deprecate it (OKEP-5233: a warning first,
	// then pods carrying it fail); turn it off once the installed release
	// reads the element and the NAD exists.
	LegacyClaimAnnotation *bool `json:"legacyClaimAnnotation,omitempty"`
}

// WriteLegacyClaimAnnotation reports whether kvnet writes
// k8s.ovn.org/primary-udn-ipamclaim on primary-UDN launcher pods.
func (p *PrimaryUDN) WriteLegacyClaimAnnotation() bool {
	return p.LegacyClaimAnnotation == nil || *p.LegacyClaimAnnotation
}

// DefaultNetworkNAD is OVN-Kubernetes' default for its cluster-default-nad.
var DefaultNetworkNAD = netattach.Ref{Namespace: "ovn-kubernetes", Name: "default"}

// Migration gives KubeVirt's migration pods static addresses on Multus
// networks that have no DHCP: virt-handler on the in-cluster network, the
// synchronization controllers (cross-cluster live migration) on a short list.
// Defaults and validation live in migration.go.
type Migration struct {
	// Namespace is KubeVirt's namespace, where its virt-handler and
	// synchronization-controller pods run; empty means the namespace of the
	// KubeVirt CR. Migration addresses go only to pods there (or in a
	// holder's own namespace), so a tenant's look-alike pods take nothing.
	Namespace string `json:"namespace,omitempty"`
	// InCluster gives virt-handler pods their in-cluster migration
	// addresses; omitted, kvnet gives none.
	InCluster *InClusterMigration `json:"inCluster,omitempty"`
	// CrossCluster gives the synchronization controllers (or the migration
	// proxies) their cross-cluster addresses; omitted, kvnet gives none.
	CrossCluster *CrossClusterMigration `json:"crossCluster,omitempty"`
	// ReservationTimeout is how long an address handed out at admission waits
	// for its pod to appear before it is released (default 2m). It must exceed
	// the API server's request timeout (60s by default), or an address could
	// be released while the create that carries it is still in flight.
	ReservationTimeout *metav1.Duration `json:"reservationTimeout,omitempty"`
	// ProxySidecar injects `kvnet proxy` into the synchronization
	// controllers' pods (sidecar mode of the migration proxy), so the
	// cross-cluster network needs one address per synchronization
	// controller and none for a separate proxy.
	ProxySidecar *ProxySidecar `json:"proxySidecar,omitempty"`
}

// ProxySidecar is the migration proxy container the migration-pods webhook
// adds to each pod it selects. The container comes whole from here (the
// chart renders it), so admission builds it without an API call.
type ProxySidecar struct {
	// Enabled turns the injection on; off, pods are admitted without it and
	// the separate proxy Deployment is the one that relays.
	Enabled bool `json:"enabled"`
	// PodSelector picks the pods; default kubevirt.io=virt-synchronization-controller.
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
	// Container is injected as is, plus the ServiceAccount token mount the
	// pod's first container has (the API server's ServiceAccount admission
	// ran before the webhook and mounted it only into the containers it saw).
	Container corev1.Container `json:"container"`
	// Volumes are added with it: its certificate Secret and the peers
	// ConfigMap, which must live in the pods' namespace.
	Volumes []corev1.Volume `json:"volumes,omitempty"`
}

// InClusterMigration gives each virt-handler pod a static address on the
// in-cluster migration network, the same one whenever it returns to a node.
type InClusterMigration struct {
	// NAD is the migration network, "ns/name" (KubeVirt's migrations.network).
	NAD netattach.Ref `json:"nad"`
	// Interface is the pod interface name; default migration0, which virt-handler reads.
	Interface string `json:"interface,omitempty"`
	// Pool is where the addresses come from.
	Pool Pool `json:"pool"`
	// PodSelector picks the pods; default kubevirt.io=virt-handler.
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
	// pool is Pool parsed (Default), for AddressPool.
	pool *ippool.Pool
	// Holders are the identities a selected pod must have as well: its
	// namespace and ServiceAccount. Default: KubeVirt's namespace and
	// virt-handler's ServiceAccount (kubevirt-handler).
	Holders []Holder `json:"holders,omitempty"`
}

// Holder is an identity that may hold migration addresses: pods of one
// ServiceAccount in one namespace. Labels say what a pod claims to be;
// only namespace and ServiceAccount say who made it, since creating a pod
// in KubeVirt's namespace, or as its ServiceAccount, takes rights there.
type Holder struct {
	// Namespace of the pods; empty means KubeVirt's (migration.namespace).
	Namespace string `json:"namespace,omitempty"`
	// ServiceAccount is the pods' spec.serviceAccountName.
	ServiceAccount string `json:"serviceAccount"`
}

// CrossClusterMigration gives the few pods that talk across clusters (the
// synchronization controllers or migration proxies) an address from a short
// explicit list, so a cross-cluster network needs only a handful of addresses.
type CrossClusterMigration struct {
	// NAD is the cross-cluster network, "ns/name".
	NAD netattach.Ref `json:"nad"`
	// Interface is the pod interface name; default crosscluster0.
	Interface string `json:"interface,omitempty"`
	// Addresses are "address/prefix" entries; keep one more than the holder
	// replicas so a rolling update can surge.
	Addresses []string `json:"addresses"`
	// pool is Addresses parsed (Default), for AddressPool.
	pool *ippool.Pool
	// PodSelector picks the holders; default kubevirt.io=virt-synchronization-controller.
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
	// Holders are the identities a selected pod must have as well. Default:
	// KubeVirt's namespace and the synchronization controller's
	// ServiceAccount (kubevirt-synchronization-controller). A separate
	// kvnet proxy Deployment adds its own namespace and ServiceAccount (the
	// chart does).
	Holders []Holder `json:"holders,omitempty"`
	// AlsoInCluster gives the holders an in-cluster address as well.
	AlsoInCluster bool `json:"alsoInCluster,omitempty"`
}

// Pool is a CIDR narrowed by optional ranges (default: the whole CIDR minus
// the network, broadcast or anycast address) and exclusions. Range and
// exclusion entries are an address, a CIDR or "first-last".
type Pool struct {
	// CIDR is the network, "address/prefix".
	CIDR string `json:"cidr"`
	// Ranges narrow it to these entries; omitted, the whole CIDR.
	Ranges []string `json:"ranges,omitempty"`
	// Exclude takes these entries out (gateways, static hosts).
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
	c.Migration = defaultMigration(c.Migration)
	if c.PersistentIPs.PrimaryUDN.DefaultNetworkNAD.IsZero() {
		c.PersistentIPs.PrimaryUDN.DefaultNetworkNAD = DefaultNetworkNAD
	}
	return c
}

// PersistentIPsEnabled reports whether kvnet manages IPAMClaims.
func (c *Config) PersistentIPsEnabled() bool {
	return c.PersistentIPs.Enabled == nil || *c.PersistentIPs.Enabled
}

// PrimaryUDNEnabled reports whether kvnet claims the pod network of VMs on
// primary user-defined networks: persistent IPs on, and the primaryUDN
// switch on.
func (c *Config) PrimaryUDNEnabled() bool {
	return c.PersistentIPsEnabled() && c.PersistentIPs.PrimaryUDN.Enabled
}

// InjectResources reports whether kvnet adds the device resources of a
// launcher pod's Multus networks (resources.inject is not "never").
func (c *Config) InjectResources() bool { return c.Resources.Inject != InjectNever }

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
