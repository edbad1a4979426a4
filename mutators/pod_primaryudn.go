package mutators

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/persistentips"
)

// Annotations of the primary-UDN path.
const (
	// DefaultNetworkAnnotation is Multus' choice of a pod's default network:
	// one selection element. OVN-Kubernetes reads the primary user-defined
	// network's claim reference, MAC and IPs from it.
	DefaultNetworkAnnotation = multus.DefaultNetworkAnnotation
	// LegacyPrimaryUDNClaimAnnotation names the primary network's IPAMClaim
	// for OVN-Kubernetes releases that predate the claim reference in the
	// default-network element; newer ones still read it, second to the element.
	LegacyPrimaryUDNClaimAnnotation = "k8s.ovn.org/primary-udn-ipamclaim"
	// VMIAddressesAnnotation is the IPs a VM asks for per interface,
	// {"<interface>": ["10.0.0.5", ...]}, as KubeVirt's ipam-extensions and
	// migration tools write it on the VM template (KubeVirt copies it to the
	// VMI).
	VMIAddressesAnnotation = "network.kubevirt.io/addresses"
)

// PrimaryUDN keeps the pod-network IP of VMs whose namespace's primary
// network is an OVN-Kubernetes user-defined network (persistentIPs.primaryUDN).
// The pod network is not in k8s.v1.cni.cncf.io/networks, so its claim goes
// into the launcher pod's v1.multus-cni.io/default-network element, with the
// MAC of the VM's pod interface and the IPs of network.kubevirt.io/addresses,
// and, for older OVN-Kubernetes, into k8s.ovn.org/primary-udn-ipamclaim
// (unless persistentIPs.primaryUDN.legacyClaimAnnotation is false).
//
// The element names the cluster default network's NAD (config
// defaultNetworkNAD), and Multus fails a pod whose element names a NAD that
// does not exist; OVN-Kubernetes creates that NAD only with preconfigured
// UDN addresses on. So the element is written only while the NAD is in the
// cache; without it the legacy annotation alone carries the claim, and a MAC
// or IPs the VM asks for are dropped with a warning.
//
// A default-network annotation already on the pod (from the VM template, or
// another webhook) is completed when it is the same element with none of
// kvnet's keys set to something else; otherwise the pod is refused (403)
// naming the annotation: overwriting it would change the pod's network
// behind its author's back, and leaving it would lose the VM's IP. The same
// holds for the legacy annotation. On UPDATE an annotation the request does
// not change is left alone: the pod's network is fixed at creation.
type PrimaryUDN VMIReader

// Name implements chain.PodMutator.
func (PrimaryUDN) Name() string { return "primary-udn" }

// MutatePod implements chain.PodMutator.
func (m PrimaryUDN) MutatePod(ctx context.Context, req *chain.PodRequest) error {
	pod := req.Pod
	if !req.Config.PrimaryUDNEnabled() || pod.Annotations[chain.SkipAnnotation] == "true" {
		return nil
	}
	vmiName := pod.Annotations[kubevirtv1.DomainAnnotation]
	if vmiName == "" {
		return nil
	}
	log := logf.FromContext(ctx)
	// The namespace's NADs first: most namespaces have no primary network,
	// and then the VMI is not read at all.
	info, why, err := persistentips.PrimaryNetwork(ctx, req.Facts, req.Namespace)
	if err != nil {
		return err
	}
	if info == nil {
		if why != "" {
			req.Warn("the pod network's IP is not kept: %s", why)
		}
		return nil
	}
	if ok, why := persistentips.PrimaryClaimable(info); !ok {
		log.V(1).Info("no primary-UDN IPAMClaim", "reason", why)
		return nil
	}
	vmi, _, err := VMIReader(m).vmi(ctx, req.Namespace, vmiName, false)
	if err != nil || vmi == nil {
		return err
	}
	podNet := persistentips.PodNetwork(&vmi.Spec)
	if podNet == nil {
		return nil
	}
	owner := persistentips.OwnerOf(vmi)
	claim := persistentips.ClaimName(owner.Name, podNet.Name)
	var c ipamv1alpha1.IPAMClaim
	switch err := m.Cache.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: claim}, &c); {
	case apierrors.IsNotFound(err):
		// Not created yet: the controller creates it and OVN-Kubernetes waits.
	case err != nil:
		return fmt.Errorf("reading IPAMClaim %s/%s: %w", req.Namespace, claim, err)
	case !owner.Owns(&c):
		req.Warn("IPAMClaim %s is controlled by another object; the pod network of %s gets no persistent IP", claim, vmi.Name)
		return nil
	}

	want := DefaultElement{Claim: claim}
	if iface := persistentips.PodInterface(&vmi.Spec, podNet.Name); iface != nil {
		want.MAC = iface.MacAddress
	}
	if raw, ok := vmi.Annotations[VMIAddressesAnnotation]; ok {
		ips, err := PrimaryIPs(raw, podNet.Name, info)
		if err == nil && c.Name != "" {
			err = ClaimHolds(&c, ips)
		}
		if err != nil {
			req.Warn("%s on VMI %s is not applied to the pod network: %v", VMIAddressesAnnotation, vmi.Name, err)
			ips = nil
		}
		want.IPs = ips
	}
	if want.Namespace, want.NAD, err = config.SplitNAD(req.Config.PersistentIPs.PrimaryUDN.DefaultNetworkNAD, ""); err != nil {
		return fmt.Errorf("persistentIPs.primaryUDN.defaultNetworkNAD: %w", err)
	}

	if err := m.legacy(req, claim); err != nil {
		return err
	}
	cur, present := pod.Annotations[DefaultNetworkAnnotation]
	if present && unchangedOnUpdate(req, DefaultNetworkAnnotation) {
		return nil
	}
	if !present {
		nad, err := req.Facts.NAD(ctx, want.Namespace, want.NAD)
		if err != nil {
			return err
		}
		if nad == nil {
			if !req.Config.PersistentIPs.PrimaryUDN.WriteLegacyClaimAnnotation() {
				req.Warn("the pod network's IP of %s is not kept: NetworkAttachmentDefinition %s/%s, which %s must name, does not exist (OVN-Kubernetes creates it with preconfigured UDN addresses enabled), and persistentIPs.primaryUDN.legacyClaimAnnotation is off, so nothing carries IPAMClaim %s", vmi.Name, want.Namespace, want.NAD, DefaultNetworkAnnotation, claim)
				return nil
			}
			if want.MAC != "" || len(want.IPs) > 0 {
				req.Warn("the MAC and IPs asked for on %s's pod network are not applied: NetworkAttachmentDefinition %s/%s, which %s must name, does not exist (OVN-Kubernetes creates it with preconfigured UDN addresses enabled); the IP is kept through %s", vmi.Name, want.Namespace, want.NAD, DefaultNetworkAnnotation, LegacyPrimaryUDNClaimAnnotation)
			}
			log.V(1).Info("default-network NAD not found; the primary-UDN claim goes through the legacy annotation only", "nad", want.Namespace+"/"+want.NAD)
			return nil
		}
	}
	out, changed, conflict := CompleteDefaultElement(cur, present, req.Namespace, want)
	if conflict != "" {
		return chain.RefuseForbidden(fmt.Sprintf("kvnet keeps the IP of %s on primary network %s through the pod's %s, but the pod already carries %s=%q: %s. Remove that annotation from the VM (template) or set it to what kvnet writes",
			vmi.Name, info.Ref(), DefaultNetworkAnnotation, DefaultNetworkAnnotation, cur, conflict))
	}
	if changed {
		pod.Annotations[DefaultNetworkAnnotation] = out
		log.V(1).Info("primary-UDN IPAMClaim referenced", "claim", claim, "network", info.Ref(), "vmi", vmi.Name)
	}
	return nil
}

// legacy sets k8s.ovn.org/primary-udn-ipamclaim unless the config turns it
// off (persistentIPs.primaryUDN.legacyClaimAnnotation: OVN-Kubernetes plans
// to deprecate it), and refuses the pod when it already names another claim
// either way (OVN-Kubernetes releases that read only it would bind the IP
// to that claim, and current ones fall back to it).
func (PrimaryUDN) legacy(req *chain.PodRequest, claim string) error {
	cur, ok := req.Pod.Annotations[LegacyPrimaryUDNClaimAnnotation]
	switch {
	case !ok && !req.Config.PersistentIPs.PrimaryUDN.WriteLegacyClaimAnnotation():
	case !ok:
		req.Pod.Annotations[LegacyPrimaryUDNClaimAnnotation] = claim
	case cur == claim, unchangedOnUpdate(req, LegacyPrimaryUDNClaimAnnotation):
	default:
		return chain.RefuseForbidden(fmt.Sprintf("the pod carries %s=%q, but kvnet keeps the pod network's IP in IPAMClaim %q; remove the annotation from the VM (template)",
			LegacyPrimaryUDNClaimAnnotation, cur, claim))
	}
	return nil
}

// unchangedOnUpdate reports whether an UPDATE leaves annotation key as the
// stored pod has it.
func unchangedOnUpdate(req *chain.PodRequest, key string) bool {
	if req.Operation != admissionv1.Update || req.OldPod == nil {
		return false
	}
	old, ok := req.OldPod.Annotations[key]
	return ok && old == req.Pod.Annotations[key]
}

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
