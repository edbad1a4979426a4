package primaryudn

import (
	"fmt"
	"strings"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/model/netattach"
)

// Interface is the pod interface OVN-Kubernetes gives a pod's primary
// user-defined network (eth0 stays on the cluster default network, for
// probes only). A primary-UDN claim records it as spec.interface.
const Interface = "ovn-udn1"

// TopologyLayer2 is the only OVN-Kubernetes topology whose primary networks
// keep IPs in IPAMClaims: OVN-Kubernetes ignores a claim on a layer3
// primary network, whose pods take addresses from per-node subnets.
const TopologyLayer2 = "layer2"

// PodNetwork returns the VMI network that is the pod network: the one with
// "pod: {}", or, when spec declares no network at all, the "default" pod
// network KubeVirt attaches by itself (unless autoattachPodInterface is
// false). It is nil when the VM has no pod network, e.g. a Multus default
// network in its place.
func PodNetwork(spec *kubevirtv1.VirtualMachineInstanceSpec) *kubevirtv1.Network {
	for i := range spec.Networks {
		if spec.Networks[i].Pod != nil {
			return &spec.Networks[i]
		}
	}
	if len(spec.Networks) == 0 {
		if a := spec.Domain.Devices.AutoattachPodInterface; a == nil || *a {
			return kubevirtv1.DefaultPodNetwork()
		}
	}
	return nil
}

// PodInterface returns the interface of the pod network, or nil (KubeVirt's
// implicit pod interface, which has no MAC of the user's).
func PodInterface(spec *kubevirtv1.VirtualMachineInstanceSpec, podNetwork string) *kubevirtv1.Interface {
	for i := range spec.Domain.Devices.Interfaces {
		if spec.Domain.Devices.Interfaces[i].Name == podNetwork {
			return &spec.Domain.Devices.Interfaces[i]
		}
	}
	return nil
}

// Primary picks the namespace's primary user-defined network from its
// primary NADs (lookup.Facts.PrimaryNetworks). It is nil with no reason
// when the namespace has none, and nil with a reason when it has several:
// OVN-Kubernetes allows one, and kvnet will not guess which one the pods
// get.
func Primary(namespace string, nads []*netattach.Info) (*netattach.Info, string) {
	switch len(nads) {
	case 0:
		return nil, ""
	case 1:
		return nads[0], ""
	}
	refs := make([]string, len(nads))
	for i, n := range nads {
		refs[i] = n.Ref()
	}
	return nil, fmt.Sprintf("namespace %s has %d primary user-defined networks (%s); OVN-Kubernetes allows one", namespace, len(nads), strings.Join(refs, ", "))
}

// Claimable reports whether a primary user-defined network keeps its
// pods' IPs in IPAMClaims, and why not: what OVN-Kubernetes requires is
// layer2 topology and allowPersistentIPs, and the claim needs the config's
// "name" as its spec.network.
func Claimable(info *netattach.Info) (bool, string) {
	switch {
	case !info.IsPrimaryUDN():
		return false, fmt.Sprintf("NetworkAttachmentDefinition %s is not an OVN-Kubernetes primary network", info.Ref())
	case info.Topology != TopologyLayer2:
		return false, fmt.Sprintf("primary network %s has topology %q; OVN-Kubernetes keeps persistent IPs on layer2 primary networks only", info.Ref(), info.Topology)
	case !info.AllowPersistentIPs:
		return false, fmt.Sprintf("primary network %s does not set \"allowPersistentIPs\": true", info.Ref())
	case info.NetworkName == "":
		return false, fmt.Sprintf("primary network %s has no \"name\" for the claim's spec.network", info.Ref())
	}
	return true, ""
}

// Element is the default-network element the pod network podNet of a VM
// (spec, and its template or VMI annotations) needs on primary network
// info: the cluster default network's NAD, the claim, the pod interface's
// MAC and the IPs network.kubevirt.io/addresses asks for. When that
// annotation does not parse or asks for what OVN-Kubernetes would refuse,
// the element carries no IPs and askErr says why, for the caller to warn
// (the pod) or refuse (the VM).
func Element(spec *kubevirtv1.VirtualMachineInstanceSpec, annotations map[string]string, podNet, claim string, info *netattach.Info, defaultNAD netattach.Ref) (e DefaultElement, askErr error) {
	e = DefaultElement{Namespace: defaultNAD.Namespace, NAD: defaultNAD.Name, Claim: claim}
	if iface := PodInterface(spec, podNet); iface != nil {
		e.MAC = iface.MacAddress
	}
	if raw, ok := annotations[AddressesAnnotation]; ok {
		e.IPs, askErr = PrimaryIPs(raw, podNet, info)
	}
	return e, askErr
}
