package validators

import (
	"context"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/chain"
)

// Topology checks that networks and interfaces pair up by name, once each.
// KubeVirt checks this too, but only when the VMI is created; for a VM the
// mistake would surface at start, long after the edit that caused it.
type Topology struct{}

// Name implements chain.VMValidator.
func (Topology) Name() string { return "topology" }

// Validate implements chain.VMValidator.
func (Topology) Validate(_ context.Context, req *chain.Request) (field.ErrorList, error) {
	var errs field.ErrorList
	nets := map[string]bool{}
	for i, n := range req.Spec.Networks {
		p := req.NetworkPath(i)
		if nets[n.Name] {
			errs = append(errs, field.Duplicate(p.Child("name"), n.Name))
			continue
		}
		nets[n.Name] = true
		if j, _ := req.Interface(n.Name); j < 0 {
			errs = append(errs, field.Required(req.SpecPath.Child("domain", "devices", "interfaces"),
				"network "+n.Name+" ("+p.String()+") has no interface of the same name"))
		}
	}
	ifaces := map[string]bool{}
	for i, iface := range req.Spec.Domain.Devices.Interfaces {
		p := req.InterfacePath(i)
		if ifaces[iface.Name] {
			errs = append(errs, field.Duplicate(p.Child("name"), iface.Name))
			continue
		}
		ifaces[iface.Name] = true
		if !nets[iface.Name] {
			errs = append(errs, field.Invalid(p.Child("name"), iface.Name, "no network of spec.networks has this name"))
		}
	}
	return errs, nil
}
