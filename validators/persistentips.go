package validators

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/requested"
	"github.com/kvnet/kvnet/internal/persistentips"
)

// OVNKubernetesCNI is the CNI type of OVN-Kubernetes secondary networks, the
// one IPAM known to honour IPAMClaims.
const OVNKubernetesCNI = "ovn-k8s-cni-overlay"

// PersistentIPs refuses a network that explicitly asks for persistent IPs
// ("persistentIPs": true in a config rule or in the kvnet.io/networks
// annotation) on a NAD that does not allow them: without the check the VM
// runs, and its address changes at the next restart, which is what the user
// said must not happen. It warns where a NAD allows persistent IPs but the
// IP will not persist anyway: the feature is off in kvnet's config, or the
// NAD's CNI is not one that honours IPAMClaims.
type PersistentIPs struct{}

// Name implements chain.VMValidator.
func (PersistentIPs) Name() string { return "persistent-ips" }

type persistentAsk struct {
	net    config.Network
	path   *field.Path // where the request was made, when on the object
	source string
}

// Validate implements chain.VMValidator.
func (v PersistentIPs) Validate(ctx context.Context, req *chain.Request) (field.ErrorList, error) {
	asks, err := v.asks(ctx, req)
	if err != nil {
		return nil, err
	}
	var errs field.ErrorList
	enabled := req.Config.PersistentIPsEnabled()
	for _, a := range asks {
		nadRef := a.net.NAD.String()
		p := a.path
		if i, n := req.Network(a.net.Name); n != nil && n.Multus != nil {
			// The network as it stands in the spec (the user's own wins over the request).
			nadRef = n.Multus.NetworkName
			if p == nil {
				p = req.NetworkPath(i).Child("multus", "networkName")
			}
		}
		if p == nil {
			continue // the network is not in the spec; nothing will run
		}
		info, err := req.NAD(ctx, nadRef)
		if err != nil {
			return nil, err
		}
		if info == nil || info.ConfigError != nil {
			continue // the NADs validator reports it
		}
		if !info.AllowPersistentIPs {
			errs = append(errs, field.Invalid(p, nadRef, fmt.Sprintf(
				"network %s asks for persistent IPs (%s), but NetworkAttachmentDefinition %s does not set \"allowPersistentIPs\": true in its config",
				a.net.Name, a.source, info.Ref())))
		}
	}
	warnedOff := false
	for i := range req.Spec.Networks {
		n := &req.Spec.Networks[i]
		if n.Multus == nil || n.Multus.Default {
			continue
		}
		info, err := req.NAD(ctx, n.Multus.NetworkName)
		if err != nil {
			return nil, err
		}
		if info == nil || info.ConfigError != nil || !info.AllowPersistentIPs {
			continue
		}
		switch {
		case !enabled:
			if !warnedOff {
				req.Warn("persistent IPs are turned off in kvnet's config (persistentIPs.enabled: false): network %s will get a new IP when the VM restarts", n.Name)
				warnedOff = true
			}
		case !honoursClaims(info):
			req.Warn("NetworkAttachmentDefinition %s allows persistent IPs, but its CNI %q is not known to honour IPAMClaims (only %s is): network %s may get a new IP when the VM restarts",
				info.Ref(), info.CNIType, OVNKubernetesCNI, n.Name)
		case info.NetworkName == "":
			req.Warn("NetworkAttachmentDefinition %s allows persistent IPs but its config has no \"name\" to claim: network %s gets no IPAMClaim", info.Ref(), n.Name)
		default:
			warnClaimName(req, n.Name)
		}
	}
	return errs, nil
}

// asks lists the networks the config rules matching this object and its
// kvnet.io/networks annotation ask to keep their IPs. A malformed annotation
// was refused by the networks mutator already and is ignored here.
func (PersistentIPs) asks(ctx context.Context, req *chain.Request) ([]persistentAsk, error) {
	wanted, err := req.WantedNetworks(ctx)
	if apierrors.IsInvalid(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []persistentAsk
	for _, w := range wanted {
		switch {
		case !w.Network.PersistentIPs:
		case w.Rule == requested.Annotation:
			out = append(out, persistentAsk{net: *w.Network, path: requested.AnnotationPath, source: requested.Annotation})
		default:
			out = append(out, persistentAsk{net: *w.Network, source: "config rule " + w.Rule})
		}
	}
	return out, nil
}

// honoursClaims reports whether a NAD's IPAM is known to bind addresses to
// IPAMClaims: OVN-Kubernetes' own IPAM does; host-local, whereabouts, DHCP
// and static do not read ipam-claim-reference.
func honoursClaims(info *netattach.Info) bool {
	return info.CNIType == OVNKubernetesCNI
}

// warnClaimName warns when the claim of network is not named as KubeVirt's
// ipam-extensions names it: the docs promise that a cluster moving between
// the two keeps its IPs, and that holds only for plain lowercase names.
func warnClaimName(req *chain.Request, network string) {
	if persistentips.SameNameAsIPAMExtensions(req.Name, network) {
		return
	}
	req.Warn("network %s keeps its IP in IPAMClaim %q: KubeVirt's ipam-extensions would name that claim differently (it names claims alike only when %q is already lowercase and a valid DNS subdomain of at most 253 characters), so moving this VM between kvnet and ipam-extensions gives it a new IP on %s; a lowercase network name keeps one claim in both",
		network, persistentips.ClaimName(req.Name, network), req.Name+"."+network, network)
}
