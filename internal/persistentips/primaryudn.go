package persistentips

import (
	"context"
	"fmt"
	"strings"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// PrimaryUDNInterface is the pod interface OVN-Kubernetes gives a pod's
// primary user-defined network (eth0 stays on the cluster default network,
// for probes only). A primary-UDN claim records it as spec.interface.
const PrimaryUDNInterface = "ovn-udn1"

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

// PrimaryNetwork is the namespace's primary user-defined network, from
// facts. It is nil with no reason when the namespace has none, and nil with
// a reason when it has several: OVN-Kubernetes allows one, and kvnet will
// not guess which one the pods get.
func PrimaryNetwork(ctx context.Context, facts lookup.Facts, namespace string) (*netattach.Info, string, error) {
	nads, err := facts.PrimaryNetworks(ctx, namespace)
	switch {
	case err != nil:
		return nil, "", err
	case len(nads) == 0:
		return nil, "", nil
	case len(nads) > 1:
		refs := make([]string, len(nads))
		for i, n := range nads {
			refs[i] = n.Ref()
		}
		return nil, fmt.Sprintf("namespace %s has %d primary user-defined networks (%s); OVN-Kubernetes allows one", namespace, len(nads), strings.Join(refs, ", ")), nil
	}
	return nads[0], "", nil
}

// PrimaryClaimable reports whether a primary user-defined network keeps its
// pods' IPs in IPAMClaims, and why not: what OVN-Kubernetes requires is
// layer2 topology and allowPersistentIPs, and the claim needs the config's
// "name" as its spec.network.
func PrimaryClaimable(info *netattach.Info) (bool, string) {
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

// DesiredPrimary is the claim for the pod network of owner o when the
// namespace's primary network is a user-defined network that keeps IPs and
// cfg turns primary-UDN persistent IPs on. The claim is named like a
// secondary network's, after the pod network ("<vm>.default"), as KubeVirt's
// ipam-extensions names it, so a cluster moving from one to the other keeps
// the same claim and IP.
func DesiredPrimary(ctx context.Context, cfg *config.Config, o Owner, spec *kubevirtv1.VirtualMachineInstanceSpec, facts lookup.Facts) (*WantedClaim, *Skipped, error) {
	if !cfg.PrimaryUDNEnabled() || cfg.Excluded(o.Namespace) {
		return nil, nil, nil
	}
	pod := PodNetwork(spec)
	if pod == nil {
		return nil, nil, nil
	}
	info, why, err := PrimaryNetwork(ctx, facts, o.Namespace)
	if err != nil || info == nil {
		if why != "" {
			return nil, &Skipped{Network: pod.Name, Reason: why}, nil
		}
		return nil, nil, err
	}
	if ok, why := PrimaryClaimable(info); !ok {
		return nil, &Skipped{Network: pod.Name, Reason: why}, nil
	}
	c := NewClaim(o, pod.Name, info.NetworkName)
	c.Spec.Interface = PrimaryUDNInterface
	return &WantedClaim{Network: pod.Name, NAD: info, Claim: c}, nil, nil
}
