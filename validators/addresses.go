package validators

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/addresses"
	"github.com/kvnet/kvnet/internal/model/kubeovn"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/requested"
)

// AddressesCheck checks per-network address requests, from the kvnet.io/networks
// annotation and from the template's kvnet.io/addresses (what reaches the
// launcher pod): the network is a Multus network of the VM; each IP is
// inside the NAD's subnet when the NAD config names one; no IP or MAC is
// asked for twice; kube-ovn attachments take ips and mac only through
// kvnet.io/networks (kvnet writes kube-ovn's own annotations), and
// logicalSwitch only there.
//
// Fixed ips on an OVN-Kubernetes secondary network that assigns addresses
// itself (layer3, or layer2/localnet with "subnets") are refused: OVN-K's
// cluster manager fails such a pod at CNI ADD ("cannot allocate a static IP
// request with IPAM"), so the VM would be admitted and never start. The
// cause names the field that asked and says what to use instead.
//
// Fixed ips and an IPAMClaim on one network: asked for together in
// kvnet.io/networks ("persistentIPs": true), the request is refused (config
// validation). On any other NAD that allows persistent IPs, where the claim
// is implicit, the fixed ips win with a warning: the address is already
// fixed by the VM's own spec, and Multus refuses an element carrying both.
type AddressesCheck struct{}

// Name implements chain.VMValidator.
func (AddressesCheck) Name() string { return "address-requests" }

type addressAsk struct {
	network string
	r       addresses.Request
	path    *field.Path
	fromTbl bool // from the template's kvnet.io/addresses
}

// Validate implements chain.VMValidator.
func (v AddressesCheck) Validate(ctx context.Context, req *chain.Request) (field.ErrorList, error) {
	asks, errs, err := collectAsks(req)
	if err != nil || len(asks) == 0 {
		return errs, err
	}
	var taken addresses.Taken
	for _, iface := range req.Spec.Domain.Devices.Interfaces {
		if iface.MacAddress != "" {
			taken.TakeMAC(iface.MacAddress, iface.Name)
		}
	}
	refused := map[string]bool{} // networks already refused for OVN-K IPAM, one cause each
	for _, a := range asks {
		_, net := req.Network(a.network)
		if net == nil || net.Multus == nil {
			errs = append(errs, field.Invalid(a.path, a.network, fmt.Sprintf("network %s asks for addresses but is not a Multus network of this VM", a.network)))
			continue
		}
		info, err := req.NAD(ctx, net.Multus.NetworkName)
		if err != nil {
			return nil, err
		}
		for _, c := range taken.Take(a.network, a.r) {
			verb := "ask for it"
			if c.Kind == "MAC" {
				verb = "use it"
			}
			errs = append(errs, field.Duplicate(a.path, fmt.Sprintf("%s %s: networks %s and %s both %s", c.Kind, c.Addr, c.Holder, a.network, verb)))
		}
		if info == nil || info.ConfigError != nil {
			continue // the NADs validator reports it
		}
		errs = append(errs, checkOnNAD(req, a, info, refused)...)
	}
	return errs, nil
}

// collectAsks reads the address requests of kvnet.io/networks (only the
// annotation: config rules cannot carry addresses) and of the template's
// kvnet.io/addresses. A kvnet.io/networks that does not parse is refused
// as the mutator and the other validators refuse it (err); a table that
// does not parse is a field error.
func collectAsks(req *chain.Request) ([]addressAsk, field.ErrorList, error) {
	netsValue, hasNets := req.Meta.Annotations[requested.Annotation]
	hasNets = hasNets && addresses.MayRequest(netsValue)
	tblValue, hasTbl := req.TemplateMeta.Annotations[addresses.Annotation]
	var asks []addressAsk
	var errs field.ErrorList
	if hasNets {
		nets, perrs := requested.Parse(netsValue, requested.AnnotationPath)
		if len(perrs) > 0 {
			return nil, nil, req.Invalid(perrs)
		}
		for _, n := range nets {
			if !n.Request.Empty() {
				asks = append(asks, addressAsk{network: n.Name, r: n.Request, path: requested.AnnotationPath})
			}
		}
	}
	if hasTbl {
		tp := req.TemplateMetaPath.Child("annotations").Key(addresses.Annotation)
		tbl, err := addresses.Parse(tblValue)
		if err != nil {
			return nil, field.ErrorList{field.Invalid(tp, tblValue, err.Error())}, nil
		}
		for _, name := range slices.Sorted(maps.Keys(tbl)) {
			p := tp.Key(name)
			errs = append(errs, tbl[name].Validate(p)...)
			asks = append(asks, addressAsk{network: name, r: tbl[name], path: p, fromTbl: true})
		}
	}
	return asks, errs, nil
}

// checkOnNAD checks one request against the NAD its network attaches:
// what kube-ovn and OVN-Kubernetes take, and the NAD's subnets. refused
// keeps OVN-Kubernetes' refusal to one cause per network.
func checkOnNAD(req *chain.Request, a addressAsk, info *netattach.Info, refused map[string]bool) field.ErrorList {
	var errs field.ErrorList
	kubeOVN := info.IsKubeOVN()
	switch {
	case kubeOVN && a.fromTbl && (len(a.r.IPs) > 0 || a.r.MAC != "" || a.r.LogicalSwitch != ""):
		errs = append(errs, field.Invalid(a.path, a.network, fmt.Sprintf(
			"network %s is a kube-ovn attachment: kube-ovn reads %s%s and %s%s, not the Multus element; ask in kvnet.io/networks and kvnet writes them",
			a.network, info.KubeOVNProvider(), kubeovn.IPAddress, info.KubeOVNProvider(), kubeovn.MACAddress)))
	case !kubeOVN && a.r.LogicalSwitch != "":
		errs = append(errs, field.Invalid(a.path, a.r.LogicalSwitch, fmt.Sprintf("network %s: logicalSwitch is kube-ovn's; NetworkAttachmentDefinition %s is not a kube-ovn attachment", a.network, info.Ref())))
	case kubeOVN && !a.fromTbl && attachCount(req, info.Namespace, info.Name) > 1:
		// kube-ovn keys a NAD attached twice by provider and interface;
		// kvnet writes only the plain provider keys, which would then
		// pin both attachments to one address.
		errs = append(errs, field.Invalid(a.path, a.network, fmt.Sprintf("network %s: kvnet sets kube-ovn addresses only for a NetworkAttachmentDefinition attached once; %s is attached more than once", a.network, info.Ref())))
	}
	if len(a.r.IPs) > 0 && ovnKubernetesAssigns(info) {
		if !refused[a.network] {
			refused[a.network] = true
			errs = append(errs, field.Invalid(a.path, a.network, ovnKubernetesStaticIPs(a.network, info)))
		}
		return errs
	}
	if len(info.Subnets) > 0 {
		for _, ip := range a.r.Prefixes() {
			if !inAny(ip.Addr(), info.Subnets, ip.Addr().Is4()) {
				errs = append(errs, field.Invalid(a.path, ip.String(), fmt.Sprintf("network %s: IP %s is outside the subnets of NetworkAttachmentDefinition %s (%s)", a.network, ip.Addr(), info.Ref(), prefixList(info.Subnets))))
			}
		}
	}
	if len(a.r.IPs) > 0 && info.AllowPersistentIPs && req.Config.PersistentIPsEnabled() && !kubeOVN {
		req.Warn("network %s: the fixed ips take the place of its IPAMClaim (Multus refuses both on one attachment); the VM's spec keeps the address", a.network)
	}
	return errs
}

// ovnKubernetesAssigns reports whether info is an OVN-Kubernetes secondary
// network with IPAM, the case where OVN-K refuses a static IP request.
// OVN-K's rule (util.DoesNetworkRequireIPAM): every network has IPAM but a
// layer2 or localnet one without subnets. Its cluster manager allocates
// secondary-network pods with reallocation off, so a requested IP there is
// a static request, and allocatePodAnnotationWithRollback fails it when the
// network has IPAM. Primary networks have a path of their own
// (validators.PrimaryUDNCheck); a config without a known topology is left to
// OVN-K, which refuses the NAD itself.
func ovnKubernetesAssigns(info *netattach.Info) bool {
	if info.CNIType != netattach.CNITypeOVNKubernetes || info.Role == netattach.RolePrimary {
		return false
	}
	switch info.Topology {
	case "layer3":
		return true
	case "layer2", "localnet":
		return len(info.Subnets) > 0
	}
	return false
}

// ovnKubernetesStaticIPs says why fixed ips on network are refused, what
// OVN-Kubernetes would do, and what works instead.
func ovnKubernetesStaticIPs(network string, info *netattach.Info) string {
	how := "topology layer3"
	if info.Topology != "layer3" {
		how = fmt.Sprintf("topology %s with subnets %s", info.Topology, prefixList(info.Subnets))
	}
	instead := "set \"allowPersistentIPs\": true on the NAD and drop ips: kvnet's IPAMClaim then keeps the address OVN-Kubernetes assigns across restarts and migrations"
	if info.AllowPersistentIPs {
		instead = "drop ips: the NAD allows persistent IPs, so kvnet's IPAMClaim keeps the address OVN-Kubernetes assigns across restarts and migrations"
	}
	return fmt.Sprintf("network %s asks for fixed ips, but NetworkAttachmentDefinition %s is an OVN-Kubernetes secondary network that assigns addresses itself (%s): "+
		"OVN-Kubernetes fails the virt-launcher pod at CNI ADD with \"cannot allocate a static IP request with IPAM\", so the VM would never start. "+
		"Either %s, or attach a NAD without subnets (layer2 or localnet), where OVN-Kubernetes takes the addresses you give",
		network, info.Ref(), how, instead)
}

func inAny(a netip.Addr, subnets []netip.Prefix, v4 bool) bool {
	sameFamily := false
	for _, s := range subnets {
		if s.Addr().Is4() != v4 {
			continue
		}
		sameFamily = true
		if s.Contains(a) {
			return true
		}
	}
	return !sameFamily // the NAD says nothing about this family
}

func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

// attachCount counts the VM's networks that attach the NAD ns/name.
func attachCount(req *chain.Request, ns, name string) int {
	n := 0
	for _, net := range req.Spec.Networks {
		if net.Multus == nil {
			continue
		}
		if r, err := netattach.ParseRefIn(net.Multus.NetworkName, req.Namespace); err == nil && r.Namespace == ns && r.Name == name {
			n++
		}
	}
	return n
}
