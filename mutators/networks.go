package mutators

import (
	"context"
	"slices"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// NetworkInjector adds the Multus networks that config rules and the
// kvnet.io/networks annotation ask for. A network the VM already declares
// (by name, or by attaching the same NAD) is never duplicated or rewritten:
// the user's spec wins.
type NetworkInjector struct{}

// Name implements chain.VMMutator.
func (NetworkInjector) Name() string { return "networks" }

// Mutate implements chain.VMMutator.
func (m NetworkInjector) Mutate(ctx context.Context, req *chain.Request) error {
	wanted, err := req.WantedNetworks(ctx)
	if err != nil || len(wanted) == 0 {
		return err
	}
	// What each added network needs on the heap, made once for all of
	// them: its Multus source, and its name in the record (each entry's
	// list capped at its one name, so a later append to it copies).
	parts := make([]addedParts, len(wanted))
	for i, w := range wanted {
		p := &parts[i]
		added, err := m.ensure(ctx, req, w.Network, len(wanted)-i, &p.multus)
		if err != nil {
			return err
		}
		if added {
			p.name[0] = w.Network.Name
			req.Record(m.Name(), w.Rule, p.name[:]...)
		}
	}
	return nil
}

// addedParts are one added network's parts that live on the heap.
type addedParts struct {
	multus kubevirtv1.MultusNetwork
	name   [1]string
}

// ensure adds one network and its interface unless the VM has it already.
// more is how many wanted networks are left, this one included: the first
// append makes room for all of them, since an Interface is large and
// growing the lists one append at a time would copy them at every doubling.
func (NetworkInjector) ensure(ctx context.Context, req *chain.Request, n *config.Network, more int, multus *kubevirtv1.MultusNetwork) (added bool, err error) {
	ref := n.NAD.In(req.Namespace)
	if i, existing := req.Network(n.Name); i >= 0 {
		if n.DefaultRoute && existing.Multus != nil && sameNAD(req, existing.Multus.NetworkName, ref) {
			markDefaultRoute(req, n.Name)
		}
		return false, nil
	}
	for _, existing := range req.Spec.Networks {
		if existing.Multus != nil && sameNAD(req, existing.Multus.NetworkName, ref) {
			if n.DefaultRoute {
				markDefaultRoute(req, existing.Name)
			}
			return false, nil
		}
	}
	nad := n.NAD.String()
	*multus = kubevirtv1.MultusNetwork{NetworkName: nad}
	iface := kubevirtv1.Interface{Name: n.Name}
	if err := setBinding(ctx, req, &iface, n.Binding, nad); err != nil {
		return false, err
	}
	if err := keepPodNetwork(ctx, req, more); err != nil {
		return false, err
	}
	req.Spec.Networks = append(slices.Grow(req.Spec.Networks, more), kubevirtv1.Network{
		Name:          n.Name,
		NetworkSource: kubevirtv1.NetworkSource{Multus: multus},
	})
	if i, _ := req.Interface(n.Name); i < 0 {
		req.Spec.Domain.Devices.Interfaces = append(slices.Grow(req.Spec.Domain.Devices.Interfaces, more), iface)
	}
	if n.DefaultRoute {
		markDefaultRoute(req, n.Name)
	}
	return true, nil
}

// keepPodNetwork writes out the pod network KubeVirt attaches by itself to a
// VMI that declares no network and no interface (autoattachPodInterface):
// once kvnet adds a network, KubeVirt would no longer attach it, and the VM
// would silently lose its cluster network. The binding is the KubeVirt CR's
// defaultNetworkInterface, bridge when unset or not visible, as in KubeVirt.
// The lists get room for the more networks about to be added after it.
func keepPodNetwork(ctx context.Context, req *chain.Request, more int) error {
	s := req.Spec
	if len(s.Networks) > 0 || len(s.Domain.Devices.Interfaces) > 0 {
		return nil
	}
	if a := s.Domain.Devices.AutoattachPodInterface; a != nil && !*a {
		return nil
	}
	kv, err := req.Facts.KubeVirt(ctx)
	if err != nil {
		return err
	}
	iface := kubevirtv1.DefaultBridgeNetworkInterface()
	if kv != nil && kv.Spec.Configuration.NetworkConfiguration != nil &&
		kv.Spec.Configuration.NetworkConfiguration.NetworkInterface == string(kubevirtv1.MasqueradeInterface) {
		iface = kubevirtv1.DefaultMasqueradeNetworkInterface()
	}
	s.Networks = append(slices.Grow(s.Networks, 1+more), *kubevirtv1.DefaultPodNetwork())
	s.Domain.Devices.Interfaces = append(slices.Grow(s.Domain.Devices.Interfaces, 1+more), *iface)
	req.Record(NetworkInjector{}.Name(), "", iface.Name)
	return nil
}

func markDefaultRoute(req *chain.Request, network string) {
	req.MarkDefaultRoute(network)
}

// sameNAD reports whether a VM network's networkName names the NAD ref.
func sameNAD(req *chain.Request, networkName string, ref netattach.Ref) bool {
	r, err := netattach.ParseRefIn(networkName, req.Namespace)
	return err == nil && r == ref
}

// setBinding resolves binding "auto" from the NAD: SR-IOV resources bind as
// sriov, vDPA resources through the vDPA plugin, the rest as bridge. A NAD
// that does not exist yet gets bridge; the validator then reports it missing.
func setBinding(ctx context.Context, req *chain.Request, iface *kubevirtv1.Interface, binding, nad string) error {
	if binding == config.BindingAuto || binding == "" {
		info, err := req.NAD(ctx, nad)
		if err != nil {
			return err
		}
		binding = config.BindingBridge
		if info != nil {
			switch req.Classify(info) {
			case netattach.KindSRIOV:
				binding = config.BindingSRIOV
			case netattach.KindVDPA:
				binding = req.Config.VDPA.BindingPlugin
			}
		}
	}
	switch binding {
	case config.BindingBridge:
		iface.Bridge = &kubevirtv1.InterfaceBridge{}
	case config.BindingSRIOV:
		iface.SRIOV = &kubevirtv1.InterfaceSRIOV{}
	default:
		iface.Binding = &kubevirtv1.PluginBinding{Name: binding}
	}
	return nil
}
