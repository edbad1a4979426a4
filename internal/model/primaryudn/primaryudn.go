// Package primaryudn holds every decision about a VM on an OVN-Kubernetes
// primary user-defined network: which network is the namespace's primary
// one and whether it keeps IPs, which VMI network is the pod network, and
// what the launcher pod must carry for its pod-network IP to survive (the
// claim, MAC and IPs in Multus' default-network element, built by Element)
// and what OVN-Kubernetes checks of them before it wires the pod. The pod
// step writes them, the VM validator refuses early what the pod would be
// failed for, and the claim controller keeps the claim they reference.
package primaryudn

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"

	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

const (
	// LegacyClaimAnnotation names the primary network's IPAMClaim for
	// OVN-Kubernetes releases that predate the claim reference in the
	// default-network element; newer ones still read it, second to the element.
	LegacyClaimAnnotation = "k8s.ovn.org/primary-udn-ipamclaim"
	// AddressesAnnotation is the IPs a VM asks for per interface,
	// {"<interface>": ["10.0.0.5", ...]}, as KubeVirt's ipam-extensions and
	// migration tools write it on the VM template (KubeVirt copies it to the
	// VMI).
	AddressesAnnotation = "network.kubevirt.io/addresses"
)

// DefaultElement is what kvnet wants in the default-network element: the
// NAD it names, and the IPs, MAC and claim the pod network needs.
type DefaultElement struct {
	Namespace, NAD string
	IPs            []string
	MAC            string
	Claim          string
}

// CompleteDefaultElement returns the default-network annotation that carries
// want: a new element when none is present, else the present one with
// kvnet's keys added. It reports a conflict, and changes nothing, when the
// present value is not one element for want's NAD or sets one of kvnet's
// keys to another value. Keys kvnet does not set are kept as they are.
func CompleteDefaultElement(cur string, present bool, podNamespace string, want DefaultElement) (out string, changed bool, conflict string) {
	var e *multus.Element
	if present {
		elems, err := multus.ParseDefaultNetwork(cur)
		switch {
		case err != nil:
			return "", false, fmt.Sprintf("it does not parse: %v", err)
		case len(elems) != 1:
			return "", false, fmt.Sprintf("it selects %d networks, and a pod has one default network", len(elems))
		case !elems[0].Refers(podNamespace, want.Namespace, want.NAD):
			return "", false, fmt.Sprintf("it selects %s/%s, not the cluster default network %s/%s", orNS(elems[0].Namespace(), podNamespace), elems[0].Name(), want.Namespace, want.NAD)
		}
		e = elems[0]
	} else {
		e = multus.NewElement(want.Namespace, want.NAD)
	}
	if len(want.IPs) > 0 {
		if e.Has(multus.KeyIPs) {
			var ips []string
			if json.Unmarshal(e.Raw(multus.KeyIPs), &ips) != nil || !slices.Equal(ips, want.IPs) {
				return "", false, fmt.Sprintf("its %q is %s, the VM asks for %q", multus.KeyIPs, e.Raw(multus.KeyIPs), want.IPs)
			}
		} else {
			if err := e.Set(multus.KeyIPs, want.IPs); err != nil {
				return "", false, err.Error()
			}
			changed = true
		}
	}
	for _, kv := range [][2]string{{multus.KeyMAC, want.MAC}, {multus.KeyIPAMClaimReference, want.Claim}} {
		key, v := kv[0], kv[1]
		switch {
		case v == "":
		case !e.Has(key):
			e.SetString(key, v)
			changed = true
		case e.String(key) != v:
			return "", false, fmt.Sprintf("its %q is %s, kvnet needs %q", key, e.Raw(key), v)
		}
	}
	if !changed && present {
		return cur, false, ""
	}
	out, err := multus.Format([]*multus.Element{e})
	if err != nil {
		return "", false, err.Error()
	}
	return out, true, ""
}

func orNS(ns, def string) string {
	if ns == "" {
		return def
	}
	return ns
}

// PrimaryIPs reads the pod network's IPs from network.kubevirt.io/addresses
// ({"<interface>": ["10.0.0.5", "fd00::5"]}) and gives each the prefix
// length of the primary network's subnet of its family, as OVN-Kubernetes
// wants them in the element. An entry already in CIDR notation keeps its
// prefix. An IP outside every subnet of its family is an error: OVN-Kubernetes
// would refuse the pod.
func PrimaryIPs(raw, iface string, info *netattach.Info) ([]string, error) {
	var table map[string][]string
	if err := json.Unmarshal([]byte(raw), &table); err != nil {
		return nil, fmt.Errorf(`want {"<interface>": ["<ip>", ...]}: %w`, err)
	}
	var out []string
	for _, s := range table[iface] {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("%q is neither an IP nor a CIDR", s)
			}
			p = netip.PrefixFrom(a, -1)
		}
		var subnet netip.Prefix
		for _, sn := range info.Subnets {
			if sn.Addr().Is4() == p.Addr().Is4() && sn.Contains(p.Addr()) {
				subnet = sn
				break
			}
		}
		switch {
		case !subnet.IsValid() && len(info.Subnets) > 0:
			return nil, fmt.Errorf("%s is in no subnet of primary network %s (%v)", p.Addr(), info.Ref(), info.Subnets)
		case !subnet.IsValid() && p.Bits() < 0:
			return nil, fmt.Errorf("%s has no prefix length and primary network %s names no subnet to take it from", s, info.Ref())
		case p.Bits() < 0:
			p = netip.PrefixFrom(p.Addr(), subnet.Bits())
		}
		out = append(out, p.String())
	}
	if err := oneIPPerFamily(out, info); err != nil {
		return nil, err
	}
	return out, nil
}

// ClaimHolds checks what OVN-Kubernetes checks when a pod on a primary
// network asks for IPs and references a claim that already holds some
// (validateStaticIPRequest): every requested IP is one of the claim's
// status.ips. A claim without IPs yet takes the requested ones.
func ClaimHolds(c *ipamv1alpha1.IPAMClaim, ips []string) error {
	if len(c.Status.IPs) == 0 {
		return nil
	}
	held := map[netip.Prefix]bool{}
	for _, s := range c.Status.IPs {
		if p, err := netip.ParsePrefix(s); err == nil {
			held[p] = true
		}
	}
	for _, s := range ips {
		if p, err := netip.ParsePrefix(s); err != nil || !held[p] {
			return fmt.Errorf("asks for %s, but IPAMClaim %s already holds %v, and OVN-Kubernetes fails a pod whose requested IPs are not its claim's; ask for the claim's IPs or none (the claim keeps them until the VM is deleted)", s, c.Name, c.Status.IPs)
		}
	}
	return nil
}

// oneIPPerFamily checks what OVN-Kubernetes checks before it takes static
// IPs on a layer2 primary network (validateIPFamilyMatchesNetwork): as many
// IPs as the network has subnets, of the same families, so one IPv4 and one
// IPv6 on a dual-stack network. Fewer, more or another family, and it fails
// the pod. A network whose NAD names no subnet is not checked.
func oneIPPerFamily(ips []string, info *netattach.Info) error {
	if len(ips) == 0 || len(info.Subnets) == 0 {
		return nil
	}
	var want, got [2]int // IPv4, IPv6
	for _, sn := range info.Subnets {
		want[family(sn.Addr())]++
	}
	for _, s := range ips {
		got[family(netip.MustParsePrefix(s).Addr())]++
	}
	if want == got {
		return nil
	}
	return fmt.Errorf("asks for %d IPv4 and %d IPv6 address(es); primary network %s (%v) takes exactly %d IPv4 and %d IPv6, one per subnet, or OVN-Kubernetes fails the pod",
		got[0], got[1], info.Ref(), info.Subnets, want[0], want[1])
}

func family(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}
