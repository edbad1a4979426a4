package validators

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// Binding checks that each interface's binding can drive the device its NAD
// provides: an SR-IOV VF cannot be bridged, a bridge NAD has no VF to pass
// through, and masquerade only exists on the pod network.
type Binding struct{}

// Name implements chain.VMValidator.
func (Binding) Name() string { return "binding" }

// Validate implements chain.VMValidator.
func (Binding) Validate(ctx context.Context, req *chain.Request) (field.ErrorList, error) {
	nets, err := multusNetworks(ctx, req)
	if err != nil {
		return nil, err
	}
	var errs field.ErrorList
	for _, mn := range nets {
		if mn.iface == nil {
			continue // Topology reports it
		}
		p := req.InterfacePath(mn.ifaceIndex)
		b := mn.iface.InterfaceBindingMethod
		if b.Masquerade != nil {
			errs = append(errs, field.Invalid(p.Child("masquerade"), "{}", "masquerade works only on the pod network; network "+mn.net.Name+" is a Multus network"))
			continue
		}
		if mn.nad == nil {
			continue // NADs reports it
		}
		kind := req.Classify(mn.nad)
		switch {
		case b.SRIOV != nil && kind != netattach.KindSRIOV:
			errs = append(errs, field.Invalid(p.Child("sriov"), "{}", fmt.Sprintf(
				"NetworkAttachmentDefinition %s is not an SR-IOV network (resource %q matches none of sriov.resourcePrefixes)", mn.nad.Ref(), mn.nad.ResourceName)))
		case kind == netattach.KindSRIOV && b.SRIOV == nil:
			errs = append(errs, field.Invalid(p, mn.iface.Name, fmt.Sprintf(
				"NetworkAttachmentDefinition %s is an SR-IOV network (resource %s); use sriov: {} instead of %s", mn.nad.Ref(), mn.nad.ResourceName, bindingName(mn.iface))))
		case kind == netattach.KindVDPA && mn.iface.Binding == nil:
			errs = append(errs, field.Invalid(p, mn.iface.Name, fmt.Sprintf(
				"NetworkAttachmentDefinition %s is a vDPA network (resource %s); use binding: {name: %s} instead of %s",
				mn.nad.Ref(), mn.nad.ResourceName, req.Config.VDPA.BindingPlugin, bindingName(mn.iface))))
		}
	}
	return errs, nil
}
