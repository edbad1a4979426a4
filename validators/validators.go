// Package validators holds kvnet's VM/VMI validators, one per file. Each
// returns field errors with the paths a user sees in kubectl, in the shape of
// KubeVirt's own virt-api, and adds admission warnings for legal but risky specs.
package validators

import (
	"context"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// multusNetwork is a Multus network with its interface and resolved NAD.
type multusNetwork struct {
	netIndex   int
	net        *kubevirtv1.Network
	ifaceIndex int
	iface      *kubevirtv1.Interface // nil when no interface has the network's name
	nad        *netattach.Info       // nil when the NAD does not exist or the reference is malformed
	badRef     error                 // why networkName is not a NAD reference
}

// multusNetworks resolves every Multus network of the request. A lookup
// failure is kvnet's error, not the user's, and aborts the request.
func multusNetworks(ctx context.Context, req *chain.Request) ([]multusNetwork, error) {
	var out []multusNetwork
	for i := range req.Spec.Networks {
		net := &req.Spec.Networks[i]
		if net.Multus == nil {
			continue
		}
		mn := multusNetwork{netIndex: i, net: net}
		mn.ifaceIndex, mn.iface = req.Interface(net.Name)
		if _, err := netattach.ParseRefIn(net.Multus.NetworkName, req.Namespace); err != nil {
			mn.badRef = err
		} else if mn.nad, err = req.NAD(ctx, net.Multus.NetworkName); err != nil {
			return nil, err
		}
		out = append(out, mn)
	}
	return out, nil
}

// bindingName describes an interface's binding for messages.
func bindingName(iface *kubevirtv1.Interface) string {
	b := iface.InterfaceBindingMethod
	switch {
	case iface.Binding != nil:
		return "binding plugin " + iface.Binding.Name
	case b.Bridge != nil:
		return "bridge"
	case b.Masquerade != nil:
		return "masquerade"
	case b.SRIOV != nil:
		return "sriov"
	case b.PasstBinding != nil:
		return "passtBinding"
	case b.DeprecatedSlirp != nil, b.DeprecatedMacvtap != nil, b.DeprecatedPasst != nil:
		return "a removed binding"
	}
	return "bridge (KubeVirt's default)"
}
