package validators

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/lookup"
)

// MACsHeld refuses a new VirtualMachine an interface MAC another
// VirtualMachine already holds, in a namespace where kubemacpool gives
// VMs their MACs. kubemacpool (v0.51) no longer refuses a MAC asked for
// twice: it records both and reports the collision once both VMs run, by
// which time their guests share the MAC on the wire. So kvnet refuses it
// at admission, naming the MAC and the VM that holds it, whichever set it:
// the owner by hand, kubemacpool from its pool, kvnet from
// kvnet.io/networks, or a cross-cluster migration that brought the VM's
// network identity (its IPAMClaim's kvnet.io/mac, which kubemacpool never
// saw: it is on the claim and the launcher pod, not the VM).
//
// Only CREATE is checked: an existing duplicate must not block updates of
// either VM (virt-controller's among them), and a MAC the owner changes
// on UPDATE is the owner's to keep unique. The holders come from the
// informer cache: two VMs created with one MAC within the cache's lag of
// each other both pass.
type MACsHeld struct{}

// Name implements chain.VMValidator.
func (MACsHeld) Name() string { return "macs-held" }

// Validate implements chain.VMValidator.
func (MACsHeld) Validate(ctx context.Context, req *chain.Request) (field.ErrorList, error) {
	if req.Operation != admissionv1.Create || req.Kind != chain.KindVM {
		return nil, nil
	}
	ifaces := req.Spec.Domain.Devices.Interfaces
	asked := false
	for _, iface := range ifaces {
		asked = asked || iface.MacAddress != ""
	}
	if !asked {
		return nil, nil
	}
	pool, err := req.Facts.MACPool(ctx, req.Namespace)
	if err != nil || pool.Webhook == "" {
		return nil, err
	}
	var errs field.ErrorList
	for i, iface := range ifaces {
		if iface.MacAddress == "" {
			continue
		}
		holders, err := req.Facts.MACHolders(ctx, iface.MacAddress)
		if err != nil {
			return nil, err
		}
		for _, h := range holders {
			if h.Namespace == req.Namespace && h.Name == req.Name {
				continue // the VM itself, seen again (a create retried after a conflict)
			}
			errs = append(errs, field.Duplicate(req.InterfacePath(i).Child("macAddress"), held(iface.MacAddress, h)))
			break
		}
	}
	return errs, nil
}

func held(mac string, h lookup.MACHolder) string {
	by := fmt.Sprintf("VirtualMachine %s/%s (interface %s)", h.Namespace, h.Name, h.Interface)
	if h.Claim != "" {
		by = fmt.Sprintf("VirtualMachine %s/%s, which received it in a cross-cluster migration (IPAMClaim %s)", h.Namespace, h.Name, h.Claim)
	}
	return fmt.Sprintf("MAC %s is held by %s; kubemacpool, registered for this namespace, does not refuse a MAC twice, so kvnet does: ask for another MAC or none", mac, by)
}
