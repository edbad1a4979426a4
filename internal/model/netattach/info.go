// Package netattach reads what kvnet needs to know from a
// NetworkAttachmentDefinition: which device plugin backs it, which CNI runs
// it, and what its config allows. It is parsed once per NAD version and then
// shared by every admission request.
package netattach

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ResourceNameAnnotation names the device-plugin resource a NAD consumes.
const ResourceNameAnnotation = "k8s.v1.cni.cncf.io/resourceName"

// NodeSelectorAnnotation is the one node label, "key=value" or "key", that
// pods attaching the NAD must be scheduled by (network-resources-injector's
// convention: the network exists only on nodes with that label).
const NodeSelectorAnnotation = "k8s.v1.cni.cncf.io/nodeSelector"

// Kind is what kind of device a NAD attaches, which decides the interface binding.
type Kind string

const (
	KindBridge Kind = "bridge"
	KindSRIOV  Kind = "sriov"
	KindVDPA   Kind = "vdpa"
)

// Info is the part of a NAD kvnet's mutators and validators read.
type Info struct {
	Namespace string
	Name      string
	// ResourceVersion lets caches tell a stale parse from a fresh one.
	ResourceVersion string
	// ResourceName is the k8s.v1.cni.cncf.io/resourceName annotation.
	ResourceName string
	// CNIType is the config's "type", or the first plugin's in a conflist.
	CNIType string
	// NetworkName is the config's "name": what IPAMClaims reference.
	NetworkName string
	// Provider is kube-ovn's "provider" field, when set.
	Provider string
	// AllowPersistentIPs is OVN-Kubernetes' allowPersistentIPs flag.
	AllowPersistentIPs bool
	// IPAMType is the config's ipam.type, when set.
	IPAMType string
	// Role is "primary" for primary user-defined networks.
	Role string
	// Topology is OVN-Kubernetes' "topology": layer2, layer3 or localnet.
	Topology string
	// Subnets are the subnets the config says it assigns from: OVN-K's
	// "subnets", or the IPAM's "subnet", "range" or "ranges". Empty when
	// the config does not say (kube-ovn keeps them in its Subnet objects).
	Subnets []netip.Prefix
	// ConfigError is set when spec.config does not parse; the other config
	// fields are then empty.
	ConfigError error
	// NodeSelector is the node label of the k8s.v1.cni.cncf.io/nodeSelector
	// annotation, nil without one. NodeSelectorError says why an annotation
	// that is there could not be read (NodeSelector is then nil).
	NodeSelector      *NodeLabel
	NodeSelectorError error
}

// NodeLabel is one node label a pod must select.
type NodeLabel struct{ Key, Value string }

// parseNodeSelector reads the nodeSelector annotation as
// network-resources-injector does: "key=value", or "key" for an empty
// value, spaces around either trimmed, one label only. It also checks that
// the label is one a pod's nodeSelector may carry, so a bad annotation is
// reported against the NAD rather than as the pod's invalid spec.
func parseNodeSelector(s string) (*NodeLabel, error) {
	parts := strings.Split(s, "=")
	if len(parts) > 2 {
		return nil, fmt.Errorf("annotation %s %q holds more than one label; it takes one key=value", NodeSelectorAnnotation, s)
	}
	l := &NodeLabel{Key: strings.TrimSpace(parts[0])}
	if len(parts) == 2 {
		l.Value = strings.TrimSpace(parts[1])
	}
	if msgs := validation.IsQualifiedName(l.Key); len(msgs) > 0 {
		return nil, fmt.Errorf("annotation %s %q: key %q: %s", NodeSelectorAnnotation, s, l.Key, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsValidLabelValue(l.Value); len(msgs) > 0 {
		return nil, fmt.Errorf("annotation %s %q: value %q: %s", NodeSelectorAnnotation, s, l.Value, strings.Join(msgs, "; "))
	}
	return l, nil
}

// Ref is "namespace/name".
func (i *Info) Ref() string { return i.Namespace + "/" + i.Name }

// Classify tells SR-IOV and vDPA NADs from the rest by resource-name prefix.
// vDPA prefixes are checked first: vendors publish both from one domain.
func (i *Info) Classify(sriovPrefixes, vdpaPrefixes []string) Kind {
	if i.ResourceName == "" {
		return KindBridge
	}
	if hasPrefix(i.ResourceName, vdpaPrefixes) {
		return KindVDPA
	}
	if hasPrefix(i.ResourceName, sriovPrefixes) {
		return KindSRIOV
	}
	return KindBridge
}

// CNITypeOVNKubernetes is the CNI type of OVN-Kubernetes attachments.
const CNITypeOVNKubernetes = "ovn-k8s-cni-overlay"

// RolePrimary marks a NAD as its namespace's primary user-defined network.
const RolePrimary = "primary"

// IsPrimaryUDN reports whether the NAD is an OVN-Kubernetes primary
// user-defined network: the network of its namespace's pods' default
// interface, in place of the cluster default network.
func (i *Info) IsPrimaryUDN() bool {
	return i.ConfigError == nil && i.CNIType == CNITypeOVNKubernetes && i.Role == RolePrimary
}

// IsKubeOVN reports whether kube-ovn runs this attachment.
func (i *Info) IsKubeOVN() bool { return i.CNIType == "kube-ovn" }

// KubeOVNProvider is the provider name kube-ovn keys its pod annotations by.
func (i *Info) KubeOVNProvider() string {
	if i.Provider != "" {
		return i.Provider
	}
	return i.Name + "." + i.Namespace + ".ovn"
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if p != "" && strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// cniConfig is the subset of a CNI config or conflist kvnet reads.
type cniConfig struct {
	Name               string      `json:"name"`
	Type               string      `json:"type"`
	Provider           string      `json:"provider"`
	AllowPersistentIPs bool        `json:"allowPersistentIPs"`
	Role               string      `json:"role"`
	Topology           string      `json:"topology"`
	Subnets            string      `json:"subnets"`
	IPAM               *ipamConfig `json:"ipam"`
	Plugins            []cniConfig `json:"plugins"`
}

type ipamConfig struct {
	Type   string `json:"type"`
	Subnet string `json:"subnet"` // host-local, static
	Range  string `json:"range"`  // whereabouts
	Ranges [][]struct {
		Subnet string `json:"subnet"`
	} `json:"ranges"` // host-local
}

// subnets collects what a config says it assigns from. OVN-K layer3
// entries carry a host-subnet length ("10.128.0.0/14/23"); the cluster
// subnet is what an IP must be in. Entries that do not parse are skipped:
// the subnet check is a help, and the CNI is the authority.
func (c *cniConfig) subnets() []netip.Prefix {
	raw := strings.Split(c.Subnets, ",")
	if c.IPAM != nil {
		raw = append(raw, c.IPAM.Subnet, c.IPAM.Range)
		for _, set := range c.IPAM.Ranges {
			for _, r := range set {
				raw = append(raw, r.Subnet)
			}
		}
	}
	var out []netip.Prefix
	for _, s := range raw {
		s = strings.TrimSpace(s)
		if parts := strings.Split(s, "/"); len(parts) == 3 {
			s = parts[0] + "/" + parts[1]
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// Parse extracts Info from a NAD. It never fails: an unparsable config is
// recorded in ConfigError so the validator can point at the network using it.
func Parse(nad *nadv1.NetworkAttachmentDefinition) *Info {
	info := &Info{
		Namespace:       nad.Namespace,
		Name:            nad.Name,
		ResourceVersion: nad.ResourceVersion,
		ResourceName:    nad.Annotations[ResourceNameAnnotation],
	}
	if sel, ok := nad.Annotations[NodeSelectorAnnotation]; ok {
		info.NodeSelector, info.NodeSelectorError = parseNodeSelector(sel)
	}
	if strings.TrimSpace(nad.Spec.Config) == "" {
		// A NAD without config delegates to a CNI config file on the node.
		return info
	}
	var c cniConfig
	if err := json.Unmarshal([]byte(nad.Spec.Config), &c); err != nil {
		info.ConfigError = fmt.Errorf("spec.config is not valid JSON: %w", err)
		return info
	}
	info.NetworkName = c.Name
	info.CNIType = c.Type
	info.Provider = c.Provider
	info.AllowPersistentIPs = c.AllowPersistentIPs
	info.Role = c.Role
	info.Topology = c.Topology
	info.Subnets = c.subnets()
	if c.IPAM != nil {
		info.IPAMType = c.IPAM.Type
	}
	if len(c.Plugins) > 0 {
		p := c.Plugins[0]
		info.CNIType = p.Type
		if info.Provider == "" {
			info.Provider = p.Provider
		}
		info.AllowPersistentIPs = info.AllowPersistentIPs || p.AllowPersistentIPs
		if info.Role == "" {
			info.Role = p.Role
		}
		if info.Topology == "" {
			info.Topology = p.Topology
		}
		if p.IPAM != nil && info.IPAMType == "" {
			info.IPAMType = p.IPAM.Type
		}
		if len(info.Subnets) == 0 {
			info.Subnets = p.subnets()
		}
	}
	return info
}
